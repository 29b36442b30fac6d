//! Tensors the architecture's mapping asks to transpose: GPT-2's `Conv1D`
//! weights are stored `[in, out]` and come out `[out, in]`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::f16;
use mllm_convert::{convert, ConvertOptions};
use mllm_core::file::MllmFile;
use mllm_core::{DType, Error};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

fn fixture(model: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(model)
}

fn run(input: &Path, output: &Path, dtype: DType) -> mllm_core::Result<()> {
    let opts = ConvertOptions {
        dtype,
        progress: false,
    };
    convert(input, output, &opts).map(|_| ())
}

/// `(shape, f32 values)` of every tensor of a safetensors file.
fn read_f32(path: &Path) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.iter()
        .map(|(name, v)| {
            assert_eq!(v.dtype(), Dtype::F32);
            let values = v
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name.to_string(), (v.shape().to_vec(), values))
        })
        .collect()
}

fn is_conv1d(name: &str) -> bool {
    name.starts_with("transformer.h.")
        && [".c_attn.weight", ".c_proj.weight", ".c_fc.weight"]
            .iter()
            .any(|s| name.ends_with(s))
}

#[test]
fn gpt2_conv1d_weights_are_transposed() {
    let source = read_f32(&fixture("tiny-gpt2").join("model.safetensors"));
    let out = tempfile::tempdir().unwrap();
    for dtype in [DType::F32, DType::F16] {
        let path = out.path().join(format!("{dtype}.mllm"));
        run(&fixture("tiny-gpt2"), &path, dtype).unwrap();
        let file = MllmFile::open(&path).unwrap();
        let mut transposed = 0;
        for (name, (shape, values)) in &source {
            let t = file.tensor(name).unwrap();
            let want: Vec<f32> = if is_conv1d(name) {
                transposed += 1;
                let (rows, cols) = (shape[0], shape[1]);
                assert_eq!(t.shape().dims(), [cols, rows], "{name}");
                (0..cols)
                    .flat_map(|c| (0..rows).map(move |r| values[r * cols + c]))
                    .collect()
            } else {
                assert_eq!(t.shape().dims(), &shape[..], "{name}");
                values.clone()
            };
            let want_bytes: Vec<u8> = match t.dtype() {
                DType::F32 => want.iter().flat_map(|v| v.to_le_bytes()).collect(),
                DType::F16 => want
                    .iter()
                    .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                    .collect(),
                other => panic!("{name}: unexpected dtype {other}"),
            };
            assert_eq!(t.bytes(), &want_bytes[..], "{name} as {dtype}");
        }
        // c_attn, attn c_proj, c_fc and mlp c_proj in each of the 2 blocks.
        assert_eq!(transposed, 8);
    }
}

#[test]
fn transposing_a_tensor_that_is_not_2d_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("tiny-gpt2").join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let data = vec![0u8; 4 * 6];
    let view = TensorView::new(Dtype::F32, vec![6], &data).unwrap();
    let bytes = safetensors::serialize([("h.0.attn.c_attn.weight", view)], None).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    let err = run(dir.path(), &dir.path().join("out.mllm"), DType::F32).unwrap_err();
    match err {
        Error::InvalidInput(msg) => assert!(
            msg.contains("'h.0.attn.c_attn.weight'") && msg.contains("not 2-D"),
            "{msg}"
        ),
        other => panic!("expected an invalid input error, got {other}"),
    }
    assert!(!dir.path().join("out.mllm").exists());
}
