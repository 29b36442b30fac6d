//! A request body for `/v1/chat/completions` and `/v1/completions`,
//! checked against the tiny GGUF model as the server checks it. The model
//! is imported once per process.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mllm_server::api::validate::ModelFacts;

fn facts() -> &'static ModelFacts {
    static FACTS: OnceLock<ModelFacts> = OnceLock::new();
    FACTS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        mllm_fuzz::request_facts(dir.path()).unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = mllm_fuzz::server_request(facts(), data);
});
