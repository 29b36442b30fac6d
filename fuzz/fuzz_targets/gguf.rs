//! A GGUF file: opened, every tensor located, described, imported, loaded
//! and run for a step.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.gguf");
    std::fs::write(&input, data).unwrap();
    let _ = mllm_fuzz::gguf(&input, &dir.path().join("out.mllm"));
});
