//! A short, deterministic mutation campaign over `.mllm` files, run in CI:
//! each mutant of a real fixture file (bit flips, truncation, huge counts
//! and lengths written over the index, spliced chunks) is opened, every
//! tensor is viewed, and whatever opens is loaded as a model and run for
//! one step. Every outcome must be a value (a model or an `Error`), never
//! a panic.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use common::*;
use mllm::convert::{quantize_file, DTypePolicy, QuantizeOptions};
use mllm::core::file::MllmFile;
use mllm::core::{DType, LogitsMode, StepInput};
use mllm::models::{LoadOptions, Model};

/// Mutants per seed file.
const MUTANTS: usize = 1000;

/// xorshift64*: the campaign is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One mutation of `seed`; the index and header (the first few KiB) get
/// most of them, since that is where counts, lengths and offsets live.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    let head = b.len().min(4096);
    let at = |rng: &mut Rng, len: usize| {
        if rng.below(4) == 0 {
            rng.below(len)
        } else {
            rng.below(head)
        }
    };
    match rng.below(5) {
        0 => {
            for _ in 0..1 + rng.below(8) {
                let i = at(rng, b.len());
                b[i] ^= 1 << rng.below(8);
            }
        }
        1 => b.truncate(rng.below(b.len())),
        2 => {
            // A huge or negative count, length or offset.
            let values = [u64::MAX, 1 << 60, 1 << 40, i64::MAX as u64, 0x8000_0000, 0];
            let v = values[rng.below(values.len())].to_le_bytes();
            let i = at(rng, b.len().saturating_sub(8));
            let n = [4, 8][rng.below(2)];
            b[i..i + n].copy_from_slice(&v[..n]);
        }
        3 => {
            // Splice: a chunk of the file copied over another place.
            let len = 1 + rng.below(64);
            let from = rng.below(b.len().saturating_sub(len));
            let to = at(rng, b.len().saturating_sub(len));
            let chunk = b[from..from + len].to_vec();
            b[to..to + len].copy_from_slice(&chunk);
        }
        _ => {
            // Bytes in the metadata JSON (near the end of the index).
            let i = rng.below(head);
            let bytes = b"{}[]\",:0-9e\x00\xff";
            b[i] = bytes[rng.below(bytes.len())];
        }
    }
    b
}

/// Opens, views and runs one mutant: `Ok(true)` when it ran a step,
/// `Ok(false)` when it was refused with an error.
fn exercise(path: &Path) -> bool {
    let Ok(file) = MllmFile::open(path) else {
        return false;
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
    let opts = LoadOptions {
        threads: 1,
        ..Default::default()
    };
    let Ok(mut model) = Model::load(path, &opts) else {
        return false;
    };
    let vocab = model.vocab_size() as u32;
    let prompt: Vec<u32> = [1, 5, 9].iter().map(|i| i % vocab.max(1)).collect();
    model
        .step(&StepInput::single(0, prompt, LogitsMode::Last))
        .is_ok()
}

fn campaign(seed_path: &Path, rng_seed: u64) -> (usize, usize) {
    let seed = std::fs::read(seed_path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mutant.mllm");
    let mut rng = Rng(rng_seed);
    let (mut ran, mut refused) = (0, 0);
    for i in 0..MUTANTS {
        let mutant = mutate(&mut rng, &seed);
        std::fs::write(&path, &mutant).unwrap();
        match catch_unwind(AssertUnwindSafe(|| exercise(&path))) {
            Ok(true) => ran += 1,
            Ok(false) => refused += 1,
            Err(_) => {
                let keep = std::env::temp_dir().join(format!("mllm-panic-{rng_seed}-{i}.mllm"));
                std::fs::write(&keep, &mutant).unwrap();
                panic!(
                    "mutant {i} of {} panicked; kept as {}",
                    seed_path.display(),
                    keep.display()
                );
            }
        }
    }
    (ran, refused)
}

#[test]
fn mutated_f32_files_never_panic() {
    let c = convert_to(&fixture("tiny-llama"), DType::F32);
    let (ran, refused) = campaign(&c.path, 0x5EED_0001);
    assert_eq!(ran + refused, MUTANTS);
    // Both outcomes occur: the campaign reaches the loader and the step.
    assert!(ran > 0 && refused > 0, "ran {ran}, refused {refused}");
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
        let (ran, refused) = campaign(&out, seed);
        assert!(ran > 0 && refused > 0, "ran {ran}, refused {refused}");
    }
}
