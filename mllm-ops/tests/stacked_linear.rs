//! Stacked linear layers (`OpDesc::StackedLinear`): one op over several
//! layers' weights gives, column for column, the bits of each layer run on
//! its own, whether the weights could be packed into one matrix or run
//! one after another (mixed types, row counts the packed layouts do not
//! take, kernels that do not repack); and it refuses stacks it cannot run.
//! Gated linear ops (`OpDesc::GatedLinear`) likewise give the bits of
//! their gate and up layers run alone and the gated activation after them.

mod common;

use std::borrow::Cow;
use std::sync::Arc;

use mllm_core::file::{MllmFile, MllmWriter, TensorSpec};
use mllm_core::op::{Activation, GatedLinearParams, LinearParams, Op, OpDesc};
use mllm_core::{Backend, DType, Error};
use mllm_ops::cpu::kernels::activation::glu;
use mllm_ops::cpu::kernels::{QuantPath, SimdLevel};
use mllm_ops::cpu::ops::LinearOp;
use mllm_ops::cpu::CpuBackend;
use mllm_ops::quant::quantize;

use common::{run_linear, values, TempFile};

/// Input width of every layer (whole blocks of every type).
const IN: usize = 256;

/// Every weight type a stack can hold, and its rows in the packed layouts
/// (multiples of eight) and in rows they do not take.
const TYPES: [DType; 10] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::F16,
    DType::F32,
];

/// The row counts of the three layers of each stack.
const ROWS: [usize; 3] = [24, 8, 16];

fn name(dtype: DType, layer: usize) -> String {
    format!("{}.{layer}", dtype.name())
}

/// Types of the wider gate and up layers: [`WIDE_GATED_ROWS`] rows, 65
/// groups of eight, take several tasks and spans of groups per call.
const WIDE_GATED: [DType; 4] = [DType::Q4_1, DType::Q8_0, DType::Q4K, DType::Q6K];
/// Rows of each wider gate and up layer.
const WIDE_GATED_ROWS: usize = 520;

/// Writes three layers of each type (rows [`ROWS`]) and an up layer with
/// the first one's rows, two layers of 12 rows of Q4_0, the wider gate and
/// up layers ([`WIDE_GATED`]) and a BF16 layer, with a bias for each.
fn write_file() -> TempFile {
    let mut tensors: Vec<(TensorSpec, Vec<u8>)> = Vec::new();
    let mut seed = 0;
    let mut add = |tensors: &mut Vec<_>, n: String, dtype: DType, rows: usize| {
        seed += 1;
        let vals = values(seed, rows * IN);
        let bytes = match dtype {
            DType::F32 => bytemuck::cast_slice(&vals).to_vec(),
            DType::F16 => vals
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
            DType::BF16 => vals
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
            q => quantize(q, &vals).unwrap(),
        };
        tensors.push((
            TensorSpec::new(format!("{n}.weight"), dtype, [rows, IN]),
            bytes,
        ));
        let bias = bytemuck::cast_slice(&values(seed + 1000, rows)).to_vec();
        tensors.push((
            TensorSpec::new(format!("{n}.bias"), DType::F32, [rows]),
            bias,
        ));
    };
    for dtype in TYPES {
        for (layer, rows) in ROWS.into_iter().enumerate() {
            add(&mut tensors, name(dtype, layer), dtype, rows);
        }
        add(&mut tensors, up_name(dtype), dtype, ROWS[0]);
    }
    add(&mut tensors, "rows12".into(), DType::Q4_0, 12);
    add(&mut tensors, "rows12.up".into(), DType::Q4_0, 12);
    for dtype in WIDE_GATED {
        for part in ["gate", "up"] {
            let n = format!("{}.wide_{part}", dtype.name());
            add(&mut tensors, n, dtype, WIDE_GATED_ROWS);
        }
    }
    add(&mut tensors, "bf16".into(), DType::BF16, 16);
    let mut writer = MllmWriter::new();
    for (spec, _) in &tensors {
        writer.add_tensor(spec.clone()).unwrap();
    }
    let tmp = TempFile::new("stacked.mllm");
    writer
        .write(tmp.path(), |i, _| Ok(Cow::Borrowed(&tensors[i].1[..])))
        .unwrap();
    tmp
}

