//! Multi-turn chat over one KV-cache slot: each turn renders the whole
//! conversation with the chat template, keeps the cached prefix it shares
//! with the previous turn, and prefills only the new tokens.

use mllm_core::{Error, Result};

use crate::chat::{ChatTemplate, Message};
use crate::generation::{continue_sequence, GenerateOptions, Generation};
use crate::model::Model;

/// A conversation with a model.
pub struct Conversation {
    template: ChatTemplate,
    messages: Vec<Message>,
    cached: Vec<u32>,
    slot: usize,
}

/// What one turn produced.
#[derive(Clone, Debug)]
pub struct Turn {
    /// The generation (new ids and why it stopped).
    pub generation: Generation,
    /// The reply text, without special tokens.
    pub text: String,
    /// Tokens that had to be prefilled for this turn (the rest were cached).
    pub prefilled: usize,
}

impl Conversation {
    /// A new conversation using the model's embedded chat template in `slot`.
    pub fn new(model: &Model, slot: usize) -> Result<Self> {
        let template = model.chat_template_renderer()?;
        Ok(Conversation {
            template,
            messages: Vec::new(),
            cached: Vec::new(),
            slot,
        })
    }

    /// The messages so far.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Starts over: no messages, empty cache slot.
    pub fn reset(&mut self, model: &mut Model) {
        self.messages.clear();
        self.cached.clear();
        model.reset_slot(self.slot);
    }

    /// The prompt ids for the conversation plus `user_text`, ready for the reply.
    pub fn prompt_ids(&self, model: &Model, user_text: &str) -> Result<Vec<u32>> {
        let mut messages = self.messages.clone();
        messages.push(Message::user(user_text));
        let text = self.template.render(&messages, true)?;
        model.require_tokenizer()?.encode(&text, false)
    }

    /// Adds a user message and generates the assistant's reply, streaming
    /// each new id to `on_token`. On a context-full error the conversation is
    /// left as it was before the call.
    pub fn reply(
        &mut self,
        model: &mut Model,
        user_text: &str,
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<Turn> {
        let ids = self.prompt_ids(model, user_text)?;
        if ids.len() >= model.max_context() {
            return Err(Error::ContextFull {
                slot: self.slot,
                needed: ids.len() + 1,
                limit: model.max_context(),
            });
        }
        // Reuse the longest cached prefix, but always prefill at least one token.
        let shared = self
            .cached
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ids.len() - 1);
        model.truncate_slot(self.slot, shared);
        let shared = if model.slot_len(self.slot) == shared {
            shared
        } else {
            model.reset_slot(self.slot);
            0
        };
        let generation = continue_sequence(model, self.slot, &ids[shared..], opts, on_token)?;
        self.finish_turn(model, user_text, ids, shared, generation)
    }

    fn finish_turn(
        &mut self,
        model: &Model,
        user_text: &str,
        ids: Vec<u32>,
        shared: usize,
        generation: Generation,
    ) -> Result<Turn> {
        let text = model
            .require_tokenizer()?
            .decode(&generation.tokens, true)?;
        let prefilled = ids.len() - shared;
        // The cache holds the prompt and every generated token but the last.
        self.cached = ids;
        let fed = generation.tokens.len().saturating_sub(1);
        self.cached.extend_from_slice(&generation.tokens[..fed]);
        self.messages.push(Message::user(user_text));
        self.messages.push(Message::assistant(text.trim()));
        Ok(Turn {
            generation,
            text,
            prefilled,
        })
    }
}
