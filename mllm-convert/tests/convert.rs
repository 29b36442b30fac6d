//! End-to-end tests of the converter against the tiny fixture models.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use half::{bf16, f16};
use mllm_convert::{convert, inspect, ConvertOptions, ConvertReport};
use mllm_core::file::{MllmFile, MllmWriter, TensorSpec};
use mllm_core::{DType, Error};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

const MODELS: [&str; 4] = [
    "tiny-llama",
    "tiny-llama3-mqa",
    "tiny-mistral-swa",
    "tiny-qwen2",
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn fixture(model: &str) -> PathBuf {
    fixtures().join(model)
}

/// A safetensors tensor, owned.
#[derive(Debug)]
struct Source {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn read_safetensors(path: &Path) -> HashMap<String, Source> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.iter()
        .map(|(name, v)| {
            (
                name.to_string(),
                Source {
                    dtype: v.dtype(),
                    shape: v.shape().to_vec(),
                    data: v.data().to_vec(),
                },
            )
        })
        .collect()
}

fn run(input: &Path, output: &Path, dtype: DType) -> ConvertReport {
    let opts = ConvertOptions {
        dtype,
        progress: false,
    };
    convert(input, output, &opts).unwrap()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn bf16s(bytes: &[u8]) -> Vec<bf16> {
    bytes
        .chunks_exact(2)
        .map(|c| bf16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// A temp dir holding `config.json` of tiny-llama and the given weights as `model.safetensors`.
fn model_dir_with(weights: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("tiny-llama").join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    std::fs::write(dir.path().join("model.safetensors"), weights).unwrap();
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// Names of the files in a directory (to check that failed writes leave nothing).
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn f32_conversion_is_bit_exact_for_every_fixture() {
    let out = tempfile::tempdir().unwrap();
    for model in MODELS {
        let dir = fixture(model);
        let path = out.path().join(format!("{model}.mllm"));
        let report = run(&dir, &path, DType::F32);
        let source = read_safetensors(&dir.join("model.safetensors"));
        assert_eq!(report.tensors, source.len(), "{model}");
        assert_eq!(report.skipped, 0);
        assert_eq!(report.dtype, DType::F32);
        assert_eq!(
            report.bytes_written,
            std::fs::metadata(&path).unwrap().len()
        );
        let tensor_bytes: usize = source.values().map(|s| s.data.len()).sum();
        assert_eq!(report.tensor_bytes, tensor_bytes as u64);

        let file = MllmFile::open(&path).unwrap();
        let meta = file.metadata().expect("metadata is written");
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let generation: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("generation_config.json")).unwrap())
                .unwrap();
        assert_eq!(meta.architecture, report.architecture);
        assert_eq!(meta.config, config);
        assert_eq!(meta.generation_config.as_ref(), Some(&generation));
        assert_eq!(meta.tensors.len(), source.len());
        assert_eq!(file.tokenizer_json().unwrap(), None);
        assert_eq!(file.chat_template().unwrap(), None);
        for (name, src) in &source {
            assert_eq!(src.dtype, Dtype::F32);
            let t = file.tensor(name).unwrap();
            assert_eq!(t.dtype(), DType::F32, "{model} {name}");
            assert_eq!(t.shape().dims(), &src.shape[..], "{model} {name}");
            assert_eq!(t.bytes(), &src.data[..], "{model} {name}");
        }
    }
}

#[test]
fn sharded_input_gives_the_same_tensors() {
    let out = tempfile::tempdir().unwrap();
    let plain = out.path().join("plain.mllm");
    run(&fixture("tiny-llama"), &plain, DType::F32);
    let plain = MllmFile::open(&plain).unwrap();

    let sharded_dir = fixture("tiny-llama").join("sharded");
    for (i, input) in [
        sharded_dir.clone(),
        sharded_dir.join("model.safetensors.index.json"),
    ]
    .iter()
    .enumerate()
    {
        let path = out.path().join(format!("sharded-{i}.mllm"));
        let report = run(input, &path, DType::F32);
        assert_eq!(report.tensors, 21);
        let sharded = MllmFile::open(&path).unwrap();
        assert_eq!(
            sharded.metadata().unwrap().tensors,
            plain.metadata().unwrap().tensors
        );
        for name in plain.metadata().unwrap().tensors.keys() {
            assert_eq!(
                sharded.tensor(name).unwrap().bytes(),
                plain.tensor(name).unwrap().bytes(),
                "{name}"
            );
        }
    }
    // Same config, same tensors, name order: the files are identical too.
    assert_eq!(
        std::fs::read(out.path().join("sharded-1.mllm")).unwrap(),
        std::fs::read(plain.path()).unwrap()
    );
}

#[test]
fn single_safetensors_file_input() {
    let out = tempfile::tempdir().unwrap();
    let a = out.path().join("a.mllm");
    let b = out.path().join("b.mllm");
    run(&fixture("tiny-llama"), &a, DType::F32);
    run(
        &fixture("tiny-llama").join("model.safetensors"),
        &b,
        DType::F32,
    );
    assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
}

#[test]
fn half_targets_round_matrices_and_keep_vectors_f32() {
    let out = tempfile::tempdir().unwrap();
    let dir = fixture("tiny-llama");
    let source = read_safetensors(&dir.join("model.safetensors"));
    for target in [DType::F16, DType::BF16] {
        let path = out.path().join(format!("{target}.mllm"));
        let report = run(&dir, &path, target);
        assert_eq!(report.dtype, target);
        let file = MllmFile::open(&path).unwrap();
        let (mut matrices, mut vectors) = (0, 0);
        for (name, src) in &source {
            let t = file.tensor(name).unwrap();
            let values = f32s(&src.data);
            if src.shape.len() >= 2 {
                matrices += 1;
                assert_eq!(t.dtype(), target, "{name}");
                let expected: Vec<u8> = match target {
                    DType::F16 => values
                        .iter()
                        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                        .collect(),
                    _ => values
                        .iter()
                        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                        .collect(),
                };
                assert_eq!(t.bytes(), &expected[..], "{name}");
            } else {
                vectors += 1;
                assert_eq!(t.dtype(), DType::F32, "{name}");
                assert_eq!(t.bytes(), &src.data[..], "{name}");
            }
        }
        assert!(matrices > 0 && vectors > 0);
        assert!(
            report.bytes_written
                < std::fs::metadata(dir.join("model.safetensors"))
                    .unwrap()
                    .len()
        );
    }
}

#[test]
fn bf16_source_widens_exactly() {
    let bf16_path = fixture("tiny-llama").join("model.bf16.safetensors");
    let source = read_safetensors(&bf16_path);
    let dir = model_dir_with(&std::fs::read(&bf16_path).unwrap());
    let out = tempfile::tempdir().unwrap();

    let path = out.path().join("f32.mllm");
    run(dir.path(), &path, DType::F32);
    let file = MllmFile::open(&path).unwrap();
    for (name, src) in &source {
        assert_eq!(src.dtype, Dtype::BF16);
        let t = file.tensor(name).unwrap();
        assert_eq!(t.dtype(), DType::F32);
        let expected: Vec<f32> = bf16s(&src.data).iter().map(|v| v.to_f32()).collect();
        let got = f32s(t.bytes());
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            expected.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{name}"
        );
    }

    // bf16 -> bf16 copies matrices unchanged; vectors still widen to f32.
    let path = out.path().join("bf16.mllm");
    run(dir.path(), &path, DType::BF16);
    let file = MllmFile::open(&path).unwrap();
    for (name, src) in &source {
        let t = file.tensor(name).unwrap();
        if src.shape.len() >= 2 {
            assert_eq!(t.dtype(), DType::BF16);
            assert_eq!(t.bytes(), &src.data[..], "{name}");
        } else {
            assert_eq!(t.dtype(), DType::F32);
        }
    }
}

#[test]
fn conversion_is_deterministic() {
    let out = tempfile::tempdir().unwrap();
    for dtype in [DType::F32, DType::F16] {
        let a = out.path().join(format!("a-{dtype}.mllm"));
        let b = out.path().join(format!("b-{dtype}.mllm"));
        run(&fixture("tiny-mistral-swa"), &a, dtype);
        run(&fixture("tiny-mistral-swa"), &b, dtype);
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    }
}

#[test]
fn tokenizer_and_chat_template_are_embedded() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture("tiny-llama"), dir.path());
    let tokenizer = r#"{"version":"1.0","model":{"type":"BPE","vocab":{},"merges":[]}}"#;
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer).unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"chat_template":"{{ messages }}"}"#,
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("a.mllm");
    let report = run(dir.path(), &path, DType::F32);
    assert!(report.tokenizer && report.chat_template);
    let file = MllmFile::open(&path).unwrap();
    assert_eq!(file.tokenizer_json().unwrap(), Some(tokenizer));
    assert_eq!(file.chat_template().unwrap(), Some("{{ messages }}"));
    let text = inspect(&path).unwrap();
    assert!(
        text.contains(&format!("embedded ({} bytes)", tokenizer.len())),
        "{text}"
    );

    // A chat_template.jinja file takes precedence.
    std::fs::write(dir.path().join("chat_template.jinja"), "jinja {{ x }}").unwrap();
    run(dir.path(), &path, DType::F32);
    let file = MllmFile::open(&path).unwrap();
    assert_eq!(file.chat_template().unwrap(), Some("jinja {{ x }}"));
}

