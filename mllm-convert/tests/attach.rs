//! `mllm-convert attach`: a plain mllm v1 file made self-describing.

#[path = "../../tests/common/plain_v1.rs"]
mod plain_v1;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mllm_convert::{convert, ConvertOptions};
use mllm_core::file::MllmFile;
use mllm_core::DType;

fn fixture(model: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(model)
}

fn attach(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mllm-convert"))
        .arg("attach")
        .args(args)
        .output()
        .unwrap()
}

/// `attach` of a plain file written from the checkpoint equals a normal
/// conversion of the same checkpoint tensor by tensor (names, dtypes,
/// shapes, bytes), with the same config and generation config.
#[test]
fn attach_equals_a_normal_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("tiny-llama");
    let plain = dir.path().join("plain.mllm");
    plain_v1::write_plain_v1(&src.join("model.safetensors"), &plain, &[]);
    let attached = dir.path().join("attached.mllm");
    let out = attach(&[
        plain.to_str().unwrap(),
        "-o",
        attached.to_str().unwrap(),
        "--hf-dir",
        src.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("(LlamaForCausalLM) with metadata"),
        "{stdout}"
    );

    let normal = dir.path().join("normal.mllm");
    let opts = ConvertOptions {
        dtype: DType::F32,
        progress: false,
    };
    convert(&src, &normal, &opts).unwrap();
    let (a, n) = (
        MllmFile::open(&attached).unwrap(),
        MllmFile::open(&normal).unwrap(),
    );
    let (am, nm) = (a.metadata().unwrap(), n.metadata().unwrap());
    assert_eq!(am.architecture, nm.architecture);
    assert_eq!(am.config, nm.config);
    assert_eq!(am.generation_config, nm.generation_config);
    let mut names: Vec<&String> = am.tensors.keys().collect();
    let mut want: Vec<&String> = nm.tensors.keys().collect();
    names.sort();
    want.sort();
    assert_eq!(names, want);
    for name in names {
        let (x, y) = (a.tensor(name).unwrap(), n.tensor(name).unwrap());
        assert_eq!(x.dtype(), y.dtype(), "{name}");
        assert_eq!(x.shape(), y.shape(), "{name}");
        assert_eq!(x.bytes(), y.bytes(), "{name}");
    }
}

/// Bad input is refused before anything is written, with the reason.
#[test]
fn attach_refuses_what_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("tiny-llama");
    let out_path = dir.path().join("out.mllm");
    let out = out_path.to_str().unwrap();
    let stderr = |o: Output| {
        assert_eq!(o.status.code(), Some(1));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };

    // A weight the architecture needs is missing.
    let missing = dir.path().join("missing.mllm");
    let gone = "model.layers.1.mlp.up_proj.weight";
    plain_v1::write_plain_v1(&src.join("model.safetensors"), &missing, &[gone]);
    let config = src.join("config.json");
    let err = stderr(attach(&[
        missing.to_str().unwrap(),
        "-o",
        out,
        "--config",
        config.to_str().unwrap(),
    ]));
    assert!(err.contains(gone), "{err}");
    assert!(!out_path.exists());

    // A config whose shapes do not match the tensors.
    let plain = dir.path().join("plain.mllm");
    plain_v1::write_plain_v1(&src.join("model.safetensors"), &plain, &[]);
    let mut wrong: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    wrong["intermediate_size"] = serde_json::json!(96);
    let wrong_path = dir.path().join("config.json");
    std::fs::write(&wrong_path, wrong.to_string()).unwrap();
    let err = stderr(attach(&[
        plain.to_str().unwrap(),
        "-o",
        out,
        "--config",
        wrong_path.to_str().unwrap(),
    ]));
    assert!(err.contains("model.layers.0.mlp"), "{err}");
    assert!(!out_path.exists());

    // A layer count the tensors cannot back is refused before the model
    // is built (as on load and on GGUF import).
    wrong["intermediate_size"] = serde_json::json!(128);
    wrong["num_hidden_layers"] = serde_json::json!(1_000_000_000_000u64);
    std::fs::write(&wrong_path, wrong.to_string()).unwrap();
    let err = stderr(attach(&[
        plain.to_str().unwrap(),
        "-o",
        out,
        "--config",
        wrong_path.to_str().unwrap(),
    ]));
    assert!(
        err.contains("'num_hidden_layers' is 1000000000000, but the weights hold only"),
        "{err}"
    );
    assert!(!out_path.exists());

    // No config at all.
    let err = stderr(attach(&[plain.to_str().unwrap(), "-o", out]));
    assert!(
        err.contains("--config config.json or --hf-dir DIR"),
        "{err}"
    );

    // A file that already describes itself.
    let normal = dir.path().join("normal.mllm");
    let opts = ConvertOptions {
        dtype: DType::F32,
        progress: false,
    };
    convert(&src, &normal, &opts).unwrap();
    let err = stderr(attach(&[
        normal.to_str().unwrap(),
        "-o",
        out,
        "--hf-dir",
        src.to_str().unwrap(),
    ]));
    assert!(err.contains("already embeds its metadata"), "{err}");
    assert!(!out_path.exists());
}
