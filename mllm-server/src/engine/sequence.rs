//! One admitted request: its progress through the prompt, its sampler and
//! penalties, the text released so far and the channel to its client.

use std::collections::HashMap;
use std::time::Instant;

use mllm_core::Result;
use mllm_models::{Sampler, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use super::request::{Event, FinishReason, GenRequest, TokenLogprob, Usage};
use crate::metrics::Metrics;
use mllm_models::text::{IncrementalDecoder, StopMatcher};

/// A request holding a KV-cache slot.
pub struct Sequence {
    /// The KV-cache slot.
    pub slot: usize,
    /// The request.
    pub req: GenRequest,
    /// Prompt tokens in the cache (reused or prefilled).
    pub prefilled: usize,
    /// Prompt tokens reused from the slot's earlier contents.
    pub reused: usize,
    /// Leading prompt tokens a later prompt may reuse (see
    /// `slots::reusable_chunk`).
    pub reusable: usize,
    /// The sampled token that the next step feeds.
    pub pending: Option<u32>,
    /// Tokens the slot's cache holds, in order.
    pub cached: Vec<u32>,
    generated: Vec<u32>,
    history: Vec<u32>,
    sampler: Sampler,
    counts: HashMap<u32, u32>,
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    events: UnboundedSender<Event>,
    arrived: Instant,
    last_token: Option<Instant>,
    scratch: Vec<f32>,
}

/// What the sequence does after a token.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Feed the pending token in the next step.
    Continue,
    /// The reply is complete.
    Finished(FinishReason),
}

impl Sequence {
    /// A sequence in `slot` whose cache already holds `reused` prompt
    /// tokens, sampling with `sampler` (made from `req.sampling`).
    pub fn new(
        slot: usize,
        reused: usize,
        req: GenRequest,
        sampler: Sampler,
        events: UnboundedSender<Event>,
        arrived: Instant,
    ) -> Self {
        Sequence {
            slot,
            prefilled: reused,
            reused,
            reusable: reused,
            pending: None,
            cached: req.prompt[..reused].to_vec(),
            generated: Vec::new(),
            history: req.prompt.clone(),
            sampler,
            counts: HashMap::new(),
            decoder: IncrementalDecoder::new(),
            stops: StopMatcher::new(req.stop.clone()),
            req,
            events,
            arrived,
            last_token: None,
            scratch: Vec::new(),
        }
    }

    /// Whether the client stopped listening.
    pub fn client_gone(&self) -> bool {
        self.events.is_closed()
    }

    /// Token counts so far.
    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.req.prompt.len(),
            completion_tokens: self.generated.len(),
            cached_tokens: self.reused,
        }
    }

    /// Sends an event to the client (a closed channel is noticed before the
    /// next step).
    pub fn send(&self, event: Event) {
        let _ = self.events.send(event);
    }

    /// Chooses the next token from `logits` (the row of this sequence's
    /// last fed token) and streams what it completes. `room` is how many
    /// more tokens the slot can take.
    pub fn on_logits(
        &mut self,
        logits: &[f32],
        tokenizer: &Tokenizer,
        eos: &[u32],
        room: usize,
        metrics: &Metrics,
    ) -> Result<Next> {
        let row = penalized(logits, &self.req, &self.counts, &mut self.scratch);
        let id = self.sampler.sample(row, &self.history)?;
        let now = Instant::now();
        match self.last_token {
            None => metrics.time_to_first_token.observe(now - self.arrived),
            Some(t) => metrics.inter_token_latency.observe(now - t),
        }
        self.last_token = Some(now);
        crate::metrics::add(&metrics.completion_tokens, 1);
        self.generated.push(id);
        self.history.push(id);
        *self.counts.entry(id).or_insert(0) += 1;
        let logprobs = match self.req.logprobs {
            Some(top) => vec![token_logprob(logits, id, top)],
            None => Vec::new(),
        };
        if eos.contains(&id) && !self.req.ignore_eos {
            let held = self.stops.finish();
            self.emit(held, logprobs);
            return Ok(Next::Finished(FinishReason::Stop));
        }
        let piece = self.decoder.push(tokenizer, id)?;
        let released = self.stops.push(&piece);
        if released.stopped {
            self.emit(released.text, logprobs);
            return Ok(Next::Finished(FinishReason::Stop));
        }
        let mut text = released.text;
        if self.generated.len() >= self.req.max_tokens || room == 0 {
            text.push_str(&self.stops.finish());
            self.emit(text, logprobs);
            return Ok(Next::Finished(FinishReason::Length));
        }
        self.emit(text, logprobs);
        self.pending = Some(id);
        Ok(Next::Continue)
    }

    fn emit(&self, text: String, logprobs: Vec<TokenLogprob>) {
        if !text.is_empty() || !logprobs.is_empty() {
            self.send(Event::Delta { text, logprobs });
        }
    }
}

/// `logits` with the presence and frequency penalties of `req` applied
/// for the generated-token `counts` (`logits` itself when both are off).
fn penalized<'a>(
    logits: &'a [f32],
    req: &GenRequest,
    counts: &HashMap<u32, u32>,
    scratch: &'a mut Vec<f32>,
) -> &'a [f32] {
    let (presence, frequency) = (req.presence_penalty, req.frequency_penalty);
    if (presence == 0.0 && frequency == 0.0) || counts.is_empty() {
        return logits;
    }
    scratch.clear();
    scratch.extend_from_slice(logits);
    for (&id, &n) in counts {
        if let Some(v) = scratch.get_mut(id as usize) {
            *v -= presence + frequency * n as f32;
        }
    }
    scratch
}

/// The log-probability of `id` under `logits` and the `top` most likely
/// tokens (ties broken by the lower id).
pub fn token_logprob(logits: &[f32], id: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&x| f64::from(x - max).exp()).sum();
    let lse = max + sum.ln() as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &x) in logits.iter().enumerate() {
            if best.len() < top || x > best[best.len() - 1].1 {
                let at = best.partition_point(|&(_, y)| y >= x);
                best.insert(at, (i as u32, x));
                best.truncate(top);
            }
        }
    }
    TokenLogprob {
        id,
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&x| x - lse),
        top: best.into_iter().map(|(i, x)| (i, x - lse)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_log_softmax_with_sorted_alternatives() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let z: f64 = logits.iter().map(|&x| f64::from(x).exp()).sum();
        let lp = |x: f32| (f64::from(x) - z.ln()) as f32;
        let t = token_logprob(&logits, 2, 3);
        assert_eq!(t.id, 2);
        assert!((t.logprob - lp(2.0)).abs() < 1e-6);
        let ids: Vec<u32> = t.top.iter().map(|p| p.0).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        assert!((t.top[0].1 - lp(3.0)).abs() < 1e-6);
        assert!(token_logprob(&logits, 0, 0).top.is_empty());
    }
}
