//! Beam search: keep the `num_beams` most likely continuations, as Hugging
//! Face transformers' `generate(num_beams=..., do_sample=False)` does, with
//! its length penalty, early-stopping rules and returned scores.
//!
//! Each beam is a KV slot. After a step, every new beam forks the slot of
//! the beam it extends (`Model::copy_slot`), which shares the cached pages
//! instead of copying them: the prompt is cached once for all beams, and a
//! fork copies at most the one page a beam then writes into. Slots come in
//! two banks per prompt, so the beams of one step are forked from the
//! previous step's without overwriting them.
//!
//! The bookkeeping follows transformers step for step, in f32 and with its
//! `-1e9` masks, so that scores and ties come out the same:
//! - the candidates are the best `max(2, 1 + n_eos) * num_beams` of all
//!   beams' continuations (only the first beam's at the first step);
//! - the best `num_beams` candidates that do not end (by an end-of-sequence
//!   id or the token budget) run on;
//! - a candidate among the best `num_beams` that ends is a finished
//!   hypothesis, scored `sum of log-probabilities / generated ^ length_penalty`,
//!   and the best `num_beams` finished ones are kept;
//! - the search stops when every candidate ends, when `early_stopping` is
//!   [`EarlyStopping::WhenFull`] and `num_beams` hypotheses are finished, or
//!   when no running beam can beat the worst finished one any more.

use mllm_core::{Error, LogitsMode, Result, SeqChunk, StepInput};

use crate::model::Model;
use crate::prefill::{prefill_batch, PREFILL_STEP_TOKENS};

/// transformers' mask value for candidates that may not be chosen.
const MASK: f32 = -1.0e9;

/// When the search may stop before every beam has ended (transformers'
/// `early_stopping`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EarlyStopping {
    /// `False`: stop when the best running beam, scored at its current
    /// length, cannot beat the worst finished hypothesis.
    #[default]
    Heuristic,
    /// `True`: stop as soon as `num_beams` hypotheses are finished.
    WhenFull,
    /// `"never"`: as `Heuristic`, but with a positive length penalty the
    /// running beam is scored at the longest length it could reach.
    Never,
}

impl std::str::FromStr for EarlyStopping {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "false" | "heuristic" => Ok(EarlyStopping::Heuristic),
            "true" => Ok(EarlyStopping::WhenFull),
            "never" => Ok(EarlyStopping::Never),
            _ => Err(Error::InvalidInput(format!(
                "early stopping must be false, true or never, not {s:?}"
            ))),
        }
    }
}

/// How to search.
#[derive(Clone, Debug)]
pub struct BeamOptions {
    /// Beams kept at every step.
    pub num_beams: usize,
    /// Most new tokens per hypothesis.
    pub max_tokens: usize,
    /// Exponent of the generated length that a finished hypothesis's
    /// log-probability is divided by (above 0 favours longer ones).
    pub length_penalty: f32,
    /// When to stop before every beam has ended.
    pub early_stopping: EarlyStopping,
    /// Hypotheses returned per prompt, best first (at most `num_beams`).
    pub num_return_sequences: usize,
    /// Ids that end a hypothesis (kept in its tokens).
    pub eos_ids: Vec<u32>,
}

impl Default for BeamOptions {
    fn default() -> Self {
        BeamOptions {
            num_beams: 4,
            max_tokens: 32,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::Heuristic,
            num_return_sequences: 1,
            eos_ids: Vec::new(),
        }
    }
}

impl BeamOptions {
    fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidInput(msg));
        if self.num_beams == 0 {
            return bad("num_beams must be at least 1".into());
        }
        if self.num_return_sequences == 0 || self.num_return_sequences > self.num_beams {
            return bad(format!(
                "num_return_sequences must be between 1 and num_beams ({}), not {}",
                self.num_beams, self.num_return_sequences
            ));
        }
        if self.max_tokens == 0 {
            return bad("max_tokens must be at least 1 for beam search".into());
        }
        if !self.length_penalty.is_finite() {
            return bad(format!(
                "length_penalty must be finite, not {}",
                self.length_penalty
            ));
        }
        Ok(())
    }

    /// Candidates considered per step.
    fn candidates(&self) -> usize {
        (1 + self.eos_ids.len()).max(2) * self.num_beams
    }
}

