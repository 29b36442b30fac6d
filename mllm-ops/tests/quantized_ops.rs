//! Quantized weights end to end: a `.mllm` file written with `MllmWriter`
//! holding block-quantized tensors, opened (memory-mapped) as the weight
//! source of the CPU linear and embedding ops, against dequantize + f64.

mod common;

use std::borrow::Cow;
use std::sync::Arc;

use mllm_core::file::{MllmFile, MllmWriter, TensorSpec};
use mllm_core::op::{EmbeddingParams, LinearParams, Op, OpDesc, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::{Backend, DType, Error};
use mllm_ops::cpu::kernels::QuantPath;
use mllm_ops::cpu::ops::LinearOp;
use mllm_ops::cpu::CpuBackend;

use common::{run_linear, values, TempFile};
use mllm_ops::quant::{dequantize, quantize};

const OUT: usize = 40;

/// The quantized linear weights: (name, dtype, in_features).
const LINEAR: [(&str, DType, usize); 7] = [
    ("w.q8_0", DType::Q8_0, 96),
    ("w.q4_0", DType::Q4_0, 64),
    ("w.q4_1", DType::Q4_1, 160),
    ("w.q5_0", DType::Q5_0, 96),
    ("w.q4_k", DType::Q4K, 512),
    ("w.q5_k", DType::Q5K, 256),
    ("w.q6_k", DType::Q6K, 256),
];

/// Writes every test tensor and returns the file and the tensors' bytes.
fn write_file(tag: &str) -> (TempFile, Vec<(TensorSpec, Vec<u8>)>) {
    let mut tensors = Vec::new();
    for (i, &(name, dtype, in_f)) in LINEAR.iter().enumerate() {
        let w = quantize(dtype, &values(i as u64, OUT * in_f)).unwrap();
        tensors.push((TensorSpec::new(name, dtype, [OUT, in_f]), w));
    }
    let bias: Vec<u8> = bytemuck::cast_slice(&values(99, OUT)).to_vec();
    tensors.push((TensorSpec::new("bias", DType::F32, [OUT]), bias));
    let emb = quantize(DType::Q6K, &values(7, 10 * 256)).unwrap();
    tensors.push((TensorSpec::new("emb.q6_k", DType::Q6K, [10, 256]), emb));
    // Q8_K is a known dtype that the CPU ops do not read.
    tensors.push((
        TensorSpec::new("w.q8_k", DType::Q8K, [2, 256]),
        vec![0; 2 * 292],
    ));
    // Q4_0 with rows of 48 values: 96 values are whole blocks, rows are not.
    tensors.push((
        TensorSpec::new("w.rows48", DType::Q4_0, [2, 48]),
        vec![0; 3 * 18],
    ));

    let mut writer = MllmWriter::new();
    for (spec, _) in &tensors {
        writer.add_tensor(spec.clone()).unwrap();
    }
    let tmp = TempFile::new(&format!("quant-{tag}.mllm"));
    writer
        .write(tmp.path(), |i, _| Ok(Cow::Borrowed(&tensors[i].1[..])))
        .unwrap();
    (tmp, tensors)
}

fn linear_params(name: &str, in_f: usize) -> LinearParams {
    LinearParams {
        in_features: in_f,
        out_features: OUT,
        weight: name.into(),
        bias: Some("bias".into()),
    }
}

/// Checks `y` against the f64 product of the dequantized weights:
/// `|y − ref| ≤ tol · (Σ|x·w| + |b|)`.
fn check(y: &[f32], x: &[f32], rows: usize, w: &[f32], in_f: usize, tol: f64, what: &str) {
    let b = values(99, OUT);
    for t in 0..rows {
        for o in 0..OUT {
            let (mut s, mut m) = (b[o] as f64, b[o].abs() as f64);
            for i in 0..in_f {
                let p = x[t * in_f + i] as f64 * w[o * in_f + i] as f64;
                s += p;
                m += p.abs();
            }
            let got = y[t * OUT + o] as f64;
            assert!((got - s).abs() <= tol * m, "{what} ({t},{o}): {got} vs {s}");
        }
    }
}

#[test]
fn linear_reads_quantized_weights_from_a_mllm_file() {
    let (tmp, tensors) = write_file("linear");
    let file = MllmFile::open(tmp.path()).unwrap();
    let backend = CpuBackend::new(2).unwrap();
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap(),
    );
    // Loaded as a model is: every op first (the backend's ops repack into
    // one arena, buffer after buffer), then `loaded` on each (which gives
    // the arena's unused pages back), then the steps.
    let mut ops: Vec<Box<dyn Op>> = LINEAR
        .iter()
        .map(|&(name, _, in_f)| {
            let params = linear_params(name, in_f);
            let mut op = backend.create_op(&OpDesc::Linear(params)).unwrap();
            op.load(&file).unwrap();
            op
        })
        .collect();
    ops.iter_mut().for_each(|op| op.loaded());
    for (i, (&(name, dtype, in_f), op)) in LINEAR.iter().zip(&mut ops).enumerate() {
        let mut wf = vec![0.0; OUT * in_f];
        dequantize(dtype, &tensors[i].1, &mut wf).unwrap();
        let params = linear_params(name, in_f);
        let mut int8 =
            LinearOp::new(params, Arc::clone(&pool)).with_quant_path(QuantPath::Int8Activations);
        int8.load(&file).unwrap();
        // Decode (one row) and prefill (several rows) take different kernels.
        for rows in [1, 5] {
            let x = values(50 + rows as u64, rows * in_f);
            let y = run_linear(op.as_mut(), &x, rows, in_f, OUT);
            check(
                &y,
                &x,
                rows,
                &wf,
                in_f,
                1e-4,
                &format!("{dtype} rows={rows}"),
            );
            // On one row, 8-bit activations add their rounding error (about
            // 0.4 % of each value), so the bound is looser; several rows
            // take the f32 path.
            let y = run_linear(&mut int8, &x, rows, in_f, OUT);
            check(
                &y,
                &x,
                rows,
                &wf,
                in_f,
                2e-2,
                &format!("{dtype} int8 rows={rows}"),
            );
        }
    }
}

