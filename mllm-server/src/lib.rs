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

use api::validate::ModelFacts;
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
    let facts = ModelFacts::of(&model, opts.model_id)?;
    let metrics = Arc::new(Metrics::default());
    let engine = engine::start(model, facts.tokenizer.clone(), opts.engine, metrics.clone())?;
    let state = AppState {
        engine,
        model: facts,
        metrics,
        api_key: opts.api_key,
        started: http::unix_now(),
        next_id: AtomicU64::new(1),
    };
    Ok(http::router(Arc::new(state)))
}
