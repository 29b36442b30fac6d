//! Generation loops: prefill the prompt, then decode token by token with a
//! [`Sampler`], for one sequence or a batch of prompts of different lengths.

use mllm_core::{Error, LogitsMode, Result, SeqChunk, StepInput, Tensor};

use crate::model::Model;
use crate::prefill::{prefill, prefill_batch, PREFILL_STEP_TOKENS};
use crate::sampling::{Sampler, SamplingParams};

/// How to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Most new tokens to produce.
    pub max_tokens: usize,
    /// Sampling settings (temperature 0 is greedy).
    pub sampling: SamplingParams,
    /// Stop when one of these ids is produced (it is kept in the output).
    pub eos_ids: Vec<u32>,
    /// Keep the logits of every prompt position in [`Generation::prompt_logits`].
    pub keep_prompt_logits: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 32,
            sampling: SamplingParams::default(),
            eos_ids: Vec::new(),
            keep_prompt_logits: false,
        }
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-sequence token was produced.
    Eos,
    /// `max_tokens` were produced.
    MaxTokens,
    /// The sequence filled the model's context.
    ContextFull,
    /// The token callback asked to stop.
    Callback,
}

/// The result of generating for one prompt.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The new token ids.
    pub tokens: Vec<u32>,
    /// Why it ended.
    pub stop: StopReason,
    /// Logits of every prompt position, when asked for.
    pub prompt_logits: Option<Tensor>,
}

/// Generates a continuation of `prompt` in KV slot 0 (cleared first).
///
/// `on_token` sees each new id as soon as it is chosen and returns `false`
/// to stop early.
pub fn generate(
    model: &mut Model,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
) -> Result<Generation> {
    model.reset_slot(0);
    continue_sequence(model, 0, prompt, opts, on_token)
}

/// Appends `new_tokens` to the sequence already in `slot` and generates from
/// there (multi-turn chat keeps the cache and prefills only the new turn).
pub fn continue_sequence(
    model: &mut Model,
    slot: usize,
    new_tokens: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
) -> Result<Generation> {
    if new_tokens.is_empty() {
        return Err(Error::InvalidInput("the prompt is empty".into()));
    }
    let mut sampler = Sampler::new(opts.sampling)?;
    let mode = if opts.keep_prompt_logits {
        LogitsMode::All
    } else {
        LogitsMode::Last
    };
    let prefilled = prefill(model, slot, new_tokens, mode, PREFILL_STEP_TOKENS)?;
    let mut history = new_tokens.to_vec();
    let mut logits = prefilled.row(prefilled.rows() - 1).to_vec();
    let prompt_logits = opts.keep_prompt_logits.then_some(prefilled);
    let mut tokens = Vec::new();
    let stop = loop {
        if tokens.len() == opts.max_tokens {
            break StopReason::MaxTokens;
        }
        let next = sampler.sample(&logits, &history)?;
        tokens.push(next);
        history.push(next);
        if !on_token(next)? {
            break StopReason::Callback;
        }
        if opts.eos_ids.contains(&next) {
            break StopReason::Eos;
        }
        if tokens.len() == opts.max_tokens {
            break StopReason::MaxTokens;
        }
        if model.slot_len(slot) >= model.max_context() {
            break StopReason::ContextFull;
        }
        let out = model.step(&StepInput::single(slot, vec![next], LogitsMode::Last))?;
        logits = out.row(0).to_vec();
    };
    Ok(Generation {
        tokens,
        stop,
        prompt_logits,
    })
}

/// Generates for several prompts at once: a packed prefill of all prompts
/// in steps of at most [`PREFILL_STEP_TOKENS`] tokens (see
/// [`prefill_batch`]; no padding, each keeps its own positions and KV
/// length), then batched decode steps until each sequence stops. Uses KV slots `0..prompts.len()`.
///
/// Each sequence samples with its own RNG seeded `seed + index`.
pub fn generate_batch(
    model: &mut Model,
    prompts: &[Vec<u32>],
    opts: &GenerateOptions,
) -> Result<Vec<Generation>> {
    if prompts.is_empty() {
        return Ok(Vec::new());
    }
    let mut samplers = prompts
        .iter()
        .enumerate()
        .map(|(i, _)| {
            let mut params = opts.sampling;
            params.seed = params.seed.wrapping_add(i as u64);
            Sampler::new(params)
        })
        .collect::<Result<Vec<_>>>()?;
    for (slot, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(Error::InvalidInput(format!("prompt {slot} is empty")));
        }
        model.reset_slot(slot);
    }
    let mut histories: Vec<Vec<u32>> = prompts.to_vec();
    let mut outputs: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut stops: Vec<Option<StopReason>> = vec![None; prompts.len()];
    let mut chunks: Vec<SeqChunk> = prompts
        .iter()
        .enumerate()
        .map(|(slot, p)| SeqChunk {
            slot,
            tokens: p.clone(),
        })
        .collect();
    // Row `r` of `logits` belongs to `chunks[r]`.
    let mut logits = prefill_batch(model, &chunks, PREFILL_STEP_TOKENS)?;
    loop {
        let mut next_chunks = Vec::new();
        for (row, chunk) in chunks.iter().enumerate() {
            let i = chunk.slot;
            if outputs[i].len() == opts.max_tokens {
                stops[i] = Some(StopReason::MaxTokens);
                continue;
            }
            let next = samplers[i].sample(logits.row(row), &histories[i])?;
            outputs[i].push(next);
            histories[i].push(next);
            if opts.eos_ids.contains(&next) {
                stops[i] = Some(StopReason::Eos);
            } else if outputs[i].len() == opts.max_tokens {
                stops[i] = Some(StopReason::MaxTokens);
            } else if model.slot_len(i) >= model.max_context() {
                stops[i] = Some(StopReason::ContextFull);
            } else {
                next_chunks.push(SeqChunk {
                    slot: i,
                    tokens: vec![next],
                });
            }
        }
        if next_chunks.is_empty() {
            break;
        }
        logits = model.step(&StepInput {
            chunks: next_chunks.clone(),
            logits: LogitsMode::Last,
        })?;
        chunks = next_chunks;
    }
    Ok(outputs
        .into_iter()
        .zip(stops)
        .map(|(tokens, stop)| Generation {
            tokens,
            stop: stop.unwrap_or(StopReason::MaxTokens),
            prompt_logits: None,
        })
        .collect())
}
