//! GGUF files written the way llama.cpp's converter writes them
//! (`scripts/make_gguf_fixtures.py`, gguf-py): imported, they must give
//! the Hugging Face reference's logits and ids, and their tokenizer must
//! be the byte-level BPE their metadata describes.

mod common;

use common::*;
use mllm::convert::{convert, ConvertOptions};
use mllm::core::DType;
use mllm::models::{generate, GenerateOptions, Model};

const TOL: f32 = 1e-4;

fn gguf_fixture(file: &str) -> std::path::PathBuf {
    fixture("gguf").join(file)
}

/// Imports a GGUF fixture into a temporary `.mllm` and loads it.
fn import(file: &str) -> (Converted, Model) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.mllm");
    convert(&gguf_fixture(file), &path, &ConvertOptions::default())
        .unwrap_or_else(|e| panic!("importing {file}: {e}"));
    let model = load(&path);
    (Converted { dir, path }, model)
}

/// The fixtures written as GGUF by the script, one per architecture.
const MODELS: [&str; 6] = [
    "tiny-llama",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-phi3",
    "tiny-gemma",
    "tiny-gpt2",
];

#[test]
fn f32_ggufs_match_transformers() {
    for name in MODELS {
        let (_c, mut model) = import(&format!("{name}.f32.gguf"));
        let reference = Reference::load(name);
        for (input, array) in [("short", "logits_short"), ("long", "logits_long")] {
            let ids = reference.ids(&format!("/inputs/{input}"));
            let got = prompt_logits(&mut model, &ids).data().to_vec();
            assert_close(
                &format!("{name} gguf {input}"),
                &got,
                &reference.array(array).data,
                TOL,
            );
        }
        let prompt = reference.ids("/greedy/short/prompt_ids");
        let want = reference.ids("/greedy/short/new_ids");
        let opts = GenerateOptions {
            max_tokens: want.len(),
            ..Default::default()
        };
        let out = generate(&mut model, &prompt, &opts, &mut |_| Ok(true)).unwrap();
        assert_eq!(out.tokens, want, "{name}");
    }
}

/// gguf-py's Q5_0 and Q5_1 quantizers and the converter's give the same
/// bytes (`mllm-ops/tests/quant_formats.rs`), so these imports also equal
/// the converter's files.
#[test]
fn q5_ggufs_equal_the_model_quantized_by_the_converter() {
    let ids = Reference::load("tiny-llama").ids("/inputs/long");
    for (file, dtype) in [("q5_0", DType::Q5_0), ("q5_1", DType::Q5_1)] {
        let (g, mut imported) = import(&format!("tiny-llama.{file}.gguf"));
        let file_types: Vec<DType> = {
            let f = mllm::core::file::MllmFile::open(&g.path).unwrap();
            ["model.layers.0.mlp.up_proj.weight", "lm_head.weight"]
                .map(|n| f.tensor(n).unwrap().dtype())
                .to_vec()
        };
        assert_eq!(file_types, [dtype, dtype]);
        let converted = convert_to(&fixture("tiny-llama"), dtype);
        let mut converted_model = load(&converted.path);
        let a = prompt_logits(&mut imported, &ids);
        let b = prompt_logits(&mut converted_model, &ids);
        assert_close(
            &format!("{file} gguf vs converter"),
            a.data(),
            b.data(),
            1e-5,
        );
    }
}

/// llama.cpp repeats GPT-2's token embedding as `output.weight`; the import
/// drops the copy and ties the head again.
#[test]
fn gpt2_output_copy_becomes_a_tied_head() {
    let (c, _) = import("tiny-gpt2.q8_0.gguf");
    let file = mllm::core::file::MllmFile::open(&c.path).unwrap();
    assert!(file.tensor("lm_head.weight").is_err());
    let wte = file.tensor("transformer.wte.weight").unwrap();
    assert_eq!(wte.dtype(), DType::Q8_0);
    let config = &file.metadata().unwrap().config;
    assert_eq!(config["tie_word_embeddings"], true);
    assert_eq!(config["n_inner"], 256);
}

/// gguf-py's Q8_0 quantizer and the converter's round the same way, so an
/// imported Q8_0 file and the fixture converted to Q8_0 compute the same
/// logits (the converter's Q8_0 is held to the reference in
/// `tests/quantized_models.rs`).
#[test]
fn q8_0_ggufs_equal_the_models_quantized_by_the_converter() {
    for name in MODELS {
        let (_g, mut imported) = import(&format!("{name}.q8_0.gguf"));
        let converted = convert_to(&fixture(name), DType::Q8_0);
        let mut converted_model = load(&converted.path);
        let ids = Reference::load(name).ids("/inputs/long");
        let a = prompt_logits(&mut imported, &ids);
        let b = prompt_logits(&mut converted_model, &ids);
        assert_close(
            &format!("{name} q8_0 gguf vs converter"),
            a.data(),
            b.data(),
            1e-5,
        );
    }
}

