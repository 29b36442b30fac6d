//! The vocabulary of a GGUF file: the tokenizer rebuilt from its metadata,
//! loaded, and used to encode and decode.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("vocab.gguf");
    std::fs::write(&input, data).unwrap();
    let _ = mllm_fuzz::gguf_tokenizer(&input);
});
