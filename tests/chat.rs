//! Multi-turn chat on the tiny Llama with a word-level tokenizer and a small
//! template: later turns prefill only their new tokens, and the cached
//! conversation gives the same reply as a fresh run over the whole prompt.
//! Also the perplexity example against the reference logits.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use mllm::core::DType;
use mllm::models::chat::Message;
use mllm::models::conversation::Conversation;
use mllm::models::{generate, GenerateOptions, Model};

/// A word-level tokenizer: `<s>` = 1 and `</s>` = 2 are special, `user` = 3,
/// `assistant` = 4, and every other id `i` < 256 is the word `w{i}`.
fn word_tokenizer() -> String {
    let mut vocab = serde_json::Map::new();
    for i in 0..256u32 {
        let word = match i {
            1 => "<s>".to_string(),
            2 => "</s>".to_string(),
            3 => "user".to_string(),
            4 => "assistant".to_string(),
            _ => format!("w{i}"),
        };
        vocab.insert(word, i.into());
    }
    let special = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(1, "<s>"), special(2, "</s>")],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
    })
    .to_string()
}

const TEMPLATE: &str = "{% for m in messages %}{{ bos_token }}{{ m['role'] }} {{ m['content'] }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}{{ bos_token }}assistant{% endif %}";

/// tiny-llama with the word tokenizer and the template, converted.
fn chat_model(dir: &Path) -> Converted {
    let src = fixture("tiny-llama");
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("tokenizer.json"), word_tokenizer()).unwrap();
    let tokenizer_config = serde_json::json!({ "chat_template": TEMPLATE });
    std::fs::write(
        dir.join("tokenizer_config.json"),
        tokenizer_config.to_string(),
    )
    .unwrap();
    convert_to(dir, DType::F32)
}

fn opts() -> GenerateOptions {
    GenerateOptions {
        max_tokens: 6,
        eos_ids: vec![2],
        ..Default::default()
    }
}

#[test]
fn later_turns_reuse_the_cache_and_match_a_fresh_run() {
    let dir = tempfile::tempdir().unwrap();
    let c = chat_model(dir.path());
    let mut model = load(&c.path);
    let mut chat = Conversation::new(&model, 0).unwrap();

    let first = chat
        .reply(&mut model, "w10 w11 w12", &opts(), &mut |_| Ok(true))
        .unwrap();
    let first_prompt = model
        .require_tokenizer()
        .unwrap()
        .encode("<s>user w10 w11 w12</s><s>assistant", false)
        .unwrap();
    assert_eq!(first_prompt, vec![1, 3, 10, 11, 12, 2, 1, 4]);
    assert_eq!(first.prefilled, first_prompt.len());

    let second = chat
        .reply(&mut model, "w20 w21", &opts(), &mut |_| Ok(true))
        .unwrap();
    // Turn two renders turn one again; only what follows the cached part is new.
    let full = chat_prompt_ids(&model, &chat.messages()[..3]);
    assert!(
        second.prefilled < full.len(),
        "{} of {}",
        second.prefilled,
        full.len()
    );
    assert!(
        second.prefilled >= 5,
        "the new user message and generation prompt"
    );

    // A fresh model given the whole conversation replies the same way.
    let mut fresh = load(&c.path);
    let out = generate(&mut fresh, &full, &opts(), &mut |_| Ok(true)).unwrap();
    assert_eq!(out.tokens, second.generation.tokens);

    chat.reset(&mut model);
    assert!(chat.messages().is_empty());
    assert_eq!(model.slot_len(0), 0);
}

fn chat_prompt_ids(model: &Model, messages: &[Message]) -> Vec<u32> {
    let text = model
        .chat_template_renderer()
        .unwrap()
        .render(messages, true)
        .unwrap();
    model
        .require_tokenizer()
        .unwrap()
        .encode(&text, false)
        .unwrap()
}

#[test]
fn a_turn_over_the_context_is_refused_and_the_chat_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let c = chat_model(dir.path());
    let load_opts = mllm::models::LoadOptions {
        max_context: Some(12),
        threads: 1,
        ..Default::default()
    };
    let mut model = Model::load(&c.path, &load_opts).unwrap();
    let mut chat = Conversation::new(&model, 0).unwrap();
    let long = "w9 ".repeat(20);
    let err = chat
        .reply(&mut model, &long, &opts(), &mut |_| Ok(true))
        .unwrap_err();
    assert!(
        matches!(err, mllm::core::Error::ContextFull { limit: 12, .. }),
        "{err:?}"
    );
    assert!(chat.messages().is_empty());
    let turn = chat
        .reply(&mut model, "w5", &opts(), &mut |_| Ok(true))
        .unwrap();
    assert!(!turn.generation.tokens.is_empty());
}

#[test]
fn perplexity_matches_the_reference_logits() {
    let dir = tempfile::tempdir().unwrap();
    let c = chat_model(dir.path());
    let reference = Reference::load("tiny-llama");
    let ids = reference.ids("/inputs/long");
    // Ids 1..=4 are not plain words in this tokenizer; the long input has none.
    assert!(ids.iter().all(|&i| i > 4));
    let text: Vec<String> = ids.iter().map(|i| format!("w{i}")).collect();
    let text_path = dir.path().join("text.txt");
    std::fs::write(&text_path, text.join(" ")).unwrap();

    let logits = reference.array("logits_long");
    let mut nll = 0.0f64;
    for t in 0..ids.len() - 1 {
        let row = logits.row(t);
        let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
        let lse = max
            + row
                .iter()
                .map(|&l| (l as f64 - max).exp())
                .sum::<f64>()
                .ln();
        nll += lse - row[ids[t + 1] as usize] as f64;
    }
    let want = (nll / (ids.len() - 1) as f64).exp();

    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/perplexity");
    let stdout = stdout_of(
        Command::new(example)
            .args([
                "--model",
                c.path.to_str().unwrap(),
                "--file",
                text_path.to_str().unwrap(),
            ])
            .args(["--ctx", "40", "--threads", "2"]),
    );
    let got: f64 = stdout
        .trim()
        .strip_prefix("PPL = ")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (got - want).abs() / want < 1e-4,
        "PPL {got} vs reference {want}"
    );
}