#[test]
fn tokenizer_merges_and_chat_template_come_from_the_metadata() {
    let (_c, model) = import("tiny-llama.q8_0.gguf");
    let tokenizer = model.tokenizer().expect("the GGUF has a vocabulary");
    // "the" merges h+e only; " the" goes Ġ+t, h+e, Ġt+he; "in" and "er" merge.
    let ids = tokenizer.encode("the winter", false).unwrap();
    assert_eq!(ids, [116, 251, 32, 119, 253, 116, 255]);
    assert_eq!(tokenizer.encode(" the", false).unwrap(), [252]);
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), "the winter");
    assert_eq!(model.eos_ids(), [2]);
    let rendered = model
        .chat_template_renderer()
        .unwrap()
        .render(&[mllm::models::chat::Message::user("hi")], true)
        .unwrap();
    assert_eq!(rendered, "<s>user\nhi</s>\n<s>assistant\n");
}

/// Texts and the ids llama.cpp (llama-cpp-python 0.3.36, vocabulary-only
/// load, no BOS, no special-token parsing) gives them with the fixture
/// vocabularies: SentencePiece (Gemma, no space prefix; `▁coming` is not
/// reachable by merges, `G`, `ü`, `ß` fall back to bytes) and byte-level
/// BPE with the `qwen2` and `smollm` pre-tokenizers.
const LLAMA_CPP_IDS: [(&str, &str, &[u32]); 9] = [
    (
        "tiny-gemma",
        "the winter is coming",
        &[39, 12, 11, 13, 39, 14, 6, 19, 22, 34, 32, 18],
    ),
    (
        "tiny-gemma",
        "The winter, is it coming?",
        &[
            135, 12, 11, 13, 39, 14, 46, 6, 19, 28, 39, 19, 22, 34, 32, 18, 49,
        ],
    ),
    ("tiny-gemma", "in an inn", &[13, 8, 33, 9, 33]),
    (
        "tiny-gemma",
        "Grüße!",
        &[122, 37, 246, 239, 246, 210, 24, 48],
    ),
    (
        "tiny-gemma",
        " leading  spaces",
        &[19, 31, 24, 20, 23, 18, 19, 19, 38, 35, 20, 22, 24, 38],
    ),
    ("tiny-gemma", "is\nis", &[17, 61, 17]),
    (
        "tiny-qwen2",
        "The winter, is it coming?",
        &[
            84, 251, 32, 119, 253, 116, 255, 44, 32, 105, 115, 32, 105, 116, 32, 99, 111, 109, 253,
            103, 63,
        ],
    ),
    (
        "tiny-qwen2",
        "Grüße!",
        &[71, 114, 195, 188, 195, 159, 101, 33],
    ),
    (
        "tiny-llama",
        " leading  spaces",
        &[
            32, 108, 101, 97, 100, 253, 103, 32, 32, 115, 112, 97, 99, 101, 115,
        ],
    ),
];

#[test]
fn rebuilt_tokenizers_encode_as_llama_cpp_does() {
    let mut models = std::collections::HashMap::new();
    for (name, text, want) in LLAMA_CPP_IDS {
        let (_, model) = models
            .entry(name)
            .or_insert_with(|| import(&format!("{name}.q8_0.gguf")));
        let tokenizer = model.tokenizer().expect("the GGUF has a vocabulary");
        assert_eq!(
            tokenizer.encode(text, false).unwrap(),
            want,
            "{name} {text:?}"
        );
        assert_eq!(
            tokenizer.decode(want, false).unwrap(),
            text,
            "{name} {want:?}"
        );
    }
    // SentencePiece vocabularies add BOS by default; byte-level BPE does not.
    let (_, gemma) = &models["tiny-gemma"];
    let with_bos = gemma.tokenizer().unwrap().encode("in", true).unwrap();
    assert_eq!(with_bos, [2, 13]);
    assert_eq!(gemma.eos_ids(), [1]);
    let (_, qwen2) = &models["tiny-qwen2"];
    assert_eq!(
        qwen2.tokenizer().unwrap().encode("in", true).unwrap(),
        [253]
    );
}
