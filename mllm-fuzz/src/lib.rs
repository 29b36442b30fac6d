//! The fuzz targets of mllm-rs: each kind of untrusted input (a model
//! file, weights, a GGUF file and its vocabulary, a chat template, a server
//! request) taken as far as the program would take it, returning an
//! [`Outcome`] instead of panicking. The deterministic
//! mutation campaigns in `tests/` and the libFuzzer targets in `fuzz/`
//! call the same functions.

use std::path::{Path, PathBuf};

use mllm_convert::gguf::{tokenizer::tokenizer_json, GgufFile};
use mllm_convert::{convert, describe, ConvertOptions};
use mllm_core::file::MllmFile;
use mllm_core::{LogitsMode, StepInput};
use mllm_models::chat::{ChatTemplate, Message};
use mllm_models::{LoadOptions, Model, Tokenizer};
pub use mllm_mutate::Outcome;
use mllm_server::api::response::Kind;
use mllm_server::api::validate::{validate, ModelFacts};

/// Texts every rebuilt tokenizer encodes and decodes: ASCII, multi-byte
/// characters, control characters and special-token spellings.
const SAMPLE_TEXTS: [&str; 4] = [
    "the winter is coming",
    "Grüße, 世界! 🦀\n\t",
    "\u{0}\u{7f}<s></s><unk>  ",
    "",
];

/// The repository's `tests/fixtures/<rel>`.
fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(rel)
}

/// Loads the `.mllm` file at `path` with one thread and runs one prefill
/// step of three tokens.
pub fn load_and_step(path: &Path) -> Outcome {
    let opts = LoadOptions {
        threads: 1,
        ..Default::default()
    };
    let Ok(mut model) = Model::load(path, &opts) else {
        return Outcome::Refused;
    };
    let vocab = model.vocab_size().max(1) as u32;
    let prompt = [1u32, 5, 9].map(|i| i % vocab).to_vec();
    match model.step(&StepInput::single(0, prompt, LogitsMode::Last)) {
        Ok(_) => Outcome::Ran,
        Err(_) => Outcome::Refused,
    }
}

/// A `.mllm` file at `path`: opened, every tensor and metadata entry
/// viewed, then loaded and run for a step.
pub fn mllm_file(path: &Path) -> Outcome {
    let Ok(file) = MllmFile::open(path) else {
        return Outcome::Refused;
    };
    if let Some(meta) = file.metadata() {
        for name in meta.tensors.keys() {
            if let Ok(t) = file.tensor(name) {
                let _ = t.bytes().len();
            }
        }
    }
    let _ = file.tokenizer_json();
    let _ = file.chat_template();
    load_and_step(path)
}

/// A model input (a safetensors file, a shard index, a GGUF file, a model
/// directory) at `input`: converted to `output`, loaded and run for a step.
pub fn convertible(input: &Path, output: &Path) -> Outcome {
    if convert(input, output, &ConvertOptions::default()).is_err() {
        return Outcome::Refused;
    }
    load_and_step(output)
}

/// The files of the sharded fixture checkpoint
/// (`tests/fixtures/tiny-llama/sharded`) an input may replace: the index
/// first, then its two shards.
pub const SHARDED_FILES: [&str; 3] = [
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
];

/// A sharded checkpoint in `work`, made of the fixture's files with one
/// replaced: the first byte of `input` picks which of [`SHARDED_FILES`]
/// (modulo three), the rest is its new content. Converted from the index,
/// loaded and run for a step.
pub fn sharded_checkpoint(work: &Path, input: &[u8]) -> Outcome {
    let Some((&pick, content)) = input.split_first() else {
        return Outcome::Refused;
    };
    let fixture = fixture("tiny-llama/sharded");
    let replaced = SHARDED_FILES[pick as usize % SHARDED_FILES.len()];
    for name in SHARDED_FILES.iter().chain(&["config.json"]) {
        let path = work.join(name);
        let written = if *name == replaced {
            std::fs::write(&path, content)
        } else {
            std::fs::copy(fixture.join(name), &path).map(drop)
        };
        if written.is_err() {
            return Outcome::Refused;
        }
    }
    convertible(&work.join(SHARDED_FILES[0]), &work.join("out.mllm"))
}

