//! Prompts into the KV cache in steps of a bounded number of tokens, for
//! one sequence or several packed together, with the same logits and cache
//! as one step over everything.
//!
//! A step's activations take memory in proportion to its tokens, so a long
//! prompt (or many prompts) in one step can take far more than the model.
//! Each row gets the same bits whichever other rows share its step (batch
//! invariance), but a sequence with a single token in a step takes the
//! decode attention kernel, whose sums run in another order than the tiled
//! prefill kernel's. The steps here never give a longer prompt a step of
//! one token, so cutting changes nothing but the peak memory.

use std::ops::Range;

use mllm_core::{Error, LogitsMode, Result, SeqChunk, StepInput, Tensor};

use crate::model::Model;

/// Prompt tokens per prefill step of the generation loops (llama.cpp's
/// default micro-batch): a long prompt's activations take the memory of
/// this many tokens, not of the whole prompt.
pub const PREFILL_STEP_TOKENS: usize = 512;

/// The token ranges of a prefill of `len` tokens in steps of at most
/// `step_tokens` (at least two): a last step of one token joins the step
/// before it, which then takes `step_tokens + 1` (the rule of
/// [`prefill_batch`] for one sequence).
pub fn prefill_steps(len: usize, step_tokens: usize) -> impl Iterator<Item = Range<usize>> {
    let step_tokens = step_tokens.max(2);
    let mut done = 0;
    std::iter::from_fn(move || {
        let (_, range) = batch_step(&[len], &[done], step_tokens).pop()?;
        done = range.end;
        Some(range)
    })
}

/// Appends `tokens` to the sequence in `slot` in steps of at most
/// `step_tokens` (at least two; see [`prefill_steps`]) and returns the
/// logits `mode` asks for: the last token's row, or one row per token.
/// The logits and the cache are those of one step over all the tokens. A
/// prompt that does not fit the context fails before any step.
pub fn prefill(
    model: &mut Model,
    slot: usize,
    tokens: &[u32],
    mode: LogitsMode,
    step_tokens: usize,
) -> Result<Tensor> {
    check_step_tokens(step_tokens)?;
    check_context(model, slot, tokens.len())?;
    let mut out: Option<Tensor> = None;
    for range in prefill_steps(tokens.len(), step_tokens) {
        let input = StepInput::single(slot, tokens[range].to_vec(), mode);
        let more = model.step(&input)?;
        out = Some(match (out, mode) {
            (Some(before), LogitsMode::All) => {
                let cols = before.shape().last();
                let mut data = before.into_data();
                data.extend_from_slice(more.data());
                Tensor::new([data.len() / cols, cols], data)?
            }
            _ => more,
        });
    }
    out.ok_or_else(|| Error::InvalidInput("the prompt is empty".into()))
}

/// Appends each of `seqs`' tokens to the sequence in its slot, packed into
/// steps of about `step_tokens` tokens in all (at least two; a step may
/// take one more so that no sequence is left with a single token), and
/// returns the last token's logits of each sequence, one row per entry of
/// `seqs` in their order. Logits and caches are those of one step over all
/// of `seqs`. Empty sequences, a slot given twice and a sequence over the
/// context fail before any step.
pub fn prefill_batch(model: &mut Model, seqs: &[SeqChunk], step_tokens: usize) -> Result<Tensor> {
    check_step_tokens(step_tokens)?;
    for (i, seq) in seqs.iter().enumerate() {
        if seq.tokens.is_empty() {
            return Err(Error::InvalidInput(format!(
                "the prompt in slot {} is empty",
                seq.slot
            )));
        }
        if seqs[..i].iter().any(|s| s.slot == seq.slot) {
            return Err(Error::InvalidInput(format!(
                "slot {} is given two prompts",
                seq.slot
            )));
        }
        check_context(model, seq.slot, seq.tokens.len())?;
    }
    let lens: Vec<usize> = seqs.iter().map(|s| s.tokens.len()).collect();
    let mut last_rows: Vec<Vec<f32>> = vec![Vec::new(); seqs.len()];
    let mut done = vec![0usize; seqs.len()];
    loop {
        let cut = batch_step(&lens, &done, step_tokens);
        if cut.is_empty() {
            break;
        }
        let chunks = cut
            .iter()
            .map(|&(i, ref range)| SeqChunk {
                slot: seqs[i].slot,
                tokens: seqs[i].tokens[range.clone()].to_vec(),
            })
            .collect();
        let out = model.step(&StepInput {
            chunks,
            logits: LogitsMode::Last,
        })?;
        for (row, (i, range)) in cut.into_iter().enumerate() {
            done[i] = range.end;
            if range.end == lens[i] {
                last_rows[i] = out.row(row).to_vec();
            }
        }
    }
    let cols = last_rows.first().map_or(model.vocab_size(), Vec::len);
    Tensor::new([seqs.len(), cols], last_rows.concat())
}

