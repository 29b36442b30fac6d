//! mllm-server: an OpenAI-compatible HTTP server with continuous batching.
//!
//! The [`engine`] owns the model on one thread and runs steps that pack the
//! decode tokens of every running sequence with prefill chunks of new
//! prompts; the [`http`] layer (axum) validates OpenAI requests, submits
//! them to the engine and answers with JSON or server-sent events. The
//! engine knows no HTTP type.

pub mod api;
pub mod args;
pub mod engine;
pub mod http;
pub mod metrics;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::Router;
use mllm_models::Model;

use engine::EngineConfig;
use http::AppState;
use metrics::Metrics;

/// How to serve a model.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Batching settings of the engine.
    pub engine: EngineConfig,
    /// The bearer token required on the API routes, if any.
    pub api_key: Option<String>,
    /// The model id `/v1/models` lists.
    pub model_id: String,
}

/// Starts the engine on `model` and returns the router that serves it.
pub fn build(model: Model, opts: ServerOptions) -> Result<Router, String> {
    let tokenizer = model
        .tokenizer()
        .ok_or("the model file embeds no tokenizer; the server needs one")?;
    let template = match model.chat_template() {
        Some(_) => Some(model.chat_template_renderer().map_err(|e| e.to_string())?),
        None => None,
    };
    let metrics = Arc::new(Metrics::default());
    let context = model.max_context();
    let vocab_size = model.vocab_size();
    let engine = engine::start(model, tokenizer.clone(), opts.engine, metrics.clone())?;
    let state = AppState {
        engine,
        tokenizer,
        template,
        model_id: opts.model_id,
        context,
        vocab_size,
        metrics,
        api_key: opts.api_key,
        started: http::unix_now(),
        next_id: AtomicU64::new(1),
    };
    Ok(http::router(Arc::new(state)))
}
