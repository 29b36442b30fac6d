//! From a request body to an engine request: every check the server makes
//! before a request reaches the engine (JSON, fields, model name, chat
//! template, tokenizing, vocabulary, context). It holds no HTTP or engine
//! state, so tests and fuzz targets drive it directly.

use std::sync::Arc;

use mllm_models::chat::ChatTemplate;
use mllm_models::{Model, Tokenizer};

use super::request::{
    fields, parse_body, ChatFields, CommonParams, CompletionFields, Prompt, Settings,
};
use super::response::Kind;
use super::ApiError;
use crate::engine::GenRequest;

/// What checking a request needs to know about the served model.
pub struct ModelFacts {
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The model's chat template, when it has one.
    pub template: Option<ChatTemplate>,
    /// The id `/v1/models` lists and requests may name.
    pub model_id: String,
    /// Tokens one sequence may hold (prompt plus reply).
    pub context: usize,
    /// Size of the vocabulary.
    pub vocab_size: usize,
}

impl ModelFacts {
    /// The facts of `model`, served as `model_id`. Fails when the model
    /// has no tokenizer or its chat template does not compile.
    pub fn of(model: &Model, model_id: String) -> Result<ModelFacts, String> {
        let tokenizer = model
            .tokenizer()
            .ok_or("the model file embeds no tokenizer; the server needs one")?;
        let template = match model.chat_template() {
            Some(_) => Some(model.chat_template_renderer().map_err(|e| e.to_string())?),
            None => None,
        };
        Ok(ModelFacts {
            tokenizer,
            template,
            model_id,
            context: model.max_context(),
            vocab_size: model.vocab_size(),
        })
    }
}

/// A request that passed every check.
pub struct Validated {
    /// How to answer (streaming, usage) and how to sample.
    pub settings: Settings,
    /// What the engine runs.
    pub request: GenRequest,
}

/// Checks the body of a `/v1/chat/completions` (`Kind::Chat`) or
/// `/v1/completions` (`Kind::Text`) request.
pub fn validate(facts: &ModelFacts, kind: Kind, body: &[u8]) -> Result<Validated, ApiError> {
    let value = parse_body(body)?;
    let common: CommonParams = fields(&value)?;
    let (prompt, param, logprobs) = match kind {
        Kind::Chat => {
            let chat: ChatFields = fields(&value)?;
            check_model(facts, &common)?;
            (chat_prompt(facts, &chat)?, "messages", chat.logprobs()?)
        }
        Kind::Text => {
            let text: CompletionFields = fields(&value)?;
            check_model(facts, &common)?;
            (text_prompt(facts, &text)?, "prompt", text.logprobs()?)
        }
    };
    let settings = common.settings()?;
    let request = gen_request(facts, prompt, param, &settings, logprobs)?;
    Ok(Validated { settings, request })
}

/// Checks every id is in the vocabulary of `vocab` tokens (`param` names
/// the field in the error).
pub fn check_ids(ids: &[u32], vocab: usize, param: &str) -> Result<(), ApiError> {
    match ids.iter().find(|&&id| id as usize >= vocab) {
        Some(id) => Err(ApiError::bad_field(
            param,
            format!("token id {id} is outside the vocabulary of {vocab} tokens"),
        )),
        None => Ok(()),
    }
}

/// A request may name the served model, `default`, or nothing.
fn check_model(facts: &ModelFacts, common: &CommonParams) -> Result<(), ApiError> {
    match &common.model {
        Some(name) if name != &facts.model_id && name != "default" && !name.is_empty() => {
            Err(ApiError::model_not_found(name))
        }
        _ => Ok(()),
    }
}

/// The messages rendered with the chat template and tokenized.
fn chat_prompt(facts: &ModelFacts, chat: &ChatFields) -> Result<Vec<u32>, ApiError> {
    let messages = chat.messages()?;
    let template = facts.template.as_ref().ok_or_else(|| {
        ApiError::bad_field(
            "messages",
            "this model has no chat template; use /v1/completions",
        )
    })?;
    let text = template
        .render(&messages, true)
        .map_err(|e| ApiError::bad_field("messages", e.to_string()))?;
    facts
        .tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::bad_field("messages", e.to_string()))
}

/// The prompt as given (ids, checked) or tokenized (text).
fn text_prompt(facts: &ModelFacts, text: &CompletionFields) -> Result<Vec<u32>, ApiError> {
    match text.prompt()? {
        Prompt::Ids(ids) => {
            check_ids(&ids, facts.vocab_size, "prompt")?;
            Ok(ids)
        }
        Prompt::Text(s) => facts
            .tokenizer
            .encode(&s, true)
            .map_err(|e| ApiError::bad_field("prompt", e.to_string())),
    }
}

/// The engine request, after checking the prompt and `max_tokens` against
/// the context.
fn gen_request(
    facts: &ModelFacts,
    prompt: Vec<u32>,
    prompt_param: &str,
    s: &Settings,
    logprobs: Option<usize>,
) -> Result<GenRequest, ApiError> {
    let ctx = facts.context;
    if prompt.is_empty() {
        return Err(ApiError::bad_field(
            prompt_param,
            "the prompt has no tokens",
        ));
    }
    if prompt.len() >= ctx {
        return Err(ApiError::bad_field(
            prompt_param,
            format!(
                "the prompt has {} tokens but the context holds {ctx} (prompt and reply together)",
                prompt.len()
            ),
        ));
    }
    let room = ctx - prompt.len();
    let max_tokens = match s.max_tokens {
        Some(m) if m > room => {
            return Err(ApiError::bad_field(
                "max_tokens",
                format!(
                    "max_tokens is {m}, but the context of {ctx} tokens leaves {room} after the {}-token prompt",
                    prompt.len()
                ),
            ))
        }
        Some(m) => m,
        None => room,
    };
    Ok(GenRequest {
        prompt,
        max_tokens,
        sampling: s.sampling,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        stop: s.stop.clone(),
        ignore_eos: s.ignore_eos,
        logprobs,
    })
}