/// One returned continuation.
#[derive(Clone, Debug, PartialEq)]
pub struct Hypothesis {
    /// The new token ids (an end-of-sequence id included).
    pub tokens: Vec<u32>,
    /// Sum of the tokens' log-probabilities over `tokens.len() ^
    /// length_penalty` (transformers' `sequences_scores`).
    pub score: f32,
}

/// What a search found for one prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct BeamResult {
    /// The best `num_return_sequences` hypotheses, best first.
    pub hypotheses: Vec<Hypothesis>,
    /// Steps the search ran: tokens chosen per beam before it stopped.
    pub steps: usize,
}

/// Beam search from `prompt`. Uses KV slots `0..2 * num_beams` (cleared
/// first).
pub fn beam_search(model: &mut Model, prompt: &[u32], opts: &BeamOptions) -> Result<BeamResult> {
    let mut out = beam_search_batch(model, &[prompt.to_vec()], opts)?;
    Ok(out.remove(0))
}

/// Beam search from several prompts at once: the prompts prefill together
/// in steps of at most [`PREFILL_STEP_TOKENS`] tokens (see
/// [`prefill_batch`]), then every step runs all beams of all prompts still
/// searching in one packed batch. Prompt `j` uses KV slots
/// `2 * num_beams * j..2 * num_beams * (j + 1)` (cleared first).
pub fn beam_search_batch(
    model: &mut Model,
    prompts: &[Vec<u32>],
    opts: &BeamOptions,
) -> Result<Vec<BeamResult>> {
    opts.validate()?;
    for (j, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(Error::InvalidInput(format!("prompt {j} is empty")));
        }
        // The last chosen token is never run, so the cache needs one less.
        let need = p.len() + opts.max_tokens - 1;
        if need > model.max_context() {
            return Err(Error::InvalidInput(format!(
                "prompt {j} ({} tokens) plus max_tokens {} is over the context of {} tokens",
                p.len(),
                opts.max_tokens,
                model.max_context()
            )));
        }
    }
    let k = opts.num_beams;
    let slots_per_prompt = 2 * k;
    let mut searches: Vec<Search> = (0..prompts.len())
        .map(|j| Search::new(opts, j * slots_per_prompt))
        .collect();
    for s in &searches {
        for slot in s.base..s.base + slots_per_prompt {
            model.reset_slot(slot);
        }
    }
    let prompt_chunks: Vec<SeqChunk> = searches
        .iter()
        .zip(prompts)
        .map(|(s, p)| SeqChunk {
            slot: s.slot(0),
            tokens: p.clone(),
        })
        .collect();
    let mut logits = prefill_batch(model, &prompt_chunks, PREFILL_STEP_TOKENS)?;
    loop {
        // The last step ran the searches still going, in order: one row
        // each after the prompts, one per beam after that.
        let mut row = 0;
        for s in searches.iter_mut().filter(|s| !s.done) {
            let rows = if s.first { 1 } else { s.running.len() };
            let log_probs: Vec<Vec<f32>> = (row..row + rows)
                .map(|r| log_softmax(logits.row(r)))
                .collect();
            row += rows;
            s.advance(&log_probs, opts);
            s.fork(model)?;
        }
        let mut chunks = Vec::new();
        for s in searches.iter().filter(|s| !s.done) {
            for (b, beam) in s.running.iter().enumerate() {
                chunks.push(SeqChunk {
                    slot: s.slot(b),
                    tokens: vec![*beam.tokens.last().expect("a running beam has a token")],
                });
            }
        }
        if chunks.is_empty() {
            break;
        }
        logits = model.step(&StepInput {
            chunks,
            logits: LogitsMode::Last,
        })?;
    }
    for s in &searches {
        for slot in s.base..s.base + slots_per_prompt {
            model.reset_slot(slot);
        }
    }
    Ok(searches
        .into_iter()
        .map(|s| s.into_result(opts.num_return_sequences))
        .collect())
}