/// The next step of a batch prefill of sequences of `lens` tokens:
/// `(sequence, token range)` pairs, taking the sequences in order from the
/// `done` tokens of each, about `step_tokens` tokens in all. No sequence of
/// two or more tokens gets a step of one (a sequence's last two tokens go
/// in one step); empty when all is done.
fn batch_step(lens: &[usize], done: &[usize], step_tokens: usize) -> Vec<(usize, Range<usize>)> {
    let mut cut = Vec::new();
    let mut rows = 0;
    let waiting = lens
        .iter()
        .zip(done)
        .enumerate()
        .filter(|(_, (&len, &from))| from < len);
    for (i, (&len, &from)) in waiting {
        let rest = len - from;
        let mut take = rest.min(step_tokens.saturating_sub(rows));
        // Nothing fits, or only one token of a longer sequence.
        if take < rest.min(2) {
            break;
        }
        if rest - take == 1 {
            take = rest;
        }
        cut.push((i, from..from + take));
        rows += take;
    }
    cut
}

/// Fails unless a prefill step of `step_tokens` keeps to the prefill kernels.
fn check_step_tokens(step_tokens: usize) -> Result<()> {
    if step_tokens < 2 {
        return Err(Error::InvalidInput(format!(
            "a prefill step must take at least two tokens, not {step_tokens}"
        )));
    }
    Ok(())
}

/// Fails when `new_tokens` more do not fit the sequence in `slot`.
fn check_context(model: &Model, slot: usize, new_tokens: usize) -> Result<()> {
    let needed = model.slot_len(slot) + new_tokens;
    if needed > model.max_context() {
        return Err(Error::ContextFull {
            slot,
            needed,
            limit: model.max_context(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every step of a batch prefill of sequences of `lens` tokens.
    fn batch_steps(lens: &[usize], step_tokens: usize) -> Vec<Vec<(usize, Range<usize>)>> {
        let mut done = vec![0; lens.len()];
        let mut steps = Vec::new();
        loop {
            let cut = batch_step(lens, &done, step_tokens);
            if cut.is_empty() {
                return steps;
            }
            for (i, r) in &cut {
                assert_eq!(r.start, done[*i], "a step continues where the last ended");
                done[*i] = r.end;
            }
            steps.push(cut);
        }
    }

    #[test]
    fn single_prefill_steps_never_leave_one_token() {
        let bounds = |len, step_tokens| {
            prefill_steps(len, step_tokens)
                .map(|r| (r.start, r.end))
                .collect::<Vec<_>>()
        };
        assert_eq!(bounds(10, 4), [(0, 4), (4, 8), (8, 10)]);
        assert_eq!(bounds(9, 4), [(0, 4), (4, 9)]);
        assert_eq!(bounds(5, 4), [(0, 5)]);
        assert_eq!(bounds(1, 4), [(0, 1)]);
        assert_eq!(bounds(0, 4), []);
    }

    #[test]
    fn batch_steps_pack_sequences_in_order() {
        assert_eq!(
            batch_steps(&[6, 3, 6], 4),
            [
                vec![(0, 0..4)],
                vec![(0, 4..6), (1, 0..3)],
                vec![(2, 0..4)],
                vec![(2, 4..6)],
            ]
            .map(|s| s.into_iter().collect::<Vec<_>>())
        );
        assert_eq!(batch_steps(&[2, 2], 100), [vec![(0, 0..2), (1, 0..2)]]);
    }

    #[test]
    fn batch_steps_leave_no_sequence_with_one_token() {
        for step_tokens in 2..9 {
            for lens in [
                vec![1],
                vec![1, 1],
                vec![4, 1],
                vec![3, 1, 1],
                vec![7, 2, 1, 9],
                vec![5, 5, 5],
                vec![1, 8, 1],
            ] {
                let steps = batch_steps(&lens, step_tokens);
                let mut covered = vec![0; lens.len()];
                for step in &steps {
                    let rows: usize = step.iter().map(|(_, r)| r.len()).sum();
                    assert!(rows <= step_tokens + 1, "{lens:?}: {steps:?}");
                    for (i, r) in step {
                        assert!(
                            r.len() >= 2 || lens[*i] == 1,
                            "{lens:?} in steps of {step_tokens}: one token of a longer prompt {steps:?}"
                        );
                        covered[*i] += r.len();
                    }
                }
                assert_eq!(covered, lens, "every token once");
            }
        }
    }
}
