//! Generation loop behaviour: stopping rules, streaming callbacks, seeded
//! sampling, and the tokenizer embedded in a converted file.

mod common;

use common::*;
use mllm::core::DType;
use mllm::core::{LogitsMode, SeqChunk, StepInput};
use mllm::models::{
    generate, prefill, prefill_batch, GenerateOptions, LoadOptions, Model, SamplingParams,
    StopReason,
};

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

/// The tiny Llama in f32 with its context cut to `max_context`, on one
/// thread (the converted file lives as long as the first value).
fn tiny_llama_with_context(max_context: usize) -> (Converted, Model) {
    let c = convert_to(&fixture("tiny-llama"), DType::F32);
    let opts = LoadOptions {
        max_context: Some(max_context),
        threads: 1,
        ..Default::default()
    };
    let model = Model::load(&c.path, &opts).unwrap();
    (c, model)
}

#[test]
fn stops_when_the_context_is_full() {
    let (_c, mut model) = tiny_llama_with_context(20);
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

/// Logits of `ids` prefilled into a fresh slot 0 in steps of `step_tokens`
/// (`All`: every row), then of one decode step after them (which reads
/// the cache the prefill left).
fn prefilled(model: &mut Model, ids: &[u32], step_tokens: usize) -> (Vec<f32>, Vec<f32>) {
    model.reset_slot(0);
    let rows = prefill(model, 0, ids, LogitsMode::All, step_tokens).unwrap();
    assert_eq!(rows.rows(), ids.len());
    let next = model
        .step(&StepInput::single(0, vec![ids[0]], LogitsMode::Last))
        .unwrap();
    (rows.data().to_vec(), next.data().to_vec())
}

#[test]
fn a_prefill_in_steps_equals_one_step() {
    let ids: Vec<u32> = (0..45u32).map(|i| (i * 37 + 11) % 256).collect();
    for dtype in [DType::F32, DType::Q4_0, DType::Q8_0] {
        let c = convert_to(&fixture("tiny-llama"), dtype);
        let mut model = load(&c.path);
        let whole = prefilled(&mut model, &ids, ids.len());
        for step_tokens in [2, 3, 7, 16, 44] {
            let steps = prefilled(&mut model, &ids, step_tokens);
            assert!(
                steps == whole,
                "{dtype:?}: a prefill in steps of {step_tokens} differs from one step"
            );
        }
        model.reset_slot(0);
        let last = prefill(&mut model, 0, &ids, LogitsMode::Last, 16).unwrap();
        assert_eq!(last.rows(), 1);
        assert!(last.data() == &whole.0[(ids.len() - 1) * last.data().len()..]);
    }
}

#[test]
fn a_prefill_over_the_context_fails_before_any_step() {
    let (_c, mut model) = tiny_llama_with_context(20);
    let ids: Vec<u32> = (0..25).collect();
    let err = prefill(&mut model, 0, &ids, LogitsMode::Last, 5).unwrap_err();
    assert_eq!(
        err.to_string(),
        "context full: sequence 0 needs 25 positions but the context holds 20"
    );
    assert_eq!(model.slot_len(0), 0, "no step ran");
    let err = prefill(&mut model, 0, &[], LogitsMode::Last, 5).unwrap_err();
    assert_eq!(err.to_string(), "invalid input: the prompt is empty");
    let err = prefill(&mut model, 0, &ids[..3], LogitsMode::Last, 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid input: a prefill step must take at least two tokens, not 1"
    );
}

/// Prompts of 45, 1, 13, 2, 30 and 1 tokens in slots 0 to 5.
fn batch_prompts() -> Vec<SeqChunk> {
    [45u32, 1, 13, 2, 30, 1]
        .iter()
        .enumerate()
        .map(|(slot, &n)| SeqChunk {
            slot,
            tokens: (0..n)
                .map(|i| (i * 37 + 11 * slot as u32 + 5) % 256)
                .collect(),
        })
        .collect()
}

/// The last logits of each of `prompts` prefilled together into fresh
/// slots in steps of `step_tokens`, then those of one decode step of all
/// of them (which reads the caches the prefill left).
fn batch_prefilled(
    model: &mut Model,
    prompts: &[SeqChunk],
    step_tokens: usize,
) -> (Vec<f32>, Vec<f32>) {
    for p in prompts {
        model.reset_slot(p.slot);
    }
    let last = prefill_batch(model, prompts, step_tokens).unwrap();
    assert_eq!(last.rows(), prompts.len());
    let chunks = prompts
        .iter()
        .map(|p| SeqChunk {
            slot: p.slot,
            tokens: vec![7],
        })
        .collect();
    let next = model
        .step(&StepInput {
            chunks,
            logits: LogitsMode::Last,
        })
        .unwrap();
    (last.data().to_vec(), next.data().to_vec())
}

#[test]
fn a_batch_prefill_in_steps_equals_one_step() {
    let prompts = batch_prompts();
    let cases = [
        (DType::F32, None),
        (DType::Q4_0, None),
        (DType::Q8_0, None),
        (DType::Q4_0, Some(QuantPath::Int8Packed)),
    ];
    for (dtype, path) in cases {
        let c = convert_to(&fixture("tiny-llama"), dtype);
        let mut model = load_with(&c.path, path);
        let whole = batch_prefilled(&mut model, &prompts, usize::MAX);
        for step_tokens in [2, 3, 7, 16, 44] {
            let steps = batch_prefilled(&mut model, &prompts, step_tokens);
            assert!(
                steps == whole,
                "{dtype:?} {path:?}: a batch prefill in steps of {step_tokens} differs from one step"
            );
        }
        // Each prompt alone gives its row's bits.
        let vocab = model.vocab_size();
        for (row, p) in prompts.iter().enumerate() {
            model.reset_slot(p.slot);
            let alone = prefill(&mut model, p.slot, &p.tokens, LogitsMode::Last, 16).unwrap();
            assert!(
                alone.data() == &whole.0[row * vocab..(row + 1) * vocab],
                "{dtype:?} {path:?}: slot {} alone differs from the batch",
                p.slot
            );
        }
    }
}

#[test]
fn a_bad_batch_prefill_fails_before_any_step() {
    let (_c, mut model) = tiny_llama_with_context(20);
    let chunk = |slot, n: u32| SeqChunk {
        slot,
        tokens: (0..n).collect(),
    };
    let err = prefill_batch(&mut model, &[chunk(0, 5), chunk(1, 21)], 4).unwrap_err();
    assert_eq!(
        err.to_string(),
        "context full: sequence 1 needs 21 positions but the context holds 20"
    );
    let err = prefill_batch(&mut model, &[chunk(0, 5), chunk(1, 0)], 4).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid input: the prompt in slot 1 is empty"
    );
    let err = prefill_batch(&mut model, &[chunk(2, 5), chunk(2, 3)], 4).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid input: slot 2 is given two prompts"
    );
    let err = prefill_batch(&mut model, &[chunk(0, 5)], 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid input: a prefill step must take at least two tokens, not 1"
    );
    for slot in 0..3 {
        assert_eq!(model.slot_len(slot), 0, "no step ran");
    }
    let none = prefill_batch(&mut model, &[], 4).unwrap();
    assert_eq!(none.shape().dims(), [0, model.vocab_size()]);
}
