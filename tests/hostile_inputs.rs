//! Short, deterministic mutation campaigns (`mllm-mutate`) over the inputs
//! other than `.mllm` and GGUF files (those are in `hostile_files.rs` and
//! `mllm-convert/tests/gguf.rs`): Hugging Face safetensors weights, a
//! sharded checkpoint's index, and chat templates with the messages they
//! render. Each mutant goes as far as the program would take it (a
//! conversion that succeeds is loaded and run for a step; a template that
//! compiles is rendered); every outcome must be a value, never a panic.

mod common;

use std::path::Path;

use common::*;
use mllm::convert::{convert, ConvertOptions};
use mllm::core::{LogitsMode, StepInput};
use mllm::models::chat::{ChatTemplate, Message};
use mllm::models::{LoadOptions, Model};
use mllm_mutate::{campaign, Outcome};

/// Mutants per seed.
const MUTANTS: usize = 400;

/// Converts `input`, loads the result and runs one step.
fn convert_load_step(input: &Path, output: &Path) -> Outcome {
    if convert(input, output, &ConvertOptions::default()).is_err() {
        return Outcome::Refused;
    }
    let opts = LoadOptions {
        threads: 1,
        ..Default::default()
    };
    let Ok(mut model) = Model::load(output, &opts) else {
        return Outcome::Refused;
    };
    let vocab = model.vocab_size().max(1) as u32;
    let prompt = [1u32, 5, 9].map(|i| i % vocab).to_vec();
    match model.step(&StepInput::single(0, prompt, LogitsMode::Last)) {
        Ok(_) => Outcome::Ran,
        Err(_) => Outcome::Refused,
    }
}

/// A copy of a fixture model directory whose file `name` each mutant
/// replaces.
fn campaign_on_file(model: &str, name: &str, input: &str, rng_seed: u64) -> mllm_mutate::Tally {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture(model);
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let target = dir.path().join(name);
    let seed = std::fs::read(&target).unwrap();
    let output = dir.path().join("out.mllm");
    let input = dir.path().join(input);
    campaign(&seed, MUTANTS, rng_seed, |mutant| {
        std::fs::write(&target, mutant).unwrap();
        convert_load_step(&input, &output)
    })
}

#[test]
fn mutated_safetensors_weights_never_panic() {
    for (model, seed) in [("tiny-llama", 0x5AFE_0001), ("tiny-gpt2", 0x5AFE_0002)] {
        let t = campaign_on_file(model, "model.safetensors", "model.safetensors", seed);
        assert_eq!(t.ran + t.refused, MUTANTS);
        assert!(t.ran > 0 && t.refused > 0, "{model}: {t:?}");
    }
}

#[test]
fn mutated_shard_indexes_and_shards_never_panic() {
    let index = "model.safetensors.index.json";
    for (name, seed) in [
        (index, 0x5AFE_0003),
        ("model-00002-of-00002.safetensors", 0x5AFE_0004),
    ] {
        let t = campaign_on_file("tiny-llama/sharded", name, index, seed);
        assert_eq!(t.ran + t.refused, MUTANTS);
        assert!(t.refused > 0, "{name}: {t:?}");
    }
}

/// Chat templates in the styles models ship (ChatML with a default system
/// prompt, Llama 2 with `raise_exception`, Gemma with loop controls), and
/// the messages rendered with them, separated by a NUL byte.
const TEMPLATE_SEEDS: [&str; 3] = [
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are helpful<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}\0[{\"role\":\"user\",\"content\":\"Hi\"}]",
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('roles must alternate') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'].strip() + ' [/INST]' }}{% else %}{{ ' ' + message['content'].strip() + eos_token }}{% endif %}{% endfor %}\0[{\"role\":\"user\",\"content\":\" a \"},{\"role\":\"assistant\",\"content\":\"b\"}]",
    "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n{{ m.content | trim }}<end_of_turn>\n{% if loop.index > 8 %}{% break %}{% endif %}{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}\0[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"é ü\"}]",
];

/// Compiles the template before the first NUL byte and renders the
/// messages after it (or one user message when they do not parse).
fn render_template(input: &[u8]) -> Outcome {
    let (source, messages) = match input.iter().position(|&b| b == 0) {
        Some(at) => (&input[..at], &input[at + 1..]),
        None => (input, &b""[..]),
    };
    let messages: Vec<Message> = serde_json::from_slice::<Vec<serde_json::Value>>(messages)
        .ok()
        .map(|list| {
            list.iter()
                .map(|m| {
                    let field = |k: &str| m.get(k).and_then(|v| v.as_str()).unwrap_or("");
                    Message::new(field("role"), field("content"))
                })
                .collect()
        })
        .unwrap_or_else(|| vec![Message::user("hello")]);
    let Ok(template) = ChatTemplate::new(&String::from_utf8_lossy(source), "<s>", "</s>") else {
        return Outcome::Refused;
    };
    let a = template.render(&messages, true);
    let b = template.render(&messages, false);
    if a.is_ok() && b.is_ok() {
        Outcome::Ran
    } else {
        Outcome::Refused
    }
}

#[test]
fn mutated_chat_templates_and_messages_never_panic() {
    for (i, seed) in TEMPLATE_SEEDS.iter().enumerate() {
        assert_eq!(render_template(seed.as_bytes()), Outcome::Ran, "seed {i}");
        let t = campaign(
            seed.as_bytes(),
            2000,
            0x7E3F_0000 + i as u64,
            render_template,
        );
        assert!(t.ran > 0 && t.refused > 0, "seed {i}: {t:?}");
    }
}

/// Found by probing: nested loops of 10^10 iterations hung the renderer
/// (a model file's template could stop the server). Rendering now runs on
/// a fuel budget and a bounded output, and each of these fails quickly
/// with an error naming the cause.
#[test]
fn hostile_templates_fail_quickly_instead_of_hanging_or_exhausting_memory() {
    let cases = [
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "fuel",
        ),
        ("{{ 'a' * 1000000000 }}", "repeated string is too large"),
        (
            "{% for i in range(100000000) %}x{% endfor %}",
            "range has too many elements",
        ),
        (
            "{% for i in range(100) %}{{ 'a' * 99000000 }}{% endfor %}",
            "rendered prompt is over",
        ),
        (
            "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
            "recursion",
        ),
    ];
    for (source, cause) in cases {
        let started = std::time::Instant::now();
        let err = ChatTemplate::new(source, "", "")
            .and_then(|t| t.render(&[Message::user("x")], true))
            .unwrap_err()
            .to_string();
        assert!(err.contains(cause), "{source}: {err}");
        assert!(started.elapsed().as_secs() < 10, "{source}");
    }
    // A long conversation is well within the budget.
    let long: Vec<Message> = (0..5000)
        .map(|i| Message::user(format!("message {i}")))
        .collect();
    let text = ChatTemplate::new(TEMPLATE_SEEDS[0].split('\0').next().unwrap(), "", "")
        .and_then(|t| t.render(&long, true))
        .unwrap();
    assert!(text.contains("message 4999"));
}
