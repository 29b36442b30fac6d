//! The fuzz targets of mllm-rs: each kind of untrusted input (a model
//! file, weights, a chat template) taken as far as the program would take
//! it, returning an [`Outcome`] instead of panicking. The deterministic
//! mutation campaigns in `tests/` and the libFuzzer targets in `fuzz/`
//! call the same functions.

use std::path::Path;

use mllm_convert::{convert, ConvertOptions};
use mllm_core::file::MllmFile;
use mllm_core::{LogitsMode, StepInput};
use mllm_models::chat::{ChatTemplate, Message};
use mllm_models::{LoadOptions, Model};
pub use mllm_mutate::Outcome;

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
