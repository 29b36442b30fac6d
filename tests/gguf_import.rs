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

#[test]
fn f32_llama_gguf_matches_transformers() {
    let (_c, mut model) = import("tiny-llama.f32.gguf");
    let reference = Reference::load("tiny-llama");
    for (input, array) in [("short", "logits_short"), ("long", "logits_long")] {
        let ids = reference.ids(&format!("/inputs/{input}"));
        let got = prompt_logits(&mut model, &ids).data().to_vec();
        assert_close(
            &format!("gguf {input}"),
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
    assert_eq!(out.tokens, want);
}

/// gguf-py's Q8_0 quantizer and the converter's round the same way, so the
/// imported Q8_0 file and the fixture converted to Q8_0 compute the same
/// logits (the converter's Q8_0 is held to the reference in
/// `tests/quantized_models.rs`).
#[test]
fn q8_0_llama_gguf_equals_the_model_quantized_by_the_converter() {
    let (_g, mut imported) = import("tiny-llama.q8_0.gguf");
    let (_c, mut converted) = {
        let c = convert_to(&fixture("tiny-llama"), DType::Q8_0);
        let m = load(&c.path);
        (c, m)
    };
    let reference = Reference::load("tiny-llama");
    let ids = reference.ids("/inputs/long");
    let a = prompt_logits(&mut imported, &ids);
    let b = prompt_logits(&mut converted, &ids);
    assert_close("q8_0 gguf vs converter", a.data(), b.data(), 1e-5);
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
