//! Token sampling: turning a vector of logits into the next token id.
//!
//! [`Sampler`] applies, in the same order as Hugging Face `transformers`:
//!
//! 1. repetition penalty over the distinct token ids already seen,
//! 2. greedy argmax when `temperature == 0` (and stops there),
//! 3. temperature scaling,
//! 4. top-k,
//! 5. top-p (nucleus),
//! 6. min-p,
//! 7. renormalisation and a draw from a seeded [`StdRng`].
//!
//! The same [`SamplingParams`] (including the seed) and the same sequence of
//! inputs always produce the same sequence of tokens.

use mllm_core::{Error, Result};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Settings that control how the next token is chosen from the logits.
///
/// The [`Default`] is greedy decoding with every filter switched off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature. `0.0` means greedy (argmax); must be finite and `>= 0`.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` switches top-k off.
    ///
    /// When several tokens tie with the k-th largest logit, all of them are
    /// kept, so slightly more than `top_k` tokens may survive.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose
    /// cumulative probability reaches `top_p`. Must lie in `(0, 1]`; `1.0` is off.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the probability of
    /// the most likely token. Must lie in `[0, 1]`; `0.0` is off.
    pub min_p: f32,
    /// Penalty for tokens already in the history (CTRL-style, as in
    /// `transformers`): a positive logit is divided by it, a non-positive one
    /// multiplied. Must be finite and `> 0`; `1.0` is off.
    pub repetition_penalty: f32,
    /// Seed of the random number generator used for the draw.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    /// Greedy decoding: temperature `0.0`, all filters off, seed `0`.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }

    /// Checks every field, returning [`Error::InvalidInput`] naming the first
    /// field that is out of range.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::InvalidInput(format!(
                "sampling temperature must be finite and >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::InvalidInput(format!(
                "sampling top_p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(Error::InvalidInput(format!(
                "sampling min_p must be in [0, 1], got {}",
                self.min_p
            )));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(Error::InvalidInput(format!(
                "sampling repetition_penalty must be finite and > 0, got {}",
                self.repetition_penalty
            )));
        }
        Ok(())
    }
}

/// Index of the largest value in `logits`; the lowest index wins ties.
///
/// NaN values are never chosen unless every value is NaN. Returns `0` for an
/// empty slice or a slice of only NaNs.
pub fn argmax(logits: &[f32]) -> usize {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in logits.iter().enumerate() {
        if !x.is_nan() && best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map_or(0, |(i, _)| i)
}

/// A stateful token sampler: validated [`SamplingParams`], a seeded RNG and
/// scratch buffers reused from one token to the next.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// `(token id, value)` pairs; the value is first a logit, later a weight.
    scratch: Vec<(u32, f32)>,
    /// Sorted, deduplicated copy of the history.
    seen: Vec<u32>,
}