/// A GGUF file at `input`: opened, every tensor located, described as
/// `mllm-convert inspect` shows it, then imported to `output`, loaded and
/// run for a step.
pub fn gguf(input: &Path, output: &Path) -> Outcome {
    let Ok(file) = GgufFile::open(input) else {
        return Outcome::Refused;
    };
    for name in file.tensors().keys() {
        if let Ok(t) = file.tensor(name) {
            let _ = t.data.len();
        }
    }
    let _ = describe(input);
    convertible(input, output)
}

/// The tokenizer described by the metadata of the GGUF file at `input`:
/// rebuilt as the import rebuilds it, loaded as a model load does, then
/// used to encode `SAMPLE_TEXTS` and decode the ids back, and to decode
/// every id of the vocabulary.
pub fn gguf_tokenizer(input: &Path) -> Outcome {
    let Ok(file) = GgufFile::open(input) else {
        return Outcome::Refused;
    };
    let Ok(Some(json)) = tokenizer_json(&file) else {
        return Outcome::Refused;
    };
    let Ok(tokenizer) = Tokenizer::from_json(&json) else {
        return Outcome::Refused;
    };
    for text in SAMPLE_TEXTS {
        for special in [false, true] {
            if let Ok(ids) = tokenizer.encode(text, special) {
                let _ = tokenizer.decode(&ids, !special);
            }
        }
    }
    let vocab = tokenizer.inner().get_vocab_size(true) as u32;
    let _ = tokenizer.decode(&(0..vocab).collect::<Vec<_>>(), false);
    Outcome::Ran
}

/// The facts the request targets check requests against: the GGUF
/// fixture tiny-llama in Q8_0 (a byte-level BPE and a chat template),
/// imported into `dir`.
pub fn request_facts(dir: &Path) -> Result<ModelFacts, String> {
    let gguf = fixture("gguf/tiny-llama.q8_0.gguf");
    let mllm = dir.join("requests.mllm");
    convert(&gguf, &mllm, &ConvertOptions::default()).map_err(|e| e.to_string())?;
    let opts = LoadOptions {
        threads: 1,
        ..Default::default()
    };
    let model = Model::load(&mllm, &opts).map_err(|e| e.to_string())?;
    ModelFacts::of(&model, "tiny".into())
}

/// A request body, checked as both a chat and a completion request. What
/// passes must be what the engine relies on: a prompt of known ids that
/// leaves room in the context for `max_tokens` (a violation panics, which
/// is what the fuzzer looks for).
pub fn server_request(facts: &ModelFacts, body: &[u8]) -> Outcome {
    let mut outcome = Outcome::Refused;
    for kind in [Kind::Chat, Kind::Text] {
        if let Ok(valid) = validate(facts, kind, body) {
            let r = &valid.request;
            assert!(!r.prompt.is_empty(), "an empty prompt passed");
            assert!(
                r.prompt.iter().all(|&id| (id as usize) < facts.vocab_size),
                "an id outside the vocabulary passed: {:?}",
                r.prompt
            );
            assert!(
                r.prompt.len() + r.max_tokens <= facts.context,
                "{} prompt tokens + max_tokens {} exceed the context of {}",
                r.prompt.len(),
                r.max_tokens,
                facts.context
            );
            outcome = Outcome::Ran;
        }
    }
    outcome
}

/// A chat template and messages to render with it: the bytes before the
/// first NUL are the template source, the rest a JSON list of
/// `{"role", "content"}` objects (one user message when it does not
/// parse). Compiled, then rendered with and without the generation prompt.
pub fn chat_template(input: &[u8]) -> Outcome {
    let (source, messages) = match input.iter().position(|&b| b == 0) {
        Some(at) => (&input[..at], &input[at + 1..]),
        None => (input, &b""[..]),
    };
    let messages: Vec<Message> = serde_json::from_slice::<Vec<serde_json::Value>>(messages)
        .map(|list| {
            list.iter()
                .map(|m| {
                    let field = |k: &str| m.get(k).and_then(|v| v.as_str()).unwrap_or("");
                    Message::new(field("role"), field("content"))
                })
                .collect()
        })
        .unwrap_or_else(|_| vec![Message::user("hello")]);
    let Ok(template) = ChatTemplate::new(&String::from_utf8_lossy(source), "<s>", "</s>") else {
        return Outcome::Refused;
    };
    let with_prompt = template.render(&messages, true);
    let without = template.render(&messages, false);
    if with_prompt.is_ok() && without.is_ok() {
        Outcome::Ran
    } else {
        Outcome::Refused
    }
}
