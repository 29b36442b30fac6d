//! Generation loop behaviour: stopping rules, streaming callbacks, seeded
//! sampling, and the tokenizer embedded in a converted file.

mod common;

use common::*;
use mllm::core::DType;
use mllm::models::{generate, GenerateOptions, LoadOptions, Model, SamplingParams, StopReason};

fn reference_run() -> (Vec<u32>, Vec<u32>) {
    let r = Reference::load("tiny-llama");
    (
        r.ids("/greedy/short/prompt_ids"),
        r.ids("/greedy/short/new_ids"),
    )
}

#[test]
fn stops_at_eos_and_keeps_it() {
    let (_c, mut model) = load_fixture("tiny-llama");
    let (prompt, want) = reference_run();
    let eos = want[5];
    let first = want.iter().position(|&t| t == eos).unwrap();
    let opts = GenerateOptions {
        max_tokens: 20,
        eos_ids: vec![eos],
        ..Default::default()
    };
    let out = generate(&mut model, &prompt, &opts, &mut |_| Ok(true)).unwrap();
    assert_eq!(out.stop, StopReason::Eos);
    assert_eq!(out.tokens, want[..=first]);
}

#[test]
fn streams_every_token_and_stops_when_asked() {
    let (_c, mut model) = load_fixture("tiny-llama");
    let (prompt, want) = reference_run();
    let mut seen = Vec::new();
    let opts = GenerateOptions {
        max_tokens: 20,
        ..Default::default()
    };
    let out = generate(&mut model, &prompt, &opts, &mut |id| {
        seen.push(id);
        Ok(seen.len() < 3)
    })
    .unwrap();
    assert_eq!(out.stop, StopReason::Callback);
    assert_eq!(seen, want[..3]);
    assert_eq!(out.tokens, want[..3]);

    let out = generate(&mut model, &prompt, &opts, &mut |_| Ok(true)).unwrap();
    assert_eq!(out.stop, StopReason::MaxTokens);
    assert_eq!(out.tokens, want);
}

#[test]
fn stops_when_the_context_is_full() {
    let c = convert_to(&fixture("tiny-llama"), DType::F32);
    let opts = LoadOptions {
        max_context: Some(20),
        threads: 1,
        ..Default::default()
    };
    let mut model = Model::load(&c.path, &opts).unwrap();
    let (prompt, want) = reference_run();
    let gen = GenerateOptions {
        max_tokens: 50,
        ..Default::default()
    };
    let out = generate(&mut model, &prompt, &gen, &mut |_| Ok(true)).unwrap();
    assert_eq!(out.stop, StopReason::ContextFull);
    // 12 prompt tokens + 8 fed back fill 20 positions; the 9th token is
    // chosen from the last position's logits.
    assert_eq!(out.tokens, want[..9]);
}

#[test]
fn seeded_sampling_is_reproducible() {
    let (_c, mut model) = load_fixture("tiny-llama");
    let (prompt, want) = reference_run();
    let sample = |model: &mut Model, seed: u64| {
        let opts = GenerateOptions {
            max_tokens: 30,
            sampling: SamplingParams {
                temperature: 1.5,
                top_k: 50,
                top_p: 0.95,
                min_p: 0.01,
                repetition_penalty: 1.1,
                seed,
            },
            ..Default::default()
        };
        generate(model, &prompt, &opts, &mut |_| Ok(true))
            .unwrap()
            .tokens
    };
    let a = sample(&mut model, 7);
    assert_eq!(a, sample(&mut model, 7));
    assert_ne!(a, sample(&mut model, 8));
    assert_ne!(
        a[..20],
        want[..],
        "hot sampling should leave the greedy path"
    );
    assert!(a.iter().all(|&t| t < 256));
}

const WORD_TOKENIZER: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
  "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
  "decoder": null,
  "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "hello": 17, "big": 200, "world": 33}, "unk_token": "<unk>"}
}"#;

#[test]
fn embedded_tokenizer_encodes_prompts() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("tiny-llama");
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(dir.path().join("tokenizer.json"), WORD_TOKENIZER).unwrap();
    let c = convert_to(dir.path(), DType::F32);
    let mut model = load(&c.path);
    let tok = model.require_tokenizer().unwrap();
    let ids = tok.encode("hello big world", false).unwrap();
    assert_eq!(ids, vec![17, 200, 33]);
    assert_eq!(tok.decode(&[17, 33], false).unwrap(), "hello world");
    let out = generate(&mut model, &ids, &GenerateOptions::default(), &mut |_| {
        Ok(true)
    })
    .unwrap();
    assert_eq!(out.tokens.len(), 32);
}
