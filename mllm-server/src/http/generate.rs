//! `POST /v1/chat/completions` and `POST /v1/completions`: validate, tokenize,
//! hand the request to the engine, and answer with one JSON body or a stream
//! of server-sent events.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio_stream::wrappers::ReceiverStream;

use super::AppState;
use crate::api::request::{
    fields, parse_body, ChatFields, CommonParams, CompletionFields, Prompt, Settings,
};
use crate::api::response::{logprobs_json, Header, Kind};
use crate::api::ApiError;
use crate::engine::{Event, GenRequest, SubmitError, TokenLogprob};
use crate::metrics::add;

/// A validated request ready for the engine.
struct Prepared {
    header: Header,
    settings: Settings,
    request: GenRequest,
}

pub(super) async fn chat_completions(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    respond(&state, prepare_chat(&state, &body)).await
}

pub(super) async fn completions(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    respond(&state, prepare_text(&state, &body)).await
}

/// Submits a prepared request and answers it, counting errors.
async fn respond(state: &Arc<AppState>, prepared: Result<Prepared, ApiError>) -> Response {
    add(&state.metrics.requests, 1);
    let result = match prepared {
        Ok(p) => run(state, p).await,
        Err(e) => Err(e),
    };
    result.unwrap_or_else(|e| {
        add(&state.metrics.request_errors, 1);
        e.into_response()
    })
}

async fn run(state: &Arc<AppState>, p: Prepared) -> Result<Response, ApiError> {
    let events = state.engine.submit(p.request).map_err(|e| match e {
        SubmitError::QueueFull => ApiError::queue_full(),
        SubmitError::Stopped => ApiError::internal("the engine has stopped"),
    })?;
    if p.settings.stream {
        Ok(stream(
            state.clone(),
            p.header,
            p.settings.include_usage,
            events,
        ))
    } else {
        collect(state, p.header, events).await
    }
}

fn prepare_chat(state: &AppState, body: &[u8]) -> Result<Prepared, ApiError> {
    let value = parse_body(body)?;
    let common: CommonParams = fields(&value)?;
    let chat: ChatFields = fields(&value)?;
    let header = header(state, &common, Kind::Chat)?;
    let messages = chat.messages()?;
    let template = state.template.as_ref().ok_or_else(|| {
        ApiError::bad_field(
            "messages",
            "this model has no chat template; use /v1/completions",
        )
    })?;
    let text = template
        .render(&messages, true)
        .map_err(|e| ApiError::bad_field("messages", e.to_string()))?;
    let ids = state
        .tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::bad_field("messages", e.to_string()))?;
    prepared(state, header, &common, ids, "messages", chat.logprobs()?)
}

fn prepare_text(state: &AppState, body: &[u8]) -> Result<Prepared, ApiError> {
    let value = parse_body(body)?;
    let common: CommonParams = fields(&value)?;
    let text: CompletionFields = fields(&value)?;
    let header = header(state, &common, Kind::Text)?;
    let ids = match text.prompt()? {
        Prompt::Ids(ids) => {
            check_ids(&ids, state.vocab_size, "prompt")?;
            ids
        }
        Prompt::Text(s) => state
            .tokenizer
            .encode(&s, true)
            .map_err(|e| ApiError::bad_field("prompt", e.to_string()))?,
    };
    prepared(state, header, &common, ids, "prompt", text.logprobs()?)
}

/// The validated settings and engine request for `prompt` (whose field is
/// `prompt_param`).
fn prepared(
    state: &AppState,
    header: Header,
    common: &CommonParams,
    prompt: Vec<u32>,
    prompt_param: &str,
    logprobs: Option<usize>,
) -> Result<Prepared, ApiError> {
    let settings = common.settings()?;
    let request = gen_request(state, prompt, prompt_param, &settings, logprobs)?;
    Ok(Prepared {
        header,
        settings,
        request,
    })
}

