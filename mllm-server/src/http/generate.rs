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
use crate::api::response::{logprobs_json, Header, Kind};
use crate::api::validate::{validate, Validated};
use crate::api::ApiError;
use crate::engine::{Event, SubmitError, TokenLogprob};
use crate::metrics::add;

/// A validated request and the header of its response.
struct Prepared {
    header: Header,
    valid: Validated,
}

pub(super) async fn chat_completions(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    respond(&state, prepare(&state, Kind::Chat, &body)).await
}

pub(super) async fn completions(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    respond(&state, prepare(&state, Kind::Text, &body)).await
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
    let events = state.engine.submit(p.valid.request).map_err(|e| match e {
        SubmitError::QueueFull => ApiError::queue_full(),
        SubmitError::Stopped => ApiError::internal("the engine has stopped"),
    })?;
    if p.valid.settings.stream {
        Ok(stream(
            state.clone(),
            p.header,
            p.valid.settings.include_usage,
            events,
        ))
    } else {
        collect(state, p.header, events).await
    }
}

/// The validated request with the header of its response.
fn prepare(state: &AppState, kind: Kind, body: &[u8]) -> Result<Prepared, ApiError> {
    let valid = validate(&state.model, kind, body)?;
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Text => "cmpl",
    };
    let header = Header {
        id: format!("{prefix}-{n}"),
        created: super::unix_now(),
        model: state.model.model_id.clone(),
        kind,
    };
    Ok(Prepared { header, valid })
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
                    .then(|| logprobs_json(header.kind, &logprobs, &state.model.tokenizer));
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
                    .then(|| logprobs_json(header.kind, &logprobs, &state.model.tokenizer));
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