impl Sampler {
    /// Validates `params` and creates a sampler whose RNG is seeded with
    /// `params.seed`.
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        Ok(Self {
            params,
            rng: StdRng::seed_from_u64(params.seed),
            scratch: Vec::new(),
            seen: Vec::new(),
        })
    }

    /// The parameters this sampler was created with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token id from `logits` (one value per vocabulary entry).
    ///
    /// `history` holds the prompt and the tokens generated so far; it is only
    /// used by the repetition penalty, and ids outside the vocabulary are
    /// ignored. Returns [`Error::InvalidInput`] if `logits` is empty, contains
    /// NaN, has more than `u32::MAX` entries, or (when sampling with a
    /// temperature) is `-inf` everywhere.
    ///
    /// Temperature is applied in the overflow-free form
    /// `exp((logit - max) / temperature)`, which equals the softmax of
    /// `logit / temperature`. Tokens whose logit is `+inf` share all the
    /// probability mass equally.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32> {
        if let Some(token) = self.filter(logits, history)? {
            return Ok(token);
        }

        // (7) Renormalise and draw.
        let total: f64 = self.scratch.iter().map(|e| f64::from(e.1)).sum();
        let u = self.rng.random::<f64>() * total;
        let mut cum = 0.0f64;
        let mut last = None;
        for e in &self.scratch {
            if e.1 <= 0.0 {
                continue;
            }
            cum += f64::from(e.1);
            last = Some(e.0);
            if u < cum {
                return Ok(e.0);
            }
        }
        // Only reachable through rounding at the very top of the range.
        last.ok_or_else(|| {
            Error::InvalidInput("sampling: no token has non-zero probability".into())
        })
    }

    /// Steps (1) to (6): returns `Some(token)` when decoding greedily;
    /// otherwise leaves the surviving `(id, unnormalised probability)` pairs
    /// in `self.scratch` and returns `None`.
    fn filter(&mut self, logits: &[f32], history: &[u32]) -> Result<Option<u32>> {
        if logits.is_empty() {
            return Err(Error::InvalidInput("sampling: logits are empty".into()));
        }
        let vocab = u32::try_from(logits.len()).map_err(|_| {
            Error::InvalidInput(format!(
                "sampling: {} logits exceed the u32 token id range",
                logits.len()
            ))
        })?;
        if let Some(i) = logits.iter().position(|x| x.is_nan()) {
            return Err(Error::InvalidInput(format!(
                "sampling: logit for token {i} is NaN"
            )));
        }
        let p = self.params;

        // Fast path: plain greedy needs no copy at all.
        if p.temperature == 0.0 && (p.repetition_penalty == 1.0 || history.is_empty()) {
            return Ok(Some(argmax(logits) as u32));
        }

        // (1) Repetition penalty, on a copy indexed by token id.
        self.scratch.clear();
        self.scratch.extend((0..vocab).zip(logits.iter().copied()));
        if p.repetition_penalty != 1.0 {
            self.seen.clear();
            self.seen
                .extend(history.iter().copied().filter(|&t| t < vocab));
            self.seen.sort_unstable();
            self.seen.dedup();
            for &t in &self.seen {
                let v = &mut self.scratch[t as usize].1;
                *v = if *v > 0.0 {
                    *v / p.repetition_penalty
                } else {
                    *v * p.repetition_penalty
                };
            }
        }

        // (2) Greedy.
        if p.temperature == 0.0 {
            let mut best = self.scratch[0];
            for &e in &self.scratch[1..] {
                if e.1 > best.1 {
                    best = e;
                }
            }
            return Ok(Some(best.0));
        }

        // (4) Top-k (order-preserving, so it can precede the temperature).
        // Ties with the k-th value are all kept.
        let k = p.top_k;
        if k > 0 && k < self.scratch.len() {
            self.scratch
                .select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
            let kth = self.scratch[k - 1].1;
            let mut kept = k;
            for j in k..self.scratch.len() {
                if self.scratch[j].1 == kth {
                    self.scratch.swap(kept, j);
                    kept += 1;
                }
            }
            self.scratch.truncate(kept);
        }

        // (3) Temperature, fused with the softmax numerator: value -> weight.
        let max = self
            .scratch
            .iter()
            .map(|e| e.1)
            .fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return Err(Error::InvalidInput("sampling: every logit is -inf".into()));
        }
        let t = p.temperature;
        if max == f32::INFINITY {
            for e in &mut self.scratch {
                e.1 = if e.1 == f32::INFINITY { 1.0 } else { 0.0 };
            }
        } else {
            for e in &mut self.scratch {
                e.1 = ((e.1 - max) / t).exp();
            }
        }
        // Weights are in [0, 1] and the maximum one is exactly 1.

        // (5) Top-p and (6) min-p. Both keep a prefix of the tokens sorted by
        // descending probability, and that prefix always contains the most
        // likely token, so applying them together gives exactly the result of
        // top-p followed by min-p. Min-p is relative to the most likely token,
        // which top-p never removes, and is a ratio, so it needs no
        // normalisation. Top-p's cumulative probabilities are relative to the
        // total *before* min-p, as in the sequential order. Pruning by min-p
        // first just means fewer tokens to sort.
        if p.top_p < 1.0 || p.min_p > 0.0 {
            let total: f64 = self.scratch.iter().map(|e| f64::from(e.1)).sum();
            if p.min_p > 0.0 {
                let top = self.scratch.iter().map(|e| e.1).fold(0.0f32, f32::max);
                let threshold = p.min_p * top;
                self.scratch.retain(|e| e.1 >= threshold);
            }
            if p.top_p < 1.0 {
                let target = f64::from(p.top_p) * total;
                let keep = nucleus_len(&mut self.scratch, target);
                self.scratch.truncate(keep);
            }
        }

        Ok(None)
    }
}

