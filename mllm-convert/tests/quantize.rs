//! Quantized conversion and requantization: the per-tensor policy, its
//! fallbacks, byte equality with the block quantizers, and bad input.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use mllm_convert::{
    convert, convert_with_policy, parse_target_dtype, quantize_file, ConvertOptions, ConvertReport,
    DTypePolicy, QuantizeOptions,
};
use mllm_core::file::{Metadata, MllmFile, MllmWriter, TensorSpec};
use mllm_core::{DType, Error};
use mllm_ops::quant::{dequantize, quantize};
use safetensors::SafeTensors;

fn fixture(model: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(model)
}

/// `(shape, values)` of every tensor of a model's f32 safetensors file.
fn source(model: &str) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(fixture(model).join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.iter()
        .map(|(name, v)| (name.to_string(), (v.shape().to_vec(), f32s(v.data()))))
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn opts(dtype: DType, embed: Option<DType>, head: Option<DType>) -> QuantizeOptions {
    QuantizeOptions {
        policy: DTypePolicy {
            dtype,
            embed_dtype: embed,
            head_dtype: head,
            packed: false,
        },
        progress: false,
    }
}

fn convert_fixture(model: &str, out: &Path, opts: &QuantizeOptions) -> ConvertReport {
    convert_with_policy(&fixture(model), out, opts).unwrap()
}

/// The dequantized values of a stored tensor.
fn values(file: &MllmFile, name: &str) -> Vec<f32> {
    let t = file.tensor(name).unwrap();
    let mut out = vec![0.0; t.shape().numel()];
    match t.dtype() {
        DType::F32 => out = f32s(t.bytes()),
        dtype => dequantize(dtype, t.bytes(), &mut out).unwrap(),
    }
    out
}

fn is_vector(shape: &[usize]) -> bool {
    shape.len() < 2
}

#[test]
fn q4_0_tiny_llama_follows_the_policy() {
    let src = source("tiny-llama");
    let out = tempfile::tempdir().unwrap();
    for (embed, head) in [
        (None, None),
        (Some(DType::Q8_0), Some(DType::F16)),
        (Some(DType::F32), Some(DType::Q4_1)),
    ] {
        let path = out.path().join("q4_0.mllm");
        let report = convert_fixture("tiny-llama", &path, &opts(DType::Q4_0, embed, head));
        assert_eq!(report.dtype, DType::Q4_0);
        assert_eq!(report.tensors, 21);
        assert_eq!(report.fallbacks, 0);
        let file = MllmFile::open(&path).unwrap();
        for (name, (shape, data)) in &src {
            let t = file.tensor(name).unwrap();
            assert_eq!(t.shape().dims(), &shape[..], "{name}");
            let want = if is_vector(shape) {
                DType::F32
            } else if name == "model.embed_tokens.weight" {
                embed.unwrap_or(DType::Q4_0)
            } else if name == "lm_head.weight" {
                head.unwrap_or(DType::Q4_0)
            } else {
                DType::Q4_0
            };
            assert_eq!(t.dtype(), want, "{name}");
            let expected = match want {
                DType::F32 => f32_bytes(data),
                DType::F16 => data
                    .iter()
                    .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                    .collect(),
                q => quantize(q, data).unwrap(),
            };
            assert_eq!(t.bytes(), &expected[..], "{name}");
        }
    }
}

/// Tiny-llama's rows are 64 or 128 values: no K-quant block of 256 fits, so
/// every matrix falls back to the 32-value format of the same kind.
#[test]
fn k_quants_fall_back_on_short_rows() {
    let out = tempfile::tempdir().unwrap();
    for (k, small) in [
        (DType::Q4K, DType::Q4_1),
        (DType::Q5K, DType::Q5_1),
        (DType::Q6K, DType::Q8_0),
        (DType::Q2K, DType::IQ4NL),
        (DType::Q3K, DType::IQ4NL),
        (DType::IQ4XS, DType::IQ4NL),
    ] {
        let path = out.path().join(format!("{k}.mllm"));
        let report = convert_fixture("tiny-llama", &path, &opts(k, None, None));
        assert_eq!(report.dtype, k);
        // 7 matrices in each of 2 layers, the embedding and the head.
        assert_eq!(report.fallbacks, 16);
        let direct = out.path().join(format!("{small}.mllm"));
        let small_report = convert_fixture("tiny-llama", &direct, &opts(small, None, None));
        assert_eq!(small_report.fallbacks, 0);
        let (a, b) = (
            MllmFile::open(&path).unwrap(),
            MllmFile::open(&direct).unwrap(),
        );
        for name in a.metadata().unwrap().tensors.keys() {
            let (ta, tb) = (a.tensor(name).unwrap(), b.tensor(name).unwrap());
            assert_eq!(ta.dtype(), tb.dtype(), "{name}");
            assert_eq!(ta.bytes(), tb.bytes(), "{name}");
        }
    }
}

/// GPT-2: `mlp.c_proj` is transposed to rows of 256 and takes q4_k; the other
/// matrices fall back to q4_1; the position table is f16 (the op reads floats).
#[test]
fn gpt2_q4_k_transposed_rows_and_position_table() {
    let src = source("tiny-gpt2");
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("gpt2.mllm");
    let report = convert_fixture("tiny-gpt2", &path, &opts(DType::Q4K, None, None));
    let file = MllmFile::open(&path).unwrap();
    let mut k_quant = 0;
    for (name, (shape, data)) in &src {
        let t = file.tensor(name).unwrap();
        let dtype = t.dtype();
        if is_vector(shape) {
            assert_eq!(dtype, DType::F32, "{name}");
        } else if name == "transformer.wpe.weight" {
            assert_eq!(dtype, DType::F16, "{name}");
        } else if name.ends_with(".mlp.c_proj.weight") {
            k_quant += 1;
            assert_eq!(t.shape().dims(), [64, 256]);
            // Stored [out, in]: the source's columns become rows.
            let (rows, cols) = (shape[0], shape[1]);
            let transposed: Vec<f32> = (0..cols)
                .flat_map(|c| (0..rows).map(move |r| (r, c)))
                .map(|(r, c)| data[r * cols + c])
                .collect();
            assert_eq!(dtype, DType::Q4K, "{name}");
            assert_eq!(t.bytes(), quantize(DType::Q4K, &transposed).unwrap());
        } else {
            assert_eq!(dtype, DType::Q4_1, "{name}");
        }
    }
    assert_eq!(k_quant, 2);
    // Every matrix but the two c_proj of the MLPs and the position table.
    let matrices = src.values().filter(|(s, _)| !is_vector(s)).count();
    assert_eq!(report.fallbacks, matrices - 3);
}

#[test]
fn quantize_file_equals_direct_conversion() {
    let out = tempfile::tempdir().unwrap();
    let cases = [
        ("tiny-llama", opts(DType::Q4_0, None, None)),
        (
            "tiny-llama",
            opts(DType::Q8_0, Some(DType::F16), Some(DType::Q6K)),
        ),
        ("tiny-gpt2", opts(DType::Q4K, Some(DType::Q8_0), None)),
        ("tiny-qwen2", opts(DType::BF16, None, None)),
    ];
    for (model, o) in cases {
        let f32_path = out.path().join("f32.mllm");
        convert(&fixture(model), &f32_path, &ConvertOptions::default()).unwrap();
        let direct = out.path().join("direct.mllm");
        let direct_report = convert_fixture(model, &direct, &o);
        let requantized = out.path().join("requantized.mllm");
        let report = quantize_file(&f32_path, &requantized, &o).unwrap();
        assert_eq!(report.tensors, direct_report.tensors, "{model}");
        assert_eq!(report.fallbacks, direct_report.fallbacks, "{model}");
        assert_eq!(report.bytes_written, direct_report.bytes_written, "{model}");
        assert_eq!(
            std::fs::read(&requantized).unwrap(),
            std::fs::read(&direct).unwrap(),
            "{model} {:?}",
            o.policy
        );
    }
}

/// A copy of tiny-llama with a tokenizer and a chat template.
fn llama_with_tokenizer() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture("tiny-llama")).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    let tokenizer = r#"{"version":"1.0","model":{"type":"BPE","vocab":{},"merges":[]}}"#;
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer).unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), "{{ messages }}").unwrap();
    dir
}