#[test]
fn rotary_buffers_are_skipped() {
    let bytes = std::fs::read(fixture("tiny-llama").join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let inv_freq: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let mut tensors: Vec<(String, TensorView<'_>)> = st.tensors();
    tensors.push((
        "model.layers.0.self_attn.rotary_emb.inv_freq".to_string(),
        TensorView::new(Dtype::F32, vec![8], &inv_freq).unwrap(),
    ));
    let weights = safetensors::serialize(tensors, None).unwrap();
    let dir = model_dir_with(&weights);
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("a.mllm");
    let report = run(dir.path(), &path, DType::F32);
    assert_eq!(report.tensors, 21);
    assert_eq!(report.skipped, 1);
    let file = MllmFile::open(&path).unwrap();
    assert!(!file.entries().keys().any(|n| n.contains("rotary_emb")));
}

#[test]
fn inspect_lists_architecture_shapes_and_dtypes() {
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("a.mllm");
    run(&fixture("tiny-llama"), &path, DType::F16);
    let text = inspect(&path).unwrap();
    assert!(text.contains("LlamaForCausalLM"), "{text}");
    assert!(text.contains("hidden 64"), "{text}");
    assert!(text.contains("layers 2"), "{text}");
    let q = text
        .lines()
        .find(|l| l.starts_with("model.layers.0.self_attn.q_proj.weight "))
        .expect("q_proj row");
    assert!(q.contains("[64, 64]") && q.contains("f16"), "{q}");
    let k = text
        .lines()
        .find(|l| l.starts_with("model.layers.0.self_attn.k_proj.weight "))
        .expect("k_proj row");
    assert!(k.contains("[32, 64]") && k.contains(" 4096 "), "{k}");
    let norm = text
        .lines()
        .find(|l| l.starts_with("model.norm.weight "))
        .expect("norm row");
    assert!(norm.contains("f32") && norm.contains("[64]"), "{norm}");
    assert!(text.contains("f32: 5, f16: 16"), "{text}");
    assert!(text.contains("total: 21 tensors"), "{text}");
}

#[test]
fn inspect_plain_v1_file_without_metadata() {
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("plain.mllm");
    let mut writer = MllmWriter::new();
    writer
        .add_tensor(TensorSpec::new("w", DType::F32, vec![2, 3]))
        .unwrap();
    writer
        .write(&path, |_, _| Ok(std::borrow::Cow::Owned(vec![0u8; 24])))
        .unwrap();
    let text = inspect(&path).unwrap();
    assert!(text.contains("plain mllm v1"), "{text}");
    let row = text.lines().find(|l| l.starts_with("w ")).expect("row");
    assert!(
        row.contains(" ? ") && row.contains("f32") && row.contains("24"),
        "{row}"
    );

    // Not a .mllm file at all: an error, not a panic.
    assert!(inspect(&fixture("tiny-llama").join("config.json")).is_err());
}

#[test]
fn unsupported_architecture_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture("tiny-llama"), dir.path());
    let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        config.replace("LlamaForCausalLM", "FancyNewForCausalLM"),
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let err = convert(
        dir.path(),
        &out.path().join("a.mllm"),
        &ConvertOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::UnsupportedArchitecture(a) if a == "FancyNewForCausalLM"),
        "{err}"
    );
    assert!(listing(out.path()).is_empty());
}

