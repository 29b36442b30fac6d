//! Short, deterministic mutation campaigns (`mllm-mutate`) over the inputs
//! other than model files (`.mllm` and GGUF files are in
//! `hostile_files.rs`): Hugging Face safetensors weights, a sharded
//! checkpoint's index, the vocabulary of a GGUF file, chat templates with
//! the messages they render, and server request bodies. Each mutant goes
//! as far as the program would take it (a conversion that succeeds is
//! loaded and run for a step; a template that compiles is rendered; a
//! request that passes the checks must be one the engine can run); every
//! outcome must be a value, never a panic.

mod common;

use common::*;
use mllm::models::chat::{ChatTemplate, Message};
use mllm_fuzz::{
    chat_template, gguf_tokenizer, request_facts, server_request, Outcome, SHARDED_FILES,
};
use mllm_mutate::campaign;

/// Mutants per seed.
const MUTANTS: usize = 400;

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
        mllm_fuzz::convertible(&input, &output)
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

#[test]
fn sharded_checkpoint_harness_replaces_the_file_its_first_byte_picks() {
    let shards = fixture("tiny-llama/sharded");
    let run = |input: &[u8]| {
        let work = tempfile::tempdir().unwrap();
        mllm_fuzz::sharded_checkpoint(work.path(), input)
    };
    for (pick, name) in SHARDED_FILES.iter().enumerate() {
        let original = std::fs::read(shards.join(name)).unwrap();
        for first in [pick as u8, pick as u8 + 3] {
            let seed = [&[first][..], &original].concat();
            assert_eq!(run(&seed), Outcome::Ran, "{name} as itself");
        }
        let cut = [&[pick as u8][..], &original[..original.len() / 2]].concat();
        assert_eq!(run(&cut), Outcome::Refused, "{name} cut in half");
    }
    assert_eq!(run(b""), Outcome::Refused);
}

/// The seed files in `tests/fixtures/<dir>` (also the fuzzer's seeds), as
/// (file name, bytes), sorted by name.
fn seed_files(dir: &str) -> Vec<(String, Vec<u8>)> {
    let mut seeds: Vec<_> = std::fs::read_dir(fixture(dir))
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    seeds.sort();
    seeds
}

#[test]
fn mutated_chat_templates_and_messages_never_panic() {
    // Chat templates in the styles models ship (ChatML with a default
    // system prompt, Llama 2 with `raise_exception`, Gemma with loop
    // controls), each followed by a NUL byte and the messages to render.
    let seeds = seed_files("chat_templates");
    assert_eq!(seeds.len(), 3);
    for (i, (name, seed)) in seeds.iter().enumerate() {
        assert_eq!(chat_template(seed), Outcome::Ran, "{name}");
        let t = campaign(seed, 2000, 0x7E3F_0000 + i as u64, chat_template);
        assert!(t.ran > 0 && t.refused > 0, "{name}: {t:?}");
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
    let chatml = std::fs::read_to_string(fixture("chat_templates/chatml.seed")).unwrap();
    let text = ChatTemplate::new(chatml.split('\0').next().unwrap(), "", "")
        .and_then(|t| t.render(&long, true))
        .unwrap();
    assert!(text.contains("message 4999"));
}

/// The vocabulary-only GGUFs (`tests/fixtures/gguf/*.vocab.gguf`: a
/// byte-level BPE and a SentencePiece vocabulary): each mutant's tokenizer
/// is rebuilt, loaded, and made to encode and decode.
#[test]
fn mutated_gguf_vocabularies_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vocab.gguf");
    for (model, rng_seed) in [("tiny-llama", 0x70CA_0001), ("tiny-gemma", 0x70CA_0002)] {
        let seed = std::fs::read(fixture(&format!("gguf/{model}.vocab.gguf"))).unwrap();
        let t = campaign(&seed, 1000, rng_seed, |mutant| {
            std::fs::write(&path, mutant).unwrap();
            gguf_tokenizer(&path)
        });
        assert!(t.ran > 0 && t.refused > 0, "{model}: {t:?}");
    }
}

/// Request bodies (`tests/fixtures/requests/*.json`, also the fuzzer's
/// seeds) against the tiny GGUF model: every mutant is checked as a chat
/// and as a completion request; what passes must fit the vocabulary and
/// the context.
#[test]
fn mutated_server_requests_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let facts = request_facts(dir.path()).unwrap();
    let seeds = seed_files("requests");
    assert_eq!(seeds.len(), 4);
    for (i, (name, seed)) in seeds.iter().enumerate() {
        assert_eq!(server_request(&facts, seed), Outcome::Ran, "{name}");
        let t = campaign(seed, 1500, 0x8E0_0000 + i as u64, |body| {
            server_request(&facts, body)
        });
        assert!(t.ran > 0 && t.refused > 0, "{name}: {t:?}");
    }
}