#[test]
fn requantizing_q8_0_to_q4_0_keeps_metadata() {
    let model = llama_with_tokenizer();
    let out = tempfile::tempdir().unwrap();
    let q8 = out.path().join("q8_0.mllm");
    convert_with_policy(model.path(), &q8, &opts(DType::Q8_0, None, None)).unwrap();
    let q4 = out.path().join("q4_0.mllm");
    let report = quantize_file(&q8, &q4, &opts(DType::Q4_0, None, None)).unwrap();
    assert_eq!(report.architecture, "LlamaForCausalLM");
    assert!(report.tokenizer && report.chat_template);
    assert_eq!(
        (report.tensors, report.skipped, report.fallbacks),
        (21, 0, 0)
    );

    let (a, b) = (MllmFile::open(&q8).unwrap(), MllmFile::open(&q4).unwrap());
    assert_eq!(a.metadata(), b.metadata());
    assert_eq!(a.tokenizer_json().unwrap(), b.tokenizer_json().unwrap());
    assert_eq!(b.chat_template().unwrap(), Some("{{ messages }}"));
    for name in a.metadata().unwrap().tensors.keys() {
        let (ta, tb) = (a.tensor(name).unwrap(), b.tensor(name).unwrap());
        if ta.dtype() == DType::F32 {
            assert_eq!(tb.dtype(), DType::F32, "{name}");
            assert_eq!(ta.bytes(), tb.bytes(), "{name}");
        } else {
            assert_eq!((ta.dtype(), tb.dtype()), (DType::Q8_0, DType::Q4_0));
            let expected = quantize(DType::Q4_0, &values(&a, name)).unwrap();
            assert_eq!(tb.bytes(), &expected[..], "{name}");
        }
    }

    // Same types: tensors are copied, so the file is unchanged; and the
    // output may be the input.
    let again = out.path().join("again.mllm");
    quantize_file(&q8, &again, &opts(DType::Q8_0, None, None)).unwrap();
    assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(&q8).unwrap());
    quantize_file(&again, &again, &opts(DType::Q4_0, None, None)).unwrap();
    assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(&q4).unwrap());
}