#[test]
fn embedding_reads_quantized_tables() {
    let (tmp, tensors) = write_file("embedding");
    let file = MllmFile::open(tmp.path()).unwrap();
    let backend = CpuBackend::new(1).unwrap();
    let params = EmbeddingParams {
        vocab: 10,
        dim: 256,
        weight: "emb.q6_k".into(),
    };
    let mut op = backend.create_op(&OpDesc::Embedding(params)).unwrap();
    op.load(&file).unwrap();
    let mut table = vec![0.0; 10 * 256];
    let bytes = &tensors
        .iter()
        .find(|(s, _)| s.name == "emb.q6_k")
        .unwrap()
        .1;
    dequantize(DType::Q6K, bytes, &mut table).unwrap();
    let ids = [3u32, 9, 0, 3];
    let step = StepLayout::default();
    let mut out = vec![f32::NAN; ids.len() * 256];
    op.execute(&[OpInput::Tokens(&ids)], &mut out, &step)
        .unwrap();
    for (t, &id) in ids.iter().enumerate() {
        assert_eq!(out[t * 256..][..256], table[id as usize * 256..][..256]);
    }
    let err = op
        .execute(&[OpInput::Tokens(&[10])], &mut out[..256], &step)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
}

#[test]
fn unsupported_quantized_weights_are_named_errors() {
    let (tmp, _) = write_file("errors");
    let file = MllmFile::open(tmp.path()).unwrap();
    let backend = CpuBackend::new(1).unwrap();
    let mut params = linear_params("w.q8_k", 256);
    params.out_features = 2;
    params.bias = None;
    let mut op = backend.create_op(&OpDesc::Linear(params)).unwrap();
    let err = op.load(&file).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::UnsupportedDType(_)), "{msg}");
    assert!(
        msg.contains("linear") && msg.contains("w.q8_k") && msg.contains("q8_k"),
        "{msg}"
    );

    let params = EmbeddingParams {
        vocab: 2,
        dim: 48,
        weight: "w.rows48".into(),
    };
    let mut op = backend.create_op(&OpDesc::Embedding(params)).unwrap();
    let err = op.load(&file).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::UnsupportedDType(_)), "{msg}");
    assert!(
        msg.contains("embedding") && msg.contains("w.rows48") && msg.contains("q4_0"),
        "{msg}"
    );
}