/// The up layer that goes with layer 0 of `dtype` in a gated op.
fn up_name(dtype: DType) -> String {
    format!("{}.up", dtype.name())
}

fn layer(n: &str, rows: usize, bias: bool) -> LinearParams {
    LinearParams {
        in_features: IN,
        out_features: rows,
        weight: format!("{n}.weight"),
        bias: bias.then(|| format!("{n}.bias")),
    }
}

/// A pool of two threads for one op.
fn two_threads() -> Arc<rayon::ThreadPool> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build();
    Arc::new(pool.unwrap())
}

/// A linear op over `layers` at SIMD level `level` or below, on two
/// threads.
fn linear(layers: &[LinearParams], level: SimdLevel) -> LinearOp {
    LinearOp::stacked(layers.to_vec(), two_threads()).with_max_simd(level)
}

/// The stack of `layers` equals each layer alone, bit for bit, for 1, 3
/// and 9 activation rows, at SIMD level `level` or below; returns whether
/// the stack became one matrix.
fn check_stack(file: &MllmFile, layers: &[LinearParams], level: SimdLevel) -> bool {
    let total: usize = layers.iter().map(|p| p.out_features).sum();
    let mut stacked = linear(layers, level);
    stacked.load(file).unwrap();
    stacked.loaded();
    let mut alone: Vec<LinearOp> = layers
        .iter()
        .map(|p| {
            let mut op = linear(std::slice::from_ref(p), level);
            op.load(file).unwrap();
            op
        })
        .collect();
    for rows in [1, 3, 9, 40, 300] {
        let x = values(rows as u64 + 77, rows * IN);
        let y = run_linear(&mut stacked, &x, rows, IN, total);
        let mut start = 0;
        for (p, one) in layers.iter().zip(&mut alone) {
            let want = run_linear(one, &x, rows, IN, p.out_features);
            for r in 0..rows {
                let got = &y[r * total + start..][..p.out_features];
                let want = &want[r * p.out_features..][..p.out_features];
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{} in a stack of {} at {level:?}, row {r} of {rows}",
                    p.weight,
                    layers.len()
                );
            }
            start += p.out_features;
        }
    }
    stacked.is_one_matrix()
}

/// The levels this CPU runs, fastest first.
fn levels() -> Vec<SimdLevel> {
    SimdLevel::FASTEST_FIRST
        .into_iter()
        .filter(|l| l.is_available(QuantPath::Int16Activations))
        .collect()
}

#[test]
fn stacks_of_one_type_equal_their_layers_and_pack_into_one_matrix() {
    let tmp = write_file();
    let file = MllmFile::open(tmp.path()).unwrap();
    for level in levels() {
        for dtype in TYPES {
            for bias in [false, true] {
                let layers: Vec<LinearParams> = (0..3)
                    .map(|l| layer(&name(dtype, l), ROWS[l], bias))
                    .collect();
                let one = check_stack(&file, &layers, level);
                let packs = linear(&layers, level).repacks(dtype);
                assert_eq!(one, packs, "{dtype} at {level:?}");
                let two = check_stack(&file, &layers[1..], level);
                assert_eq!(two, packs, "{dtype} at {level:?}, two layers");
            }
        }
    }
}

#[test]
fn stacks_that_cannot_be_one_matrix_run_layer_by_layer() {
    let tmp = write_file();
    let file = MllmFile::open(tmp.path()).unwrap();
    let stacks = [
        // Two block types.
        vec![layer("q4_k.0", 24, true), layer("q6_k.1", 8, true)],
        // 24 + 12 rows: not whole groups of eight.
        vec![layer("q4_0.0", 24, false), layer("rows12", 12, false)],
        // f16 and bf16.
        vec![layer("f16.2", 16, false), layer("bf16", 16, false)],
        // f32 is not repacked.
        vec![layer("f32.0", 24, false), layer("f32.1", 8, false)],
    ];
    for level in levels() {
        for layers in &stacks {
            assert!(!check_stack(&file, layers, level), "{:?}", layers[0].weight);
        }
    }
}

