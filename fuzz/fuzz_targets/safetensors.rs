//! Hugging Face weights: the input is tiny-llama's `model.safetensors`
//! (mutated), next to its `config.json`; converted, loaded and run.
#![no_main]

use libfuzzer_sys::fuzz_target;

const CONFIG: &str = include_str!("../../tests/fixtures/tiny-llama/config.json");

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), CONFIG).unwrap();
    let input = dir.path().join("model.safetensors");
    std::fs::write(&input, data).unwrap();
    let _ = mllm_fuzz::convertible(&input, &dir.path().join("out.mllm"));
});