/// Descending-probability order with the token id as tie-break: a total
/// order, so every sort and selection below is deterministic.
fn by_weight_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Length of the smallest prefix of `entries`, ordered by [`by_weight_desc`],
/// whose weights sum to at least `target` (at least 1; all of them if the sum
/// never gets there). On return that prefix is at the front, sorted.
///
/// Sorting a 150k vocabulary for every token is slow, and the nucleus is
/// usually small, so this selects and sorts a growing head of the entries
/// until the nucleus fits inside it.
fn nucleus_len(entries: &mut [(u32, f32)], target: f64) -> usize {
    let n = entries.len();
    let mut head = n.min(256);
    loop {
        if head < n {
            entries.select_nth_unstable_by(head - 1, by_weight_desc);
        }
        entries[..head].sort_unstable_by(by_weight_desc);
        let mut cum = 0.0f64;
        for (i, e) in entries[..head].iter().enumerate() {
            cum += f64::from(e.1);
            if cum >= target {
                return i + 1;
            }
        }
        if head == n {
            return n.max(1);
        }
        head = n.min(head.saturating_mul(4));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::greedy()
        }
    }

    fn invalid_names(p: SamplingParams, field: &str) {
        match p.validate() {
            Err(Error::InvalidInput(msg)) => assert!(msg.contains(field), "{msg}"),
            other => panic!("expected InvalidInput for {field}, got {other:?}"),
        }
        assert!(Sampler::new(p).is_err());
    }

    #[test]
    fn default_is_greedy_and_valid() {
        assert_eq!(SamplingParams::default(), SamplingParams::greedy());
        SamplingParams::default().validate().unwrap();
    }

    #[test]
    fn argmax_lowest_index_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, 0.5]), 2);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn greedy_equals_argmax() {
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1013) as f32 * 0.01 - 3.0)
            .collect();
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        for _ in 0..3 {
            assert_eq!(s.sample(&logits, &[]).unwrap() as usize, argmax(&logits));
        }
        // With a (no-op) history and ties, the lowest id still wins.
        let mut s = Sampler::new(SamplingParams {
            repetition_penalty: 1.3,
            ..SamplingParams::greedy()
        })
        .unwrap();
        assert_eq!(s.sample(&[0.0, 2.0, 2.0, 1.0], &[3]).unwrap(), 1);
    }

    #[test]
    fn repetition_penalty_changes_argmax() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(p).unwrap();
        // Positive logits: 4.0 / 2 = 2.0 < 3.0.
        let pos = [4.0, 3.0, 1.0];
        assert_eq!(s.sample(&pos, &[]).unwrap(), 0);
        assert_eq!(s.sample(&pos, &[0, 0, 0]).unwrap(), 1);
        // Penalised once per distinct id (4 / 2 = 2 > 1.9, not 4 / 8).
        assert_eq!(s.sample(&[4.0, 1.9], &[0, 0, 0]).unwrap(), 0);
        // Negative logits: -1.0 * 2 = -2.0 < -1.5.
        let neg = [-1.0, -1.5, -3.0];
        assert_eq!(s.sample(&neg, &[]).unwrap(), 0);
        assert_eq!(s.sample(&neg, &[0]).unwrap(), 1);
        // Out-of-vocabulary history ids are ignored.
        assert_eq!(s.sample(&neg, &[7, u32::MAX]).unwrap(), 0);
        // Also applies before temperature sampling.
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.7,
            top_k: 1,
            repetition_penalty: 2.0,
            ..SamplingParams::greedy()
        })
        .unwrap();
        assert_eq!(s.sample(&pos, &[0]).unwrap(), 1);
        assert_eq!(s.sample(&neg, &[0]).unwrap(), 1);
    }

    fn spread_logits() -> Vec<f32> {
        (0..500).map(|i| ((i * 37) % 1009) as f32 * 0.01).collect()
    }

    #[test]
    fn top_k_one_is_argmax() {
        let logits = spread_logits();
        let mut s = Sampler::new(SamplingParams {
            top_k: 1,
            seed: 3,
            ..params(1.5)
        })
        .unwrap();
        for _ in 0..200 {
            assert_eq!(s.sample(&logits, &[]).unwrap() as usize, argmax(&logits));
        }
    }

    #[test]
    fn tiny_top_p_is_argmax() {
        let logits = spread_logits();
        let mut s = Sampler::new(SamplingParams {
            top_p: 1e-6,
            seed: 4,
            ..params(2.0)
        })
        .unwrap();
        for _ in 0..200 {
            assert_eq!(s.sample(&logits, &[]).unwrap() as usize, argmax(&logits));
        }
    }

    #[test]
    fn min_p_one_is_argmax() {
        let logits = spread_logits();
        let mut s = Sampler::new(SamplingParams {
            min_p: 1.0,
            seed: 5,
            ..params(2.0)
        })
        .unwrap();
        for _ in 0..200 {
            assert_eq!(s.sample(&logits, &[]).unwrap() as usize, argmax(&logits));
        }
    }

    #[test]
    fn top_p_keeps_smallest_prefix() {
        // Probabilities 0.5, 0.3, 0.2: top_p 0.6 and 0.75 both keep {0, 1}.
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        for top_p in [0.6, 0.75] {
            let mut s = Sampler::new(SamplingParams {
                top_p,
                seed: 6,
                ..params(1.0)
            })
            .unwrap();
            let mut seen = [0usize; 3];
            for _ in 0..2000 {
                seen[s.sample(&logits, &[]).unwrap() as usize] += 1;
            }
            assert_eq!(seen[2], 0, "top_p {top_p}: {seen:?}");
            assert!(seen[0] > 0 && seen[1] > 0);
        }
    }

    /// Straightforward sequential reference for steps (3) to (6): full sorts,
    /// top-p then min-p, exactly in the documented order.
    fn reference_kept(logits: &[f32], p: &SamplingParams) -> Vec<u32> {
        let mut v: Vec<(u32, f32)> = (0..logits.len() as u32)
            .zip(logits.iter().copied())
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 && p.top_k < v.len() {
            let kth = v[p.top_k - 1].1;
            v.retain(|e| e.1 >= kth);
        }
        let max = v[0].1;
        for e in &mut v {
            e.1 = ((e.1 - max) / p.temperature).exp();
        }
        v.sort_by(by_weight_desc);
        if p.top_p < 1.0 {
            let total: f64 = v.iter().map(|e| f64::from(e.1)).sum();
            let mut cum = 0.0;
            let mut keep = v.len();
            for (i, e) in v.iter().enumerate() {
                cum += f64::from(e.1);
                if cum >= f64::from(p.top_p) * total {
                    keep = i + 1;
                    break;
                }
            }
            v.truncate(keep);
        }
        if p.min_p > 0.0 {
            let top = v[0].1;
            v.retain(|e| e.1 >= p.min_p * top);
        }
        let mut ids: Vec<u32> = v.iter().map(|e| e.0).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn filters_match_sequential_reference() {
        let mut rng = StdRng::seed_from_u64(77);
        let mut cases = 0;
        for vocab in [1usize, 2, 7, 300, 5000] {
            for scale in [0.01f32, 1.0, 8.0] {
                // Quantised logits, so ties occur.
                let logits: Vec<f32> = (0..vocab)
                    .map(|_| (rng.random::<f32>() * 64.0).floor() * scale)
                    .collect();
                for &(temperature, top_k, top_p, min_p) in &[
                    (1.0, 0, 0.9, 0.0),
                    (0.7, 0, 0.99, 0.0),
                    (1.3, 0, 0.5, 0.1),
                    (1.0, 0, 1.0, 0.05),
                    (0.5, 40, 0.95, 0.0),
                    (2.0, 3, 0.3, 0.5),
                    (1.0, 1000, 0.999, 0.001),
                ] {
                    let p = SamplingParams {
                        temperature,
                        top_k,
                        top_p,
                        min_p,
                        ..SamplingParams::greedy()
                    };
                    let mut s = Sampler::new(p).unwrap();
                    assert_eq!(s.filter(&logits, &[]).unwrap(), None);
                    let mut got: Vec<u32> = s.scratch.iter().map(|e| e.0).collect();
                    got.sort_unstable();
                    assert_eq!(
                        got,
                        reference_kept(&logits, &p),
                        "vocab {vocab} scale {scale} {p:?}"
                    );
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 105);
    }

    #[test]
    fn top_k_ties_keep_all_equal() {
        let logits = [1.0, 2.0, 2.0, 2.0, 0.0];
        let mut s = Sampler::new(SamplingParams {
            top_k: 2,
            seed: 8,
            ..params(1.0)
        })
        .unwrap();
        let mut seen = [0usize; 5];
        for _ in 0..3000 {
            seen[s.sample(&logits, &[]).unwrap() as usize] += 1;
        }
        assert_eq!((seen[0], seen[4]), (0, 0), "{seen:?}");
        assert!(seen[1..4].iter().all(|&c| c > 800), "{seen:?}");
    }

    #[test]
    fn top_k_two_frequencies() {
        let probs = [0.1f32, 0.2, 0.3, 0.4];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let mut s = Sampler::new(SamplingParams {
            top_k: 2,
            seed: 42,
            ..params(1.0)
        })
        .unwrap();
        let n = 10_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[s.sample(&logits, &[]).unwrap() as usize] += 1;
        }
        assert_eq!(counts[0] + counts[1], 0);
        let f2 = counts[2] as f64 / n as f64;
        let f3 = counts[3] as f64 / n as f64;
        assert!((f2 - 3.0 / 7.0).abs() < 0.02, "{f2}");
        assert!((f3 - 4.0 / 7.0).abs() < 0.02, "{f3}");
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let logits = [0.0f32, 1.0];
        let freq1 = |t: f32| {
            let mut s = Sampler::new(SamplingParams {
                seed: 9,
                ..params(t)
            })
            .unwrap();
            (0..10_000)
                .filter(|_| s.sample(&logits, &[]).unwrap() == 1)
                .count() as f64
                / 10_000.0
        };
        let expect = |t: f32| 1.0 / (1.0 + (-1.0f64 / f64::from(t)).exp());
        for t in [0.5f32, 1.0, 2.0] {
            assert!((freq1(t) - expect(t)).abs() < 0.02, "t = {t}");
        }
    }

    #[test]
    fn determinism_per_seed() {
        let flat = vec![0.0f32; 64];
        let run = |seed: u64| {
            let mut s = Sampler::new(SamplingParams {
                seed,
                ..params(1.0)
            })
            .unwrap();
            (0..50)
                .map(|_| s.sample(&flat, &[]).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn bad_logits_are_errors() {
        let mut s = Sampler::new(params(1.0)).unwrap();
        assert!(matches!(s.sample(&[], &[]), Err(Error::InvalidInput(_))));
        assert!(matches!(
            s.sample(&[0.0, f32::NAN], &[]),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            s.sample(&[f32::NEG_INFINITY; 3], &[]),
            Err(Error::InvalidInput(_))
        ));
        let mut g = Sampler::new(SamplingParams::greedy()).unwrap();
        assert!(matches!(g.sample(&[], &[]), Err(Error::InvalidInput(_))));
        assert!(matches!(
            g.sample(&[f32::NAN], &[]),
            Err(Error::InvalidInput(_))
        ));
    }

    #[test]
    fn extreme_logits_do_not_break_sampling() {
        let mut s = Sampler::new(SamplingParams {
            seed: 10,
            ..params(1e-30)
        })
        .unwrap();
        assert_eq!(s.sample(&[-3e38, -2e38, f32::MIN], &[]).unwrap(), 1);
        let mut s = Sampler::new(params(1.0)).unwrap();
        for _ in 0..50 {
            let t = s.sample(&[f32::INFINITY, 0.0, f32::INFINITY], &[]).unwrap();
            assert!(t == 0 || t == 2);
        }
    }

    #[test]
    fn validation_errors_name_the_field() {
        let g = SamplingParams::greedy();
        for t in [-0.1, f32::NAN, f32::INFINITY] {
            invalid_names(
                SamplingParams {
                    temperature: t,
                    ..g
                },
                "temperature",
            );
        }
        for p in [0.0, -0.5, 1.01, f32::NAN] {
            invalid_names(SamplingParams { top_p: p, ..g }, "top_p");
        }
        for p in [-0.01, 1.01, f32::NAN] {
            invalid_names(SamplingParams { min_p: p, ..g }, "min_p");
        }
        for r in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            invalid_names(
                SamplingParams {
                    repetition_penalty: r,
                    ..g
                },
                "repetition_penalty",
            );
        }
        // Boundaries that are allowed.
        for p in [
            SamplingParams {
                top_p: 1.0,
                min_p: 1.0,
                ..g
            },
            SamplingParams {
                min_p: 0.0,
                temperature: 5.0,
                ..g
            },
        ] {
            p.validate().unwrap();
        }
    }
}
