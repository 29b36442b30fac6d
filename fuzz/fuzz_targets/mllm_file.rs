//! A `.mllm` file: opened, viewed, loaded and run for a step.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.mllm");
    std::fs::write(&path, data).unwrap();
    let _ = mllm_fuzz::mllm_file(&path);
});
