//! A chat template and its messages (see `mllm_fuzz::chat_template`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mllm_fuzz::chat_template(data);
});