/// A metadata file with one [4, 48] matrix (rows not a multiple of 32) and a vector.
fn odd_rows_file(path: &Path) -> Vec<f32> {
    let matrix: Vec<f32> = (0..4 * 48).map(|i| (i as f32 - 96.0) / 64.0).collect();
    let mut writer = MllmWriter::new();
    writer.metadata(Metadata::new("TestOnly", serde_json::json!({})));
    writer
        .add_tensor(TensorSpec::new("w", DType::F32, vec![4, 48]))
        .unwrap();
    writer
        .add_tensor(TensorSpec::new("b", DType::F32, vec![4]))
        .unwrap();
    let bytes = [f32_bytes(&matrix), f32_bytes(&[1.0, 2.0, 3.0, 4.0])];
    writer
        .write(path, |i, _| Ok(Cow::Owned(bytes[i].clone())))
        .unwrap();
    matrix
}

#[test]
fn rows_that_are_not_blocks_fall_back_to_f16() {
    let out = tempfile::tempdir().unwrap();
    let input = out.path().join("odd.mllm");
    let matrix = odd_rows_file(&input);
    for dtype in [DType::Q8_0, DType::Q4K] {
        let path = out.path().join(format!("{dtype}.mllm"));
        let report = quantize_file(&input, &path, &opts(dtype, None, None)).unwrap();
        assert_eq!((report.tensors, report.fallbacks), (2, 1));
        assert_eq!(report.architecture, "TestOnly");
        let file = MllmFile::open(&path).unwrap();
        let w = file.tensor("w").unwrap();
        assert_eq!(w.dtype(), DType::F16);
        let expected: Vec<u8> = matrix
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        assert_eq!(w.bytes(), &expected[..]);
        assert_eq!(file.tensor("b").unwrap().dtype(), DType::F32);
    }
}

#[test]
fn bad_input_gives_clear_errors() {
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("out.mllm");
    let q = opts(DType::Q8_0, None, None);

    // A plain v1 file: no shapes.
    let plain = out.path().join("plain.mllm");
    let mut writer = MllmWriter::new();
    writer
        .add_tensor(TensorSpec::new("w", DType::F32, vec![2, 32]))
        .unwrap();
    writer
        .write(&plain, |_, _| Ok(Cow::Owned(vec![0u8; 256])))
        .unwrap();
    let err = quantize_file(&plain, &dest, &q).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "invalid input: {} is a plain mllm v1 file without metadata: requantizing needs the \
             tensor shapes that only files written by mllm-rs record",
            plain.display()
        )
    );

    // A missing file, a file that is not .mllm, dtypes that are not targets.
    let missing = out.path().join("missing.mllm");
    let err = quantize_file(&missing, &dest, &q).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    let err = quantize_file(&fixture("tiny-llama").join("config.json"), &dest, &q).unwrap_err();
    assert!(matches!(err, Error::BadMagic { .. }), "{err}");
    assert_eq!(
        parse_target_dtype("q7_k").unwrap_err().to_string(),
        "invalid input: unknown dtype 'q7_k'; use f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k or iq4_xs"
    );
    let f32_path = out.path().join("f32.mllm");
    convert(
        &fixture("tiny-llama"),
        &f32_path,
        &ConvertOptions::default(),
    )
    .unwrap();
    let err = quantize_file(&f32_path, &dest, &opts(DType::Q8_1, None, None)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "q8_1 is not a conversion target; use f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k or iq4_xs"
    );
    let err =
        quantize_file(&f32_path, &dest, &opts(DType::Q8_0, Some(DType::I8), None)).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("embedding dtype: i8 is not a conversion target"),
        "{err}"
    );
    assert!(!dest.exists());
}