/// `x - logsumexp(x)`.
fn log_softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = x.iter().map(|&v| ((v - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    x.iter().map(|&v| v - lse).collect()
}

/// A running beam: its tokens and their summed log-probability.
#[derive(Clone, Debug)]
struct Beam {
    tokens: Vec<u32>,
    score: f32,
    /// The beam of the previous step it extends.
    parent: usize,
}

/// A slot of the finished list (transformers starts it with `num_beams`
/// empty entries scored `-1e9`).
#[derive(Clone, Debug)]
struct Finished {
    tokens: Vec<u32>,
    score: f32,
    finished: bool,
}

/// The search for one prompt.
struct Search {
    /// First KV slot of the prompt's two banks of `num_beams`.
    base: usize,
    /// Which bank the running beams' slots are in.
    bank: usize,
    running: Vec<Beam>,
    finished: Vec<Finished>,
    /// Tokens generated so far by every running beam.
    generated: usize,
    /// transformers' `is_early_stop_heuristic_unsatisfied`.
    improvable: bool,
    /// Before the first step every beam is the prompt, in slot 0.
    first: bool,
    done: bool,
}

impl Search {
    fn new(opts: &BeamOptions, base: usize) -> Self {
        let k = opts.num_beams;
        Search {
            base,
            bank: 0,
            running: (0..k)
                .map(|b| Beam {
                    tokens: Vec::new(),
                    score: if b == 0 { 0.0 } else { MASK },
                    parent: 0,
                })
                .collect(),
            finished: vec![
                Finished {
                    tokens: Vec::new(),
                    score: MASK,
                    finished: false,
                };
                k
            ],
            generated: 0,
            improvable: true,
            first: true,
            done: false,
        }
    }

    /// The KV slot of running beam `b`.
    fn slot(&self, b: usize) -> usize {
        self.base + self.bank * self.running.len() + b
    }

    /// One step of the search from the log-probabilities of the running
    /// beams' next token (only the first beam's at the first step).
    fn advance(&mut self, log_probs: &[Vec<f32>], opts: &BeamOptions) {
        let k = opts.num_beams;
        let vocab = log_probs[0].len();
        let row = |b: usize| {
            if self.first {
                &log_probs[0]
            } else {
                &log_probs[b]
            }
        };
        let total: Vec<f32> = (0..k)
            .flat_map(|b| {
                let score = self.running[b].score;
                row(b).iter().map(move |&lp| score + lp)
            })
            .collect();
        let top = top_indices(&total, opts.candidates());
        let last_step = self.generated + 1 >= opts.max_tokens;
        let cands: Vec<Candidate> = top
            .iter()
            .map(|&i| {
                let (beam, token) = (i / vocab, (i % vocab) as u32);
                Candidate {
                    beam,
                    token,
                    score: total[i],
                    ends: last_step || opts.eos_ids.contains(&token),
                }
            })
            .collect();

        // The best candidates that do not end run on.
        let run_scores: Vec<f32> = cands
            .iter()
            .map(|c| c.score + if c.ends { MASK } else { -0.0 })
            .collect();
        let next: Vec<Beam> = top_indices(&run_scores, k)
            .into_iter()
            .map(|i| {
                let c = &cands[i];
                let mut tokens = self.running[c.beam].tokens.clone();
                tokens.push(c.token);
                Beam {
                    tokens,
                    score: run_scores[i],
                    parent: c.beam,
                }
            })
            .collect();

        // Candidates among the best `k` that end join the finished list.
        let denom = ((self.generated + 1) as f64).powf(opts.length_penalty as f64) as f32;
        let all_finished = self.finished.iter().all(|f| f.finished);
        let full = all_finished && opts.early_stopping == EarlyStopping::WhenFull;
        let mut merged = self.finished.clone();
        for (i, c) in cands.iter().enumerate() {
            let just_finished = c.ends && i < k;
            let mut score = c.score / denom;
            score += if full { MASK } else { -0.0 };
            score += if self.improvable { -0.0 } else { MASK };
            score += if just_finished { -0.0 } else { MASK };
            let mut tokens = self.running[c.beam].tokens.clone();
            tokens.push(c.token);
            merged.push(Finished {
                tokens,
                score,
                finished: just_finished,
            });
        }
        let scores: Vec<f32> = merged.iter().map(|f| f.score).collect();
        self.finished = top_indices(&scores, k)
            .into_iter()
            .map(|i| merged[i].clone())
            .collect();

        self.running = next;
        self.generated += 1;
        let best_len = if opts.early_stopping == EarlyStopping::Never && opts.length_penalty > 0.0 {
            opts.max_tokens
        } else {
            self.generated
        };
        let best_possible =
            self.running[0].score / (best_len as f64).powf(opts.length_penalty as f64) as f32;
        let worst = self
            .finished
            .iter()
            .map(|f| f.score)
            .fold(f32::INFINITY, f32::min);
        self.improvable &= self
            .finished
            .iter()
            .any(|f| best_possible > if f.finished { worst } else { MASK });
        let all_finished = self.finished.iter().all(|f| f.finished);
        let open = !(all_finished && opts.early_stopping == EarlyStopping::WhenFull);
        let can_continue = !cands.iter().all(|c| c.ends);
        self.done = !(self.improvable && open && can_continue);
    }

    /// Moves the running beams into the other bank: each forks the slot of
    /// the beam it extends; the old bank is cleared.
    fn fork(&mut self, model: &mut Model) -> Result<()> {
        let k = self.running.len();
        let old = |s: &Self, b: usize| if s.first { s.slot(0) } else { s.slot(b) };
        let old_slots: Vec<usize> = (0..k).map(|b| old(self, b)).collect();
        self.first = false;
        if self.done {
            for &slot in &old_slots {
                model.reset_slot(slot);
            }
            return Ok(());
        }
        let new_base = self.base + (1 - self.bank) * k;
        for (b, beam) in self.running.iter().enumerate() {
            let from = old_slots[beam.parent];
            model.copy_slot(from, new_base + b, model.slot_len(from))?;
        }
        for b in 0..k {
            model.reset_slot(self.base + self.bank * k + b);
        }
        self.bank = 1 - self.bank;
        Ok(())
    }

    fn into_result(self, n: usize) -> BeamResult {
        BeamResult {
            hypotheses: self
                .finished
                .into_iter()
                .take(n)
                .map(|f| Hypothesis {
                    tokens: f.tokens,
                    score: f.score,
                })
                .collect(),
            steps: self.generated,
        }
    }
}

/// A continuation considered at one step.
struct Candidate {
    beam: usize,
    token: u32,
    score: f32,
    /// It ends the hypothesis (an end-of-sequence id, or the last token
    /// the budget allows).
    ends: bool,
}

/// Indices of the `n` largest values, largest first (earlier index first
/// among equal values).
fn top_indices(values: &[f32], n: usize) -> Vec<usize> {
    let n = n.min(values.len());
    let mut idx: Vec<usize> = (0..values.len()).collect();
    let order = |a: &usize, b: &usize| values[*b].total_cmp(&values[*a]).then(a.cmp(b));
    if n < idx.len() {
        idx.select_nth_unstable_by(n, order);
        idx.truncate(n);
    }
    idx.sort_unstable_by(order);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_indices_are_sorted_with_ties_in_index_order() {
        let v = [0.5, 2.0, -1.0, 2.0, 0.5, 3.0];
        assert_eq!(top_indices(&v, 4), vec![5, 1, 3, 0]);
        assert_eq!(top_indices(&v, 10), vec![5, 1, 3, 0, 4, 2]);
        assert_eq!(top_indices(&v, 0), Vec::<usize>::new());
    }

    #[test]
    fn log_softmax_sums_to_one() {
        let lp = log_softmax(&[1.0, 2.0, 3.0, -50.0]);
        let total: f64 = lp.iter().map(|&v| (v as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert!((lp[2] - lp[1] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn bad_options_are_named_errors() {
        let check = |opts: BeamOptions, want: &str| {
            assert_eq!(opts.validate().unwrap_err().to_string(), want);
        };
        let base = BeamOptions::default();
        check(
            BeamOptions {
                num_beams: 0,
                ..base.clone()
            },
            "invalid input: num_beams must be at least 1",
        );
        check(
            BeamOptions {
                num_return_sequences: 5,
                ..base.clone()
            },
            "invalid input: num_return_sequences must be between 1 and num_beams (4), not 5",
        );
        check(
            BeamOptions {
                max_tokens: 0,
                ..base.clone()
            },
            "invalid input: max_tokens must be at least 1 for beam search",
        );
        check(
            BeamOptions {
                length_penalty: f32::NAN,
                ..base
            },
            "invalid input: length_penalty must be finite, not NaN",
        );
        assert_eq!(
            "sometimes"
                .parse::<EarlyStopping>()
                .unwrap_err()
                .to_string(),
            "invalid input: early stopping must be false, true or never, not \"sometimes\""
        );
    }
}
