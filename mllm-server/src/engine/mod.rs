//! The engine: one thread owns the [`Model`] and runs steps. Each step packs
//! the pending token of every decoding sequence with prefill chunks of
//! admitted prompts (continuous batching); requests join between steps, and
//! a sequence that finishes or whose client goes away frees its slot at
//! once. The engine knows nothing of HTTP: requests arrive as
//! [`GenRequest`]s and answers leave as [`Event`]s on a channel.

mod request;
pub mod scheduler;
mod sequence;
pub mod slots;

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use mllm_core::{LogitsMode, SeqChunk, StepInput};
use mllm_models::{Model, Sampler, Tokenizer};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

pub use request::{Event, FinishReason, GenRequest, TokenLogprob, Usage};

use crate::metrics::{add, Metrics};
use scheduler::{plan_step, Progress, Work};
use sequence::{Next, Sequence};
use slots::{reusable_chunk, Slots};

/// How the engine batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Sequences that run at once (KV-cache slots).
    pub parallel: usize,
    /// Most tokens one step feeds to the model.
    pub max_batch_tokens: usize,
    /// Prompts are prefilled in chunks ending at multiples of this length.
    pub prefill_chunk: usize,
    /// Requests that may wait for a slot; more are refused.
    pub max_queue: usize,
}

impl EngineConfig {
    /// Checks that every step can advance a prompt: the budget must hold one
    /// token per running sequence plus a whole prefill chunk.
    pub fn validate(&self) -> Result<(), String> {
        if self.parallel == 0 {
            return Err("--parallel must be at least 1".into());
        }
        if self.prefill_chunk == 0 {
            return Err("--prefill-chunk must be at least 1".into());
        }
        if self.max_batch_tokens < self.parallel + self.prefill_chunk {
            return Err(format!(
                "--max-batch-tokens ({}) must be at least --parallel ({}) plus --prefill-chunk ({})",
                self.max_batch_tokens, self.parallel, self.prefill_chunk
            ));
        }
        Ok(())
    }
}

/// Why a request was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// `max_queue` requests are already waiting.
    QueueFull,
    /// The engine thread has stopped.
    Stopped,
}

struct Submission {
    req: GenRequest,
    events: UnboundedSender<Event>,
    arrived: Instant,
}

/// The handle requests are submitted through (cheap to clone).
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Submission>,
    max_queue: usize,
    metrics: Arc<Metrics>,
}

impl EngineHandle {
    /// Queues `req`; its events arrive on the returned receiver. Dropping
    /// the receiver cancels the request and frees its slot.
    pub fn submit(&self, req: GenRequest) -> Result<UnboundedReceiver<Event>, SubmitError> {
        let waiting = &self.metrics.queue_length;
        let admitted = waiting.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < self.max_queue as u64).then_some(n + 1)
        });
        if admitted.is_err() {
            add(&self.metrics.rejected_queue_full, 1);
            return Err(SubmitError::QueueFull);
        }
        let (events, rx) = unbounded_channel();
        let sub = Submission {
            req,
            events,
            arrived: Instant::now(),
        };
        self.tx.send(sub).map_err(|_| {
            waiting.fetch_sub(1, Ordering::AcqRel);
            SubmitError::Stopped
        })?;
        Ok(rx)
    }
}

/// Starts the engine thread on `model`, whose text `tokenizer` decodes.
pub fn start(
    model: Model,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
    metrics: Arc<Metrics>,
) -> Result<EngineHandle, String> {
    config.validate()?;
    let (tx, rx) = mpsc::channel();
    let engine = Engine {
        eos: model.eos_ids(),
        model,
        tokenizer,
        config,
        slots: Slots::new(config.parallel, config.prefill_chunk),
        running: Vec::new(),
        waiting: VecDeque::new(),
        rx,
        metrics: metrics.clone(),
    };
    std::thread::Builder::new()
        .name("mllm-engine".into())
        .spawn(move || engine.run())
        .map_err(|e| format!("cannot start the engine thread: {e}"))?;
    Ok(EngineHandle {
        tx,
        max_queue: config.max_queue,
        metrics,
    })
}