#[test]
fn non_finite_weights_name_the_tensor() {
    let bytes = std::fs::read(fixture("tiny-llama").join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = st.tensors();
    let (shape, mut values) = source("tiny-llama")["lm_head.weight"].clone();
    values[3 * 64 + 5] = f32::NAN;
    let poisoned = f32_bytes(&values);
    for (name, view) in tensors.iter_mut() {
        if name == "lm_head.weight" {
            *view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                shape.clone(),
                &poisoned,
            )
            .unwrap();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("tiny-llama").join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("model.safetensors"),
        safetensors::serialize(tensors, None).unwrap(),
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let err = convert_with_policy(
        dir.path(),
        &out.path().join("a.mllm"),
        &opts(DType::Q4_1, None, None),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid input: tensor 'lm_head.weight': value NaN at row 3, column 5 cannot be stored as \
         q4_1: it is not finite or outside the f16 range of the block scales"
    );
    assert!(std::fs::read_dir(out.path()).unwrap().next().is_none());
    // Float targets store it as it is.
    convert_with_policy(
        dir.path(),
        &out.path().join("a.mllm"),
        &opts(DType::F16, None, None),
    )
    .unwrap();
}

#[test]
fn gguf_input_refuses_role_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("m.gguf");
    std::fs::write(&input, b"GGUF").unwrap();
    let err = convert_with_policy(
        &input,
        &dir.path().join("m.mllm"),
        &opts(DType::F32, Some(DType::Q8_0), None),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("embedding and head dtypes do not apply to GGUF input"),
        "{err}"
    );
}

#[test]
fn binary_quantizes_and_fails_cleanly() {
    let exe = env!("CARGO_BIN_EXE_mllm-convert");
    let out = tempfile::tempdir().unwrap();
    let f32_path = out.path().join("f32.mllm");
    convert(
        &fixture("tiny-llama"),
        &f32_path,
        &ConvertOptions::default(),
    )
    .unwrap();
    let run = |args: &[&str]| Command::new(exe).args(args).output().unwrap();
    let path = |name: &str| out.path().join(name).to_str().unwrap().to_string();

    let ok = run(&[
        "quantize",
        &path("f32.mllm"),
        &path("q4_k.mllm"),
        "--dtype",
        "q4_k",
        "-q",
    ]);
    assert!(ok.status.success(), "{ok:?}");
    let stdout = String::from_utf8(ok.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        stdout.starts_with("wrote 21 tensors (LlamaForCausalLM, q4_k) to ")
            && stdout.contains("q4_k.mllm: ")
            && stdout
                .trim_end()
                .ends_with("; 16 stored in a fallback dtype (rows not whole blocks)"),
        "{stdout}"
    );

    // Converting with role flags gives the file quantize_file gives.
    let fixture_dir = fixture("tiny-llama");
    let ok = run(&[
        fixture_dir.to_str().unwrap(),
        "-o",
        &path("cli.mllm"),
        "--dtype",
        "q4_0",
        "--embed-dtype",
        "q8_0",
        "--head-dtype",
        "f16",
        "--quiet",
    ]);
    assert!(ok.status.success(), "{ok:?}");
    let stdout = String::from_utf8(ok.stdout).unwrap();
    assert!(stdout.contains("(LlamaForCausalLM, q4_0)"), "{stdout}");
    assert!(!stdout.contains("fallback"), "{stdout}");
    quantize_file(
        &f32_path,
        &out.path().join("lib.mllm"),
        &opts(DType::Q4_0, Some(DType::Q8_0), Some(DType::F16)),
    )
    .unwrap();
    assert_eq!(
        std::fs::read(path("cli.mllm")).unwrap(),
        std::fs::read(path("lib.mllm")).unwrap()
    );

    let fail = |args: &[&str], expected: &str| {
        let r = run(args);
        assert_eq!(r.status.code(), Some(1), "{args:?}: {r:?}");
        let stderr = String::from_utf8(r.stderr).unwrap();
        assert!(stderr.starts_with("error:"), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    };
    std::fs::write(
        path("plain.mllm"),
        [0x2c, 0x4e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    )
    .unwrap();
    let dest = path("x.mllm");
    fail(
        &["quantize", &path("plain.mllm"), &dest, "--dtype", "q8_0"],
        "plain mllm v1 file without metadata",
    );
    fail(
        &["quantize", &path("f32.mllm"), &dest, "--dtype", "q8_k"],
        "q8_k is not a conversion target",
    );
    fail(
        &[
            "quantize",
            &path("f32.mllm"),
            &dest,
            "--dtype",
            "q8_0",
            "--head-dtype",
            "int4",
        ],
        "unknown dtype 'int4'",
    );
    fail(
        &["quantize", &path("missing.mllm"), &dest, "--dtype", "q8_0"],
        "missing.mllm",
    );
    fail(&["quantize", &path("f32.mllm"), &dest], "--dtype");
    assert!(!out.path().join("x.mllm").exists());
}