#[test]
fn bad_stacks_are_named_errors() {
    let tmp = write_file();
    let file = MllmFile::open(tmp.path()).unwrap();
    let level = SimdLevel::FASTEST_FIRST[0];
    let mixed = [layer("q8_0.0", 24, true), layer("q8_0.1", 8, false)];
    let err = linear(&mixed, level).load(&file).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(m) if m.contains("'q8_0.0.weight'") && m.contains("a bias or none")),
        "{err:?}"
    );
    let mut narrow = layer("q8_0.1", 8, false);
    narrow.in_features = 128;
    let widths = [layer("q8_0.0", 24, false), narrow];
    let err = linear(&widths, level).load(&file).unwrap_err();
    assert!(err.to_string().contains("q8_0.1.weight"), "{err}");
    assert!(err.to_string().contains("256 inputs, it has 128"), "{err}");
    let missing = [layer("q8_0.0", 24, false), layer("nothing", 8, false)];
    let err = linear(&missing, level).load(&file).unwrap_err();
    assert!(err.to_string().contains("nothing.weight"), "{err}");
}

#[test]
fn the_backend_makes_stacked_ops_and_stacks_the_types_it_repacks() {
    let tmp = write_file();
    let file = MllmFile::open(tmp.path()).unwrap();
    let layers: Vec<LinearParams> = (0..3)
        .map(|l| layer(&name(DType::Q4K, l), ROWS[l], true))
        .collect();
    for level in levels() {
        let backend = CpuBackend::new(2).unwrap().with_max_simd(level);
        let mut op = backend
            .create_op(&OpDesc::StackedLinear(layers.clone()))
            .unwrap();
        op.load(&file).unwrap();
        let x = values(5, 2 * IN);
        let mut direct = linear(&layers, level);
        direct.load(&file).unwrap();
        let (a, b) = (
            run_linear(op.as_mut(), &x, 2, IN, 48),
            run_linear(&mut direct, &x, 2, IN, 48),
        );
        assert_eq!(a, b, "{level:?}");
        let repacks = level.includes_avx2();
        for dtype in [
            DType::Q4_0,
            DType::Q8_0,
            DType::Q4K,
            DType::Q6K,
            DType::F16,
            DType::BF16,
        ] {
            assert_eq!(
                backend.stacks_linears(dtype),
                repacks,
                "{dtype} at {level:?}"
            );
        }
        for dtype in [
            DType::F32,
            DType::Q2K,
            DType::Q3K,
            DType::IQ4NL,
            DType::Q4Packed,
        ] {
            assert!(!backend.stacks_linears(dtype), "{dtype} at {level:?}");
        }
    }
}

/// Every gated activation.
const ACTS: [Activation; 4] = [
    Activation::Silu,
    Activation::GeluTanh,
    Activation::Gelu,
    Activation::Relu,
];

/// A gated op over `gate` and `up` with `act`, at SIMD level `level` or
/// below, on two threads.
fn gated(gate: &LinearParams, up: &LinearParams, act: Activation, level: SimdLevel) -> LinearOp {
    LinearOp::gated(gate.clone(), up.clone(), act, two_threads()).with_max_simd(level)
}

/// The gated op over `gate` and `up` equals `act(gate) · up` of the layers
/// run alone, bit for bit, for 1 to 300 activation rows, at SIMD level
/// `level` or below; returns whether its weights became one matrix.
fn check_gated(
    file: &MllmFile,
    [gate, up]: [&LinearParams; 2],
    act: Activation,
    level: SimdLevel,
) -> bool {
    let out = gate.out_features;
    let mut op = gated(gate, up, act, level);
    op.load(file).unwrap();
    op.loaded();
    let mut alone = [gate, up].map(|p| {
        let mut op = linear(std::slice::from_ref(p), level);
        op.load(file).unwrap();
        op
    });
    for rows in [1, 3, 9, 40, 300] {
        let x = values(rows as u64 + 91, rows * IN);
        let got = run_linear(&mut op, &x, rows, IN, out);
        let [g, u] = alone
            .each_mut()
            .map(|one| run_linear(one, &x, rows, IN, out));
        let mut want = vec![0.0f32; rows * out];
        glu(act, &g, &u, &mut want);
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&got),
            bits(&want),
            "{} and {} with {act:?} at {level:?}, {rows} rows",
            gate.weight,
            up.weight
        );
    }
    op.is_one_matrix()
}

