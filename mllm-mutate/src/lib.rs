//! Deterministic mutation campaigns for robustness tests: from a seed file
//! (a real `.mllm`, GGUF or other input), make mutants (bit flips,
//! truncation, huge counts and lengths, spliced chunks, structural bytes),
//! hand each to the code under test and check that it returns instead of
//! panicking. The same seed and count give the same mutants on every run,
//! so a campaign can run in CI on every change.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// What the code under test made of one mutant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It went all the way (for a model file: loaded and ran a step).
    Ran,
    /// It was refused with an error value.
    Refused,
}

/// How many mutants gave each outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Mutants that went all the way.
    pub ran: usize,
    /// Mutants refused with an error.
    pub refused: usize,
}

/// xorshift64*, seeded: the campaign is the same on every run.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced by a fixed odd constant).
    pub fn new(seed: u64) -> Self {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// Bytes of the seed that most mutations land in: headers, indexes and
/// metadata, where counts, lengths and offsets live.
const HEAD: usize = 4096;

/// One mutation of `seed`.
pub fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    if b.is_empty() {
        return b;
    }
    let head = b.len().min(HEAD);
    let at = |rng: &mut Rng, len: usize| {
        if rng.below(4) == 0 {
            rng.below(len)
        } else {
            rng.below(head.min(len))
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
        2 if b.len() >= 8 => {
            // A huge, negative or zero count, length or offset.
            let values = [u64::MAX, 1 << 60, 1 << 40, i64::MAX as u64, 0x8000_0000, 0];
            let v = values[rng.below(values.len())].to_le_bytes();
            let n = [4, 8][rng.below(2)];
            let i = at(rng, b.len() - 7);
            b[i..i + n].copy_from_slice(&v[..n]);
        }
        3 => {
            // Splice: a chunk of the file copied over another place.
            let len = 1 + rng.below(64.min(b.len()));
            let from = rng.below(b.len() - len + 1);
            let to = at(rng, b.len() - len + 1);
            let chunk = b[from..from + len].to_vec();
            b[to..to + len].copy_from_slice(&chunk);
        }
        _ => {
            // A structural byte of JSON or a string terminator.
            let bytes = b"{}[]\",:0-9e\x00\xff";
            let i = at(rng, b.len());
            b[i] = bytes[rng.below(bytes.len())];
        }
    }
    b
}

/// Runs `n` mutants of `seed` (generator seeded with `rng_seed`) through
/// `exercise`. A mutant that panics is written to the system's temporary
/// directory and the campaign panics with its path and index.
pub fn campaign(
    seed: &[u8],
    n: usize,
    rng_seed: u64,
    mut exercise: impl FnMut(&[u8]) -> Outcome,
) -> Tally {
    let mut rng = Rng::new(rng_seed);
    let mut tally = Tally::default();
    for i in 0..n {
        let mutant = mutate(&mut rng, seed);
        match catch_unwind(AssertUnwindSafe(|| exercise(&mutant))) {
            Ok(Outcome::Ran) => tally.ran += 1,
            Ok(Outcome::Refused) => tally.refused += 1,
            Err(_) => {
                let keep = std::env::temp_dir().join(format!("mllm-mutant-{rng_seed:x}-{i}"));
                let kept = std::fs::write(&keep, &mutant).is_ok();
                panic!(
                    "mutant {i} of campaign {rng_seed:#x} panicked{}",
                    if kept {
                        format!("; kept as {}", keep.display())
                    } else {
                        String::new()
                    }
                );
            }
        }
    }
    tally
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn campaigns_are_reproducible_and_mutate() {
        let seed: Vec<u8> = (0..=255).cycle().take(10_000).collect();
        let run = || {
            let mut rng = Rng::new(7);
            (0..50).map(|_| mutate(&mut rng, &seed)).collect::<Vec<_>>()
        };
        let (a, b) = (run(), run());
        assert_eq!(a, b);
        let changed = a.iter().filter(|m| **m != seed).count();
        assert!(changed >= 40, "only {changed} of 50 mutants differ");
        assert!(a.iter().any(|m| m.len() < seed.len()), "no truncation");
    }

    #[test]
    fn a_panicking_mutant_fails_the_campaign() {
        let seed = vec![1u8; 64];
        let got = catch_unwind(|| {
            campaign(&seed, 20, 3, |m| {
                assert!(m.len() == 64, "short mutant");
                Outcome::Ran
            })
        });
        assert!(got.is_err());
        let tally = campaign(&seed, 20, 3, |m| {
            if m == seed.as_slice() {
                Outcome::Ran
            } else {
                Outcome::Refused
            }
        });
        assert_eq!(tally.ran + tally.refused, 20);
    }
}
