//! f16 and bf16 weights end to end: a `.mllm` file holding f16/bf16 linear
//! weights and f32/f16/bf16 embedding tables, memory-mapped as the weight
//! source of the CPU ops. Linear weights whose shape fits the packed
//! layout (rows in eights, columns in 32s) are repacked at load, the others
//! read in place; both must match the f64 product, and every row of a
//! batch must equal the same row computed alone.

mod common;

use std::borrow::Cow;

use half::{bf16, f16};
use mllm_core::file::{MllmFile, MllmWriter, TensorSpec};
use mllm_core::op::{EmbeddingParams, LinearParams, OpDesc, OpInput};
use mllm_core::step::StepLayout;
use mllm_core::{Backend, DType, Error};
use mllm_ops::cpu::CpuBackend;

use common::{run_linear, values, TempFile};

/// `x` stored as `dtype` (f32, f16 or bf16): the bytes and the values the
/// stored elements hold.
fn encode(dtype: DType, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    match dtype {
        DType::F32 => (bytemuck::cast_slice(x).to_vec(), x.to_vec()),
        DType::F16 => {
            let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            (
                bytemuck::cast_slice(&h).to_vec(),
                h.iter().map(|v| v.to_f32()).collect(),
            )
        }
        _ => {
            let h: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            (
                bytemuck::cast_slice(&h).to_vec(),
                h.iter().map(|v| v.to_f32()).collect(),
            )
        }
    }
}

/// Writes `tensors` (name, dtype, shape, values) and returns the file and
/// each tensor's stored values.
fn write_file(
    tag: &str,
    tensors: &[(String, DType, [usize; 2], Vec<f32>)],
) -> (TempFile, Vec<Vec<f32>>) {
    let encoded: Vec<(Vec<u8>, Vec<f32>)> =
        tensors.iter().map(|(_, d, _, x)| encode(*d, x)).collect();
    let mut writer = MllmWriter::new();
    for (name, dtype, shape, _) in tensors {
        writer
            .add_tensor(TensorSpec::new(name, *dtype, *shape))
            .unwrap();
    }
    let tmp = TempFile::new(&format!("half-{tag}.mllm"));
    writer
        .write(tmp.path(), |i, _| Ok(Cow::Borrowed(&encoded[i].0[..])))
        .unwrap();
    (tmp, encoded.into_iter().map(|(_, v)| v).collect())
}

#[test]
fn linear_reads_f16_and_bf16_weights_packed_or_in_place() {
    // [out, in]: packed; columns not in 32s; rows not in eights.
    let shapes = [[40, 96], [40, 40], [12, 64]];
    let mut tensors = Vec::new();
    for (d, dtype) in [DType::F16, DType::BF16].into_iter().enumerate() {
        for (s, shape) in shapes.iter().enumerate() {
            let name = format!("w.{dtype}.{s}");
            tensors.push((
                name,
                dtype,
                *shape,
                values((10 * d + s) as u64, shape[0] * shape[1]),
            ));
        }
    }
    let (tmp, stored) = write_file("linear", &tensors);
    let file = MllmFile::open(tmp.path()).unwrap();
    let backend = CpuBackend::new(2).unwrap();
    for ((name, dtype, [out_f, in_f], _), w) in tensors.iter().zip(&stored) {
        let (out_f, in_f) = (*out_f, *in_f);
        let params = LinearParams {
            in_features: in_f,
            out_features: out_f,
            weight: name.clone(),
            bias: None,
        };
        let mut op = backend.create_op(&OpDesc::Linear(params)).unwrap();
        op.load(&file).unwrap();
        let rows = 5;
        let x = values(77, rows * in_f);
        let all = run_linear(op.as_mut(), &x, rows, in_f, out_f);
        for t in 0..rows {
            let xt = &x[t * in_f..(t + 1) * in_f];
            let alone = run_linear(op.as_mut(), xt, 1, in_f, out_f);
            assert_eq!(
                alone,
                all[t * out_f..(t + 1) * out_f],
                "{dtype} {name} row {t}"
            );
            for o in 0..out_f {
                let row = &w[o * in_f..(o + 1) * in_f];
                let want: f64 = row.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = row
                    .iter()
                    .zip(xt)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let got = all[t * out_f + o] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * mag,
                    "{name} ({t},{o}): {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn embedding_reads_float_tables_row_by_row() {
    let (vocab, dim) = (10, 64);
    let tensors: Vec<_> = [DType::F32, DType::F16, DType::BF16]
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            (
                format!("emb.{d}"),
                d,
                [vocab, dim],
                values(30 + i as u64, vocab * dim),
            )
        })
        .collect();
    let (tmp, stored) = write_file("embedding", &tensors);
    let file = MllmFile::open(tmp.path()).unwrap();
    let backend = CpuBackend::new(1).unwrap();
    let step = StepLayout::default();
    for ((name, dtype, _, _), table) in tensors.iter().zip(&stored) {
        let params = EmbeddingParams {
            vocab,
            dim,
            weight: name.clone(),
        };
        let mut op = backend.create_op(&OpDesc::Embedding(params)).unwrap();
        op.load(&file).unwrap();
        let ids = [3u32, 9, 0, 3];
        let mut out = vec![f32::NAN; ids.len() * dim];
        op.execute(&[OpInput::Tokens(&ids)], &mut out, &step)
            .unwrap();
        for (t, &id) in ids.iter().enumerate() {
            let want = &table[id as usize * dim..][..dim];
            assert_eq!(out[t * dim..][..dim], *want, "{dtype} token {id}");
        }
        let err = op
            .execute(&[OpInput::Tokens(&[10])], &mut out[..dim], &step)
            .unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    }
}
