//! Files that store weights in the packed layout of the kernels
//! (`--packed`: `q4_packed`, `q8_0_packed`): written by the converter and by
//! `quantize`, loaded by mapping alone, with the same results as the
//! unpacked file, and refused with a named error when a packed tensor's
//! shape is not whole row groups.

mod common;

use std::borrow::Cow;
use std::path::Path;

use common::*;
use mllm::convert::{convert_with_policy, quantize_file, DTypePolicy, QuantizeOptions};
use mllm::core::file::{Metadata, MllmFile, MllmWriter, TensorSpec};
use mllm::core::DType;
use mllm::ops::cpu::kernels::PackedQ4;

/// tiny-llama with q4_1 matrices and a q8_0 embedding, packed or not.
fn policy(packed: bool) -> DTypePolicy {
    DTypePolicy {
        embed_dtype: Some(DType::Q8_0),
        packed,
        ..DTypePolicy::new(DType::Q4_1)
    }
}

fn write(input: &Path, out: &Path, policy: DTypePolicy, requantize: bool) {
    let opts = QuantizeOptions {
        policy,
        progress: false,
    };
    if requantize {
        quantize_file(input, out, &opts).unwrap();
    } else {
        convert_with_policy(input, out, &opts).unwrap();
    }
}

#[test]
fn packed_files_give_the_unpacked_files_results() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, packed, requantized) = (
        dir.path().join("plain.mllm"),
        dir.path().join("packed.mllm"),
        dir.path().join("requantized.mllm"),
    );
    write(&fixture("tiny-llama"), &plain, policy(false), false);
    write(&fixture("tiny-llama"), &packed, policy(true), false);
    write(&plain, &requantized, policy(true), true);

    // Every matrix and the embedding are packed; norms stay f32.
    let file = MllmFile::open(&packed).unwrap();
    let again = MllmFile::open(&requantized).unwrap();
    let meta = file.metadata().unwrap();
    for (name, shape) in &meta.tensors {
        let t = file.tensor(name).unwrap();
        let want = match (shape.len(), name.contains("embed_tokens")) {
            (1, _) => DType::F32,
            (_, true) => DType::Q8Packed,
            _ => DType::Q4Packed,
        };
        assert_eq!(t.dtype(), want, "{name}");
        // Converting with --packed and requantizing with --packed agree.
        assert_eq!(t.bytes(), again.tensor(name).unwrap().bytes(), "{name}");
    }

    // The same logits: with AVX2 both run the packed kernels (the plain
    // file repacked at load), elsewhere the plain file's row kernels.
    let ids = Reference::load("tiny-llama").ids("/inputs/long");
    let a = prompt_logits(&mut load(&plain), &ids).data().to_vec();
    let b = prompt_logits(&mut load(&packed), &ids).data().to_vec();
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        assert_eq!(a, b);
        return;
    }
    assert_close("packed vs plain logits", &a, &b, 3e-3);
}

/// Requantizing a packed file unpacks its values exactly: to f32 it gives
/// the f32 file of the unpacked q4_1 / q8_0 weights.
#[test]
fn packed_files_requantize_to_the_unpacked_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n);
    write(
        &fixture("tiny-llama"),
        &path("plain.mllm"),
        policy(false),
        false,
    );
    write(
        &fixture("tiny-llama"),
        &path("packed.mllm"),
        policy(true),
        false,
    );
    let f32s = DTypePolicy::new(DType::F32);
    write(&path("plain.mllm"), &path("a.mllm"), f32s, true);
    write(&path("packed.mllm"), &path("b.mllm"), f32s, true);
    let (a, b) = (
        MllmFile::open(path("a.mllm")).unwrap(),
        MllmFile::open(path("b.mllm")).unwrap(),
    );
    for name in a.metadata().unwrap().tensors.keys() {
        let (x, y) = (a.tensor(name).unwrap(), b.tensor(name).unwrap());
        assert_eq!(x.dtype(), DType::F32);
        assert_eq!(x.bytes(), y.bytes(), "{name}");
    }
}

/// A packed tensor whose rows are not whole groups of eight (which the
/// converter never writes) is refused with an error naming it.
#[test]
fn packed_tensors_of_partial_row_groups_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.mllm");
    let mut w = MllmWriter::new();
    w.metadata(Metadata::new("LlamaForCausalLM", serde_json::json!({})));
    w.add_tensor(TensorSpec::new("w", DType::Q4Packed, [12, 64]))
        .unwrap();
    // 768 values are three 256-value blocks of 160 bytes.
    w.write(&path, |_, _| Ok(Cow::Owned(vec![0u8; 480])))
        .unwrap();
    let file = MllmFile::open(&path).unwrap();
    let err = PackedQ4::mapped(file.tensor("w").unwrap(), [12, 64])
        .err()
        .expect("must be refused")
        .to_string();
    assert!(
        err.contains("weight 'w' of dtype q4_packed has shape [12, 64]")
            && err.contains("groups of 8"),
        "{err}"
    );
}

/// GGUF input is imported as stored: --packed is refused with the way
/// to get a packed file.
#[test]
fn packed_gguf_conversion_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("m.gguf");
    std::fs::write(&gguf, b"GGUF").unwrap();
    let opts = QuantizeOptions {
        policy: policy(true),
        progress: false,
    };
    let err = convert_with_policy(&gguf, &dir.path().join("o.mllm"), &opts)
        .unwrap_err()
        .to_string();
    assert!(err.contains("quantize --packed"), "{err}");
}