#[test]
fn missing_config_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("tiny-llama").join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    for input in [
        dir.path().to_path_buf(),
        dir.path().join("model.safetensors"),
    ] {
        let err = convert(
            &input,
            &out.path().join("a.mllm"),
            &ConvertOptions::default(),
        )
        .unwrap_err();
        match &err {
            Error::Config(msg) => assert!(
                msg.contains(&dir.path().join("config.json").display().to_string()),
                "{msg}"
            ),
            other => panic!("expected a config error, got {other}"),
        }
    }
    // No weights at all.
    let empty = tempfile::tempdir().unwrap();
    assert!(convert(
        empty.path(),
        &out.path().join("a.mllm"),
        &ConvertOptions::default()
    )
    .is_err());
    // An input that does not exist.
    let err = convert(
        &empty.path().join("nope"),
        &out.path().join("a.mllm"),
        &ConvertOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
}

#[test]
fn unsupported_source_dtype_names_tensor_and_dtype() {
    let ids: Vec<u8> = (0i64..4).flat_map(|i| i.to_le_bytes()).collect();
    let weights = safetensors::serialize(
        [(
            "model.embed_tokens.weight",
            TensorView::new(Dtype::I64, vec![2, 2], &ids).unwrap(),
        )],
        None,
    )
    .unwrap();
    let dir = model_dir_with(&weights);
    let out = tempfile::tempdir().unwrap();
    let err = convert(
        dir.path(),
        &out.path().join("a.mllm"),
        &ConvertOptions::default(),
    )
    .unwrap_err();
    match &err {
        Error::UnsupportedDType(msg) => {
            assert!(msg.contains("model.embed_tokens.weight"), "{msg}");
            assert!(msg.contains("I64"), "{msg}");
        }
        other => panic!("expected an unsupported dtype error, got {other}"),
    }
}