/// The response header, after checking the requested model.
fn header(state: &AppState, common: &CommonParams, kind: Kind) -> Result<Header, ApiError> {
    if let Some(name) = &common.model {
        if name != &state.model_id && name != "default" && !name.is_empty() {
            return Err(ApiError::model_not_found(name));
        }
    }
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Text => "cmpl",
    };
    Ok(Header {
        id: format!("{prefix}-{n}"),
        created: super::unix_now(),
        model: state.model_id.clone(),
        kind,
    })
}

/// Checks that every id is in the vocabulary.
pub(super) fn check_ids(ids: &[u32], vocab: usize, param: &str) -> Result<(), ApiError> {
    match ids.iter().find(|&&id| id as usize >= vocab) {
        Some(id) => Err(ApiError::bad_field(
            param,
            format!("token id {id} is outside the vocabulary of {vocab} tokens"),
        )),
        None => Ok(()),
    }
}

/// The engine request, after checking the prompt and `max_tokens` against
/// the context.
fn gen_request(
    state: &AppState,
    prompt: Vec<u32>,
    prompt_param: &str,
    s: &Settings,
    logprobs: Option<usize>,
) -> Result<GenRequest, ApiError> {
    let ctx = state.context;
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

/// Waits for the whole reply and answers with one JSON body.
async fn collect(
    state: &AppState,
    header: Header,
    mut events: UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut logprobs: Vec<TokenLogprob> = Vec::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Delta {
                text: t,
                logprobs: l,
            } => {
                text.push_str(&t);
                logprobs.extend(l);
            }
            Event::Done { reason, usage } => {
                let lp = (!logprobs.is_empty())
                    .then(|| logprobs_json(header.kind, &logprobs, &state.tokenizer));
                let body = header.complete(&text, lp, reason.as_str(), &usage);
                return Ok(Json(body).into_response());
            }
            Event::Failed(message) => return Err(ApiError::internal(message)),
        }
    }
    Err(ApiError::internal("the engine dropped the request"))
}

/// Streams the reply as server-sent events, ending with `data: [DONE]`.
/// A forwarding task turns engine events into chunks; when the client
/// goes away it drops the engine's channel, which cancels the sequence.
fn stream(
    state: Arc<AppState>,
    header: Header,
    include_usage: bool,
    events: UnboundedReceiver<Event>,
) -> Response {
    let (tx, rx) = mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(forward(state, header, include_usage, events, tx));
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn forward(
    state: Arc<AppState>,
    header: Header,
    include_usage: bool,
    mut events: UnboundedReceiver<Event>,
    tx: mpsc::Sender<Result<SseEvent, Infallible>>,
) {
    let send = |v: Value| {
        let tx = tx.clone();
        async move {
            tx.send(Ok(SseEvent::default().data(v.to_string())))
                .await
                .is_ok()
        }
    };
    if header.kind == Kind::Chat && !send(header.chunk("", None, None, true)).await {
        return;
    }
    loop {
        let event = tokio::select! {
            _ = tx.closed() => return,
            event = events.recv() => event,
        };
        let alive = match event {
            Some(Event::Delta { text, logprobs }) => {
                let lp = (!logprobs.is_empty())
                    .then(|| logprobs_json(header.kind, &logprobs, &state.tokenizer));
                send(header.chunk(&text, lp, None, false)).await
            }
            Some(Event::Done { reason, usage }) => {
                let _ = send(header.chunk("", None, Some(reason.as_str()), false)).await
                    && (!include_usage || send(header.usage_chunk(&usage)).await)
                    && tx
                        .send(Ok(SseEvent::default().data("[DONE]")))
                        .await
                        .is_ok();
                return;
            }
            Some(Event::Failed(message)) => {
                add(&state.metrics.request_errors, 1);
                let _ = send(ApiError::internal(message).body()).await
                    && tx
                        .send(Ok(SseEvent::default().data("[DONE]")))
                        .await
                        .is_ok();
                return;
            }
            None => return,
        };
        if !alive {
            return;
        }
    }
}
