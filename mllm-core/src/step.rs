//! What one executor step runs on: a batch of sequences, each with new tokens.

use crate::{Error, Result};

/// New tokens for one sequence. `slot` names the sequence's KV-cache slot;
/// the tokens continue whatever that slot already holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqChunk {
    /// KV-cache slot of the sequence.
    pub slot: usize,
    /// Token ids to append (at least one).
    pub tokens: Vec<u32>,
}

/// Which positions get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LogitsMode {
    /// Only the last new token of each sequence (generation).
    Last,
    /// Every new token (perplexity, logit dumps).
    All,
}

/// The input of one step: several sequences of possibly different lengths,
/// packed without padding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepInput {
    /// One chunk per sequence; slots must be distinct.
    pub chunks: Vec<SeqChunk>,
    /// Which positions get logits.
    pub logits: LogitsMode,
}

impl StepInput {
    /// A single-sequence step.
    pub fn single(slot: usize, tokens: Vec<u32>, logits: LogitsMode) -> Self {
        StepInput {
            chunks: vec![SeqChunk { slot, tokens }],
            logits,
        }
    }
}

/// Where one sequence's tokens sit in a packed step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqSpan {
    /// KV-cache slot.
    pub slot: usize,
    /// Index of the sequence's first token in the packed batch.
    pub start: usize,
    /// Number of new tokens.
    pub len: usize,
    /// Tokens the slot held before this step (the first new token's position).
    pub past: usize,
}

/// The packed layout of a step that every op sees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepLayout {
    /// All new token ids, sequence after sequence.
    pub token_ids: Vec<u32>,
    /// The position of each new token within its sequence.
    pub positions: Vec<usize>,
    /// One span per sequence, in input order.
    pub seqs: Vec<SeqSpan>,
    /// Which positions get logits.
    pub logits: Option<LogitsMode>,
}

impl StepLayout {
    /// Packs a step given each slot's current length, checking that every
    /// sequence fits in `max_context` positions.
    pub fn pack(
        input: &StepInput,
        slot_len: impl Fn(usize) -> usize,
        max_context: usize,
    ) -> Result<Self> {
        if input.chunks.is_empty() {
            return Err(Error::InvalidInput(
                "a step needs at least one sequence".into(),
            ));
        }
        let mut layout = StepLayout {
            logits: Some(input.logits),
            ..Default::default()
        };
        for chunk in &input.chunks {
            if chunk.tokens.is_empty() {
                return Err(Error::InvalidInput(format!(
                    "sequence in slot {} has no tokens",
                    chunk.slot
                )));
            }
            if layout.seqs.iter().any(|s| s.slot == chunk.slot) {
                return Err(Error::InvalidInput(format!(
                    "slot {} appears twice in one step",
                    chunk.slot
                )));
            }
            let past = slot_len(chunk.slot);
            let needed = past + chunk.tokens.len();
            if needed > max_context {
                return Err(Error::ContextFull {
                    slot: chunk.slot,
                    needed,
                    limit: max_context,
                });
            }
            layout.seqs.push(SeqSpan {
                slot: chunk.slot,
                start: layout.token_ids.len(),
                len: chunk.tokens.len(),
                past,
            });
            layout.token_ids.extend_from_slice(&chunk.tokens);
            layout.positions.extend(past..needed);
        }
        Ok(layout)
    }

    /// Number of new tokens in the step.
    pub fn n_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Number of logits rows the step produces.
    pub fn logits_rows(&self) -> usize {
        match self.logits {
            Some(LogitsMode::Last) => self.seqs.len(),
            _ => self.n_tokens(),
        }
    }
}
