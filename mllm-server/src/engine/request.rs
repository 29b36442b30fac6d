//! What a client asks the engine for, and what the engine sends back.

use mllm_models::SamplingParams;

/// One generation request, already tokenized and validated.
#[derive(Clone, Debug)]
pub struct GenRequest {
    /// Prompt token ids (at least one, shorter than the context).
    pub prompt: Vec<u32>,
    /// Most tokens to generate (at least one).
    pub max_tokens: usize,
    /// Temperature, top-k/p, min-p, repetition penalty and seed.
    pub sampling: SamplingParams,
    /// OpenAI presence penalty: subtracted once from the logit of every
    /// token already generated.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty: subtracted from a token's logit once per
    /// time it was generated.
    pub frequency_penalty: f32,
    /// Text that ends the reply (not included in it).
    pub stop: Vec<String>,
    /// Keep generating after an end-of-sequence token.
    pub ignore_eos: bool,
    /// Report each token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
}

/// The log-probability of one generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token id.
    pub id: u32,
    /// Its log-probability under the model.
    pub logprob: f32,
    /// The most likely tokens at this position, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Why a reply ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` or the context was reached.
    Length,
}

impl FinishReason {
    /// OpenAI's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts of a finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Prompt tokens reused from the cache instead of prefilled.
    pub cached_tokens: usize,
}

/// A message from the engine about one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// New reply text and, when asked for, the log-probabilities of the
    /// tokens generated since the last event.
    Delta {
        /// Text (may be empty while a stop string might be starting).
        text: String,
        /// Log-probabilities of new tokens.
        logprobs: Vec<TokenLogprob>,
    },
    /// The reply is complete.
    Done {
        /// Why it ended.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
    },
    /// The request failed inside the engine.
    Failed(String),
}
