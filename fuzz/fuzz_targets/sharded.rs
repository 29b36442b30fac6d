//! A sharded Hugging Face checkpoint (index JSON plus two shards) with one
//! file replaced by the input: its first byte picks the index or a shard,
//! the rest is the file. Converted from the index, loaded and run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    let _ = mllm_fuzz::sharded_checkpoint(dir.path(), data);
});
