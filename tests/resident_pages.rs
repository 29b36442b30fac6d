//! What a loaded model keeps of its file in memory. The weights it copies
//! (repacked for its kernels) and the text it parses (metadata, tokenizer,
//! chat template) leave the resident set at load; only what it reads in
//! place (an embedding's rows, as tokens come) faults back in.

use std::path::Path;

use mllm::convert::default_model;
use mllm::models::{LoadOptions, Model};

/// Resident kilobytes (`/proc/self/smaps`) of this process's mappings of
/// the file at `path` (a canonical path).
#[cfg(target_os = "linux")]
fn resident_kib_of_file(path: &Path) -> usize {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
    let name = path.to_str().expect("a UTF-8 path");
    let mut in_file = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let is_header = line
            .split_whitespace()
            .next()
            .is_some_and(|range| range.contains('-') && !range.ends_with(':'));
        if is_header {
            in_file = line.ends_with(name);
        } else if let (true, Some(rss)) = (in_file, line.strip_prefix("Rss:")) {
            kib += rss
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<usize>()
                .expect("Rss in kB");
        }
    }
    kib
}

/// The default model, loaded: its 1.5 MiB tokenizer has been parsed (it
/// encodes) and its file keeps well under that resident (it kept the
/// tokenizer's pages before they were released after parsing).
#[cfg(target_os = "linux")]
#[test]
fn a_loaded_model_keeps_little_of_its_file_resident() {
    let path = default_model::ensure_model().expect("fetch and convert the default model");
    let path = path.canonicalize().unwrap();
    let opts = LoadOptions {
        threads: 1,
        ..Default::default()
    };
    let model = Model::load(&path, &opts).unwrap();
    let tokenizer = model
        .tokenizer()
        .expect("the default model embeds its tokenizer");
    assert!(!tokenizer
        .encode("The capital of France", false)
        .unwrap()
        .is_empty());
    let kib = resident_kib_of_file(&path);
    assert!(
        kib < 512,
        "{kib} KiB of {} resident after load",
        path.display()
    );
}