#[test]
fn dtypes_without_a_quantizer_are_rejected() {
    let out = tempfile::tempdir().unwrap();
    for (dtype, name) in [(DType::Q8K, "q8_k"), (DType::I8, "i8")] {
        let opts = ConvertOptions {
            dtype,
            progress: false,
        };
        let err = convert(&fixture("tiny-llama"), &out.path().join("a.mllm"), &opts).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{name} is not a conversion target; use f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k or iq4_xs"
            )
        );
    }
    assert!(listing(out.path()).is_empty());
}

#[test]
fn shard_missing_a_listed_tensor_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture("tiny-llama").join("sharded"), dir.path());
    let index_path = dir.path().join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    // Claim the final norm lives in the first shard, which does not have it.
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors".into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    let out = tempfile::tempdir().unwrap();
    let err = convert(
        dir.path(),
        &out.path().join("a.mllm"),
        &ConvertOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::MissingTensor(_)), "{err}");
    assert!(err.to_string().contains("model.norm.weight"), "{err}");

    // A shard file that is not there at all.
    index["weight_map"]["model.norm.weight"] = "model-00003-of-00002.safetensors".into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    let err = convert(
        dir.path(),
        &out.path().join("a.mllm"),
        &ConvertOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");

    // A shard path escaping the model directory.
    index["weight_map"]["model.norm.weight"] = "../model.safetensors".into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    assert!(convert(
        dir.path(),
        &out.path().join("a.mllm"),
        &ConvertOptions::default()
    )
    .is_err());
    assert!(listing(out.path()).is_empty());
}

#[test]
fn corrupt_safetensors_is_an_error_not_a_panic() {
    let good = std::fs::read(fixture("tiny-llama").join("model.safetensors")).unwrap();
    let mut cases: Vec<Vec<u8>> = [0, 4, 8, 100, good.len() / 2, good.len() - 1]
        .iter()
        .map(|&n| good[..n].to_vec())
        .collect();
    let mut bad_header = good.clone();
    bad_header[10] = 0xff;
    cases.push(bad_header);
    let mut huge_header = good.clone();
    huge_header[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    cases.push(huge_header);
    let mut extra = good.clone();
    extra.extend_from_slice(&[0; 3]);
    cases.push(extra);
    for (i, bytes) in cases.iter().enumerate() {
        let dir = model_dir_with(bytes);
        let out = tempfile::tempdir().unwrap();
        let result = convert(
            dir.path(),
            &out.path().join("a.mllm"),
            &ConvertOptions::default(),
        );
        assert!(result.is_err(), "case {i} converted");
        assert!(listing(out.path()).is_empty(), "case {i} left files");
    }
}

#[test]
fn binary_converts_inspects_and_fails_cleanly() {
    let exe = env!("CARGO_BIN_EXE_mllm-convert");
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("tiny.mllm");

    let run = Command::new(exe)
        .arg(fixture("tiny-qwen2"))
        .arg("-o")
        .arg(&path)
        .args(["--dtype", "bf16", "--quiet"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let stdout = String::from_utf8(run.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        stdout.contains("bf16") && stdout.contains("tiny.mllm"),
        "{stdout}"
    );
    let file = MllmFile::open(&path).unwrap();
    assert_eq!(file.metadata().unwrap().architecture, "Qwen2ForCausalLM");

    let run = Command::new(exe)
        .arg("inspect")
        .arg(&path)
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let stdout = String::from_utf8(run.stdout).unwrap();
    assert!(
        stdout.contains("Qwen2ForCausalLM") && stdout.contains("bf16"),
        "{stdout}"
    );

    let fail = |args: &[&str]| {
        let run = Command::new(exe).args(args).output().unwrap();
        assert_eq!(run.status.code(), Some(1), "{args:?}: {run:?}");
        let stderr = String::from_utf8(run.stderr).unwrap();
        assert!(stderr.starts_with("error:"), "{args:?}: {stderr}");
        stderr
    };
    let missing = out.path().join("missing");
    let missing = missing.to_str().unwrap();
    let dest = path.to_str().unwrap();
    fail(&[missing, "-o", dest]);
    fail(&["inspect", missing]);
    let fixture_dir = fixture("tiny-llama");
    let stderr = fail(&[fixture_dir.to_str().unwrap(), "-o", dest, "--dtype", "q9_0"]);
    assert!(
        stderr.contains(
            "unknown dtype 'q9_0'; use f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k or iq4_xs"
        ),
        "{stderr}"
    );
    fail(&[fixture_dir.to_str().unwrap()]);
}
