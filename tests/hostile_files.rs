//! A short, deterministic mutation campaign over model files, run in CI
//! (`mllm-mutate`): each mutant of a real `.mllm` or GGUF fixture file is
//! opened, every tensor is viewed, and whatever opens is loaded as a model
//! (a GGUF file imported first) and run for one step. Every outcome must
//! be a value (a model or an `Error`), never a panic.

mod common;

use std::path::Path;

use common::*;
use mllm::convert::{quantize_file, DTypePolicy, QuantizeOptions};
use mllm::core::DType;
use mllm_mutate::{campaign, Tally};

/// Mutants per seed file.
const MUTANTS: usize = 1000;

/// The campaign over mutants of the file at `seed`.
fn run(seed: &Path, rng_seed: u64) -> Tally {
    let bytes = std::fs::read(seed).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mutant.mllm");
    campaign(&bytes, MUTANTS, rng_seed, |mutant| {
        std::fs::write(&path, mutant).unwrap();
        mllm_fuzz::mllm_file(&path)
    })
}

#[test]
fn mutated_f32_files_never_panic() {
    let c = convert_to(&fixture("tiny-llama"), DType::F32);
    let t = run(&c.path, 0x5EED_0001);
    assert_eq!(t.ran + t.refused, MUTANTS);
    // Both outcomes occur: the campaign reaches the loader and the step.
    assert!(t.ran > 0 && t.refused > 0, "{t:?}");
}

#[test]
fn mutated_quantized_and_packed_files_never_panic() {
    let c = convert_to(&fixture("tiny-qwen3"), DType::F32);
    for (packed, seed) in [(false, 0x5EED_0002), (true, 0x5EED_0003)] {
        let out = c.dir.path().join(format!("q-{packed}.mllm"));
        let opts = QuantizeOptions {
            policy: DTypePolicy {
                embed_dtype: Some(DType::Q8_0),
                packed,
                ..DTypePolicy::new(DType::Q4_0)
            },
            progress: false,
        };
        quantize_file(&c.path, &out, &opts).unwrap();
        let t = run(&out, seed);
        assert!(t.ran > 0 && t.refused > 0, "{t:?}");
    }
}

/// The GGUF files llama.cpp's conventions give (`tests/fixtures/gguf`:
/// Llama in f32 and Q8_0, the other architectures in Q8_0): each mutant is
/// imported, loaded and stepped.
#[test]
fn mutated_gguf_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("m.gguf"), dir.path().join("m.mllm"));
    let files = [
        ("tiny-llama.f32", 0x6600_0001, MUTANTS),
        ("tiny-llama.q8_0", 0x6600_0002, MUTANTS),
        ("tiny-qwen2.q8_0", 0x6600_0003, MUTANTS / 4),
        ("tiny-qwen3.q8_0", 0x6600_0004, MUTANTS / 4),
        ("tiny-phi3.q8_0", 0x6600_0005, MUTANTS / 4),
        ("tiny-gemma.q8_0", 0x6600_0006, MUTANTS / 4),
        ("tiny-gpt2.q8_0", 0x6600_0007, MUTANTS / 4),
    ];
    for (file, rng_seed, mutants) in files {
        let seed = std::fs::read(fixture(&format!("gguf/{file}.gguf"))).unwrap();
        let t = campaign(&seed, mutants, rng_seed, |mutant| {
            std::fs::write(&input, mutant).unwrap();
            mllm_fuzz::gguf(&input, &output)
        });
        assert!(t.ran > 0 && t.refused > 0, "{file}: {t:?}");
    }
}
