//! The HTTP layer: axum routes over the engine, OpenAI JSON in and out,
//! server-sent events for streams, the web chat page, and the API key check.

mod generate;
mod routes;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::{header, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::api::validate::ModelFacts;
use crate::api::ApiError;
use crate::engine::EngineHandle;
use crate::metrics::Metrics;

/// What every handler shares.
pub struct AppState {
    /// Where generation requests go.
    pub engine: EngineHandle,
    /// The served model, as requests are checked against it.
    pub model: ModelFacts,
    /// Counters and histograms.
    pub metrics: Arc<Metrics>,
    /// The bearer token the protected routes require, if any.
    pub api_key: Option<String>,
    /// Unix time the server started.
    pub started: u64,
    /// Source of response ids.
    pub next_id: AtomicU64,
}

/// The router: `/v1/chat/completions`, `/v1/completions`, `/v1/models`,
/// `/tokenize`, `/detokenize` (behind the API key when one is set), and
/// `/`, `/health`, `/metrics`.
pub fn router(state: Arc<AppState>) -> Router {
    let protected = Router::new()
        .route("/v1/chat/completions", post(generate::chat_completions))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/models", get(routes::models))
        .route("/tokenize", post(routes::tokenize))
        .route("/detokenize", post(routes::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    Router::new()
        .route("/", get(routes::index))
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .merge(protected)
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(tower_http::cors::CorsLayer::permissive())
        .with_state(state)
}

/// Answers 401 unless the request carries `Authorization: Bearer <key>`.
async fn require_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}