#[test]
fn gated_ops_equal_their_layers_and_pack_the_integer_types_into_one_matrix() {
    let tmp = write_file();
    let file = MllmFile::open(tmp.path()).unwrap();
    for level in levels() {
        for dtype in TYPES {
            let gate = layer(&name(dtype, 0), ROWS[0], false);
            let up = layer(&up_name(dtype), ROWS[0], false);
            let integer = !matches!(dtype, DType::F16 | DType::F32);
            let packs = integer && linear(&[], level).repacks(dtype);
            for act in ACTS {
                let one = check_gated(&file, [&gate, &up], act, level);
                assert_eq!(one, packs, "{dtype} with {act:?} at {level:?}");
            }
        }
        for dtype in WIDE_GATED {
            let [gate, up] = ["gate", "up"].map(|part| {
                let n = format!("{}.wide_{part}", dtype.name());
                layer(&n, WIDE_GATED_ROWS, false)
            });
            let one = check_gated(&file, [&gate, &up], Activation::Silu, level);
            assert_eq!(
                one,
                linear(&[], level).repacks(dtype),
                "{dtype} at {level:?}"
            );
        }
        // Rows that are not whole groups run layer by layer.
        let (gate, up) = (layer("rows12", 12, false), layer("rows12.up", 12, false));
        assert!(!check_gated(&file, [&gate, &up], Activation::Silu, level));
    }
}

#[test]
fn bad_gated_ops_are_named_errors() {
    let tmp = write_file();
    let file = MllmFile::open(tmp.path()).unwrap();
    let level = SimdLevel::FASTEST_FIRST[0];
    let act = Activation::Silu;
    let (gate, narrow) = (layer("q8_0.0", 24, false), layer("q8_0.1", 8, false));
    let err = gated(&gate, &narrow, act, level).load(&file).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("'q8_0.0.weight' + 'q8_0.1.weight'")
            && message.contains("gate has 24 outputs, up 8"),
        "{message}"
    );
    let with_bias = layer(&up_name(DType::Q8_0), 24, true);
    let err = gated(&gate, &with_bias, act, level)
        .load(&file)
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(m) if m.contains("'q8_0.up.weight'") && m.contains("bias")),
        "{err:?}"
    );
    let missing = layer("nothing", 24, false);
    let err = gated(&gate, &missing, act, level).load(&file).unwrap_err();
    assert!(err.to_string().contains("nothing.weight"), "{err}");
}

#[test]
fn the_backend_makes_gated_ops_and_fuses_the_integer_types_it_repacks() {
    let tmp = write_file();
    let file = MllmFile::open(tmp.path()).unwrap();
    let params = GatedLinearParams {
        gate: layer(&name(DType::Q4K, 0), ROWS[0], false),
        up: layer(&up_name(DType::Q4K), ROWS[0], false),
        act: Activation::Silu,
    };
    for level in levels() {
        let backend = CpuBackend::new(2).unwrap().with_max_simd(level);
        let mut op = backend
            .create_op(&OpDesc::GatedLinear(params.clone()))
            .unwrap();
        op.load(&file).unwrap();
        let x = values(6, 2 * IN);
        let mut direct = gated(&params.gate, &params.up, params.act, level);
        direct.load(&file).unwrap();
        let (a, b) = (
            run_linear(op.as_mut(), &x, 2, IN, ROWS[0]),
            run_linear(&mut direct, &x, 2, IN, ROWS[0]),
        );
        assert_eq!(a, b, "{level:?}");
        let repacks = level.includes_avx2();
        for dtype in [
            DType::Q4_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::Q4K,
            DType::Q6K,
        ] {
            assert_eq!(
                backend.fuses_gated_linears(dtype),
                repacks,
                "{dtype} at {level:?}"
            );
        }
        for dtype in [
            DType::F16,
            DType::BF16,
            DType::F32,
            DType::Q3K,
            DType::Q4Packed,
        ] {
            assert!(!backend.fuses_gated_linears(dtype), "{dtype} at {level:?}");
        }
    }
}