struct Engine {
    model: Model,
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    config: EngineConfig,
    slots: Slots,
    running: Vec<Sequence>,
    waiting: VecDeque<Submission>,
    rx: mpsc::Receiver<Submission>,
    metrics: Arc<Metrics>,
}

impl Engine {
    fn run(mut self) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                match self.rx.recv() {
                    Ok(sub) => self.waiting.push_back(sub),
                    Err(_) => return,
                }
            }
            while let Ok(sub) = self.rx.try_recv() {
                self.waiting.push_back(sub);
            }
            self.drop_cancelled();
            self.admit();
            if !self.running.is_empty() {
                self.step();
            }
        }
    }

    /// Frees the slots of sequences whose clients went away, and forgets
    /// waiting requests whose clients went away.
    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.events.is_closed());
        let gone_waiting = before - self.waiting.len();
        self.metrics
            .queue_length
            .fetch_sub(gone_waiting as u64, Ordering::AcqRel);
        let mut i = 0;
        let mut gone = gone_waiting;
        while i < self.running.len() {
            if self.running[i].client_gone() {
                let seq = self.running.remove(i);
                self.release(seq, None);
                gone += 1;
            } else {
                i += 1;
            }
        }
        add(&self.metrics.cancelled, gone as u64);
    }

    /// Moves waiting requests into free slots, reusing cached prefixes: a
    /// free slot's, or one copied from a running sequence. A request whose
    /// prompt starts like a prompt still being prefilled waits until that
    /// part is computed instead of computing it again.
    fn admit(&mut self) {
        while let Some(sub) = self.waiting.front() {
            let prompt = &sub.req.prompt;
            let Some(free) = self.slots.best_free(prompt) else {
                return;
            };
            let donor = self.best_running_prefix(prompt);
            let available = free.reused.max(donor.map_or(0, |(_, n)| n));
            if self.coming_prefix(prompt) > available {
                return;
            }
            let sub = self.waiting.pop_front().expect("front exists");
            self.metrics.queue_length.fetch_sub(1, Ordering::AcqRel);
            let acq = self.slots.acquire(&sub.req.prompt).expect("a slot is free");
            let sampler = match Sampler::new(sub.req.sampling) {
                Ok(s) => s,
                Err(e) => {
                    let _ = sub.events.send(Event::Failed(e.to_string()));
                    self.slots.release(acq.slot, Vec::new(), 0);
                    continue;
                }
            };
            let reused = match donor {
                Some((from, n)) if n > acq.reused => self.copy_prefix(from, acq.slot, n),
                _ => {
                    self.model.truncate_slot(acq.slot, acq.reused);
                    if self.model.slot_len(acq.slot) == acq.reused {
                        acq.reused
                    } else {
                        self.model.reset_slot(acq.slot);
                        0
                    }
                }
            };
            let seq = Sequence::new(acq.slot, reused, sub.req, sampler, sub.events, sub.arrived);
            add(&self.metrics.prompt_tokens, seq.req.prompt.len() as u64);
            add(&self.metrics.prefix_reused_tokens, reused as u64);
            add(&self.metrics.active_sequences, 1);
            self.running.push(seq);
        }
    }

    /// The running sequence whose computed prompt shares the longest
    /// reusable prefix with `prompt`: its slot and that length.
    fn best_running_prefix(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        self.running
            .iter()
            .map(|seq| {
                let held = &seq.req.prompt[..seq.reusable];
                (seq.slot, self.slots.reuse_limit(held, seq.reusable, prompt))
            })
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(_, n)| n)
    }

    /// The longest prefix of `prompt` that a running sequence still
    /// prefilling will have computed once its prompt is in.
    fn coming_prefix(&self, prompt: &[u32]) -> usize {
        self.running
            .iter()
            .filter(|seq| seq.prefilled < seq.req.prompt.len())
            .map(|seq| {
                let held = &seq.req.prompt;
                self.slots.reuse_limit(held, held.len(), prompt)
            })
            .max()
            .unwrap_or(0)
    }

    /// Copies the first `n` tokens of slot `from` into slot `to`; returns
    /// how many `to` now holds (none if the copy failed).
    fn copy_prefix(&mut self, from: usize, to: usize, n: usize) -> usize {
        match self.model.copy_slot(from, to, n) {
            Ok(()) => {
                add(&self.metrics.prefix_copied_tokens, n as u64);
                n
            }
            Err(_) => {
                self.model.reset_slot(to);
                0
            }
        }
    }

    /// Runs one step over the running sequences.
    fn step(&mut self) {
        let progress: Vec<Progress> = self
            .running
            .iter()
            .map(|s| Progress {
                prompt_len: s.req.prompt.len(),
                prefilled: s.prefilled,
                decoding: s.pending.is_some(),
            })
            .collect();
        let plan = plan_step(
            &progress,
            self.config.max_batch_tokens,
            self.config.prefill_chunk,
        );
        let chunks: Vec<SeqChunk> = plan
            .iter()
            .map(|&(i, work)| {
                let seq = &self.running[i];
                let tokens = match work {
                    Work::Decode => vec![seq.pending.expect("decoding")],
                    Work::Prefill { start, end } => seq.req.prompt[start..end].to_vec(),
                };
                SeqChunk {
                    slot: seq.slot,
                    tokens,
                }
            })
            .collect();
        let n_tokens: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let input = StepInput {
            chunks,
            logits: LogitsMode::Last,
        };
        let logits = match self.model.step(&input) {
            Ok(l) => l,
            Err(e) => {
                let message = format!("the model step failed: {e}");
                let mut failed: Vec<usize> = plan.iter().map(|p| p.0).collect();
                failed.sort_unstable();
                for &i in failed.iter().rev() {
                    let seq = self.running.remove(i);
                    self.model.reset_slot(seq.slot);
                    self.slots.release(seq.slot, Vec::new(), 0);
                    self.metrics.active_sequences.fetch_sub(1, Ordering::AcqRel);
                    seq.send(Event::Failed(message.clone()));
                }
                return;
            }
        };
        add(&self.metrics.steps, 1);
        add(&self.metrics.step_tokens, n_tokens as u64);
        let mut finished = Vec::new();
        for (row, (&(i, work), chunk)) in plan.iter().zip(&input.chunks).enumerate() {
            let seq = &mut self.running[i];
            seq.cached.extend_from_slice(&chunk.tokens);
            if let Work::Prefill { start, end } = work {
                seq.prefilled = end;
                if seq.reusable == start && reusable_chunk(end - start, self.config.prefill_chunk) {
                    seq.reusable = end;
                }
                if end < seq.req.prompt.len() {
                    continue;
                }
            }
            seq.pending = None;
            let room = self.model.max_context() - self.model.slot_len(seq.slot);
            let next = seq.on_logits(
                logits.row(row),
                &self.tokenizer,
                &self.eos,
                room,
                &self.metrics,
            );
            match next {
                Ok(Next::Continue) => {}
                Ok(Next::Finished(reason)) => {
                    let usage = seq.usage();
                    finished.push((i, Event::Done { reason, usage }));
                }
                Err(e) => {
                    finished.push((i, Event::Failed(format!("sampling failed: {e}"))));
                }
            }
        }
        // Removing from the back keeps the remaining indices valid.
        finished.sort_unstable_by_key(|f| f.0);
        for (i, last) in finished.into_iter().rev() {
            let seq = self.running.remove(i);
            self.release(seq, Some(last));
        }
    }

    /// Returns a sequence's slot, keeping what its cache holds for reuse,
    /// then sends its last event: a client that sees its answer end also
    /// sees the slot free in the metrics.
    fn release(&mut self, mut seq: Sequence, last: Option<Event>) {
        let cached = std::mem::take(&mut seq.cached);
        self.slots.release(seq.slot, cached, seq.reusable);
        self.metrics.active_sequences.fetch_sub(1, Ordering::AcqRel);
        if let Some(event) = last {
            seq.send(event);
        }
    }
}
