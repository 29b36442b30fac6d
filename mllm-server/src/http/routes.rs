//! The small routes: the web page, health, metrics, models, tokenize and
//! detokenize.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::AppState;
use crate::api::request::{fields, parse_body};
use crate::api::validate::check_ids;
use crate::api::ApiError;

/// The web chat page, embedded in the binary.
const INDEX_HTML: &str = include_str!("../web/index.html");

pub(super) async fn index() -> Html<&'static str> {
    Html(INDEX_HTML)
}

pub(super) async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub(super) async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

pub(super) async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.model.model_id,
            "object": "model",
            "created": state.started,
            "owned_by": "mllm-rs",
            "meta": {"n_ctx": state.model.context, "n_vocab": state.model.vocab_size},
        }],
    }))
}

#[derive(Deserialize)]
struct TokenizeBody {
    content: Option<String>,
    add_special: Option<bool>,
}

pub(super) async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let body: TokenizeBody = fields(&parse_body(&body)?)?;
    let content = body
        .content
        .ok_or_else(|| ApiError::bad_field("content", "`content` is required"))?;
    let ids = state
        .model
        .tokenizer
        .encode(&content, body.add_special.unwrap_or(false))
        .map_err(|e| ApiError::bad_field("content", e.to_string()))?;
    Ok(Json(json!({ "tokens": ids })))
}

#[derive(Deserialize)]
struct DetokenizeBody {
    tokens: Option<Vec<u32>>,
}

pub(super) async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let body: DetokenizeBody = fields(&parse_body(&body)?)?;
    let ids = body
        .tokens
        .ok_or_else(|| ApiError::bad_field("tokens", "`tokens` is required"))?;
    check_ids(&ids, state.model.vocab_size, "tokens")?;
    let content = state
        .model
        .tokenizer
        .decode(&ids, false)
        .map_err(|e| ApiError::bad_field("tokens", e.to_string()))?;
    Ok(Json(json!({ "content": content })))
}
