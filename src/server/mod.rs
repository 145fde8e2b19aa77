//! The OpenAI-compatible HTTP API over the gateway: routes, request and
//! response shapes, streaming, errors, authentication and metrics.

pub mod agent;
pub mod anthropic;
pub mod auth;
pub mod cors;
pub mod error;
pub mod fields;
pub mod handlers;
pub mod metrics;
pub mod models;
pub mod request;
pub mod response;
pub mod responses;
pub mod sse;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Router};

use metrics::HttpMetrics;
use models::ModelPool;

/// The HTTP server's settings (`mlx-bun serve` flags).
pub struct ServerConfig {
    /// `--api-key`: requests must carry it as a bearer token or `x-api-key`; `None`
    /// lets all in.
    pub api_key: Option<String>,
    /// The largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// `max_tokens` when a request gives none (cut to fit the context).
    pub max_tokens_default: usize,
    /// `system_fingerprint` in responses.
    pub fingerprint: String,
    /// Sampling for fields a request leaves out (`--temp`, `--top-p`, …).
    pub default_sampling: crate::sampling::SamplingParams,
    /// Browser origins allowed to call the API.
    pub cors: cors::AllowedOrigins,
    /// Tool-call format, reasoning split and template variables.
    pub agent: agent::AgentConfig,
}

/// What every handler shares: settings, models and metrics.
pub struct AppState {
    /// The server's settings.
    pub config: ServerConfig,
    /// The models requests may name, loaded on demand.
    pub models: Arc<ModelPool>,
    /// Responses counted by route and status, for `/metrics`.
    pub metrics: HttpMetrics,
}

/// Counts every response by route and status, and logs it.
async fn observe(State(app): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let start = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    app.metrics.record(&route, status);
    tracing::info!(
        "{method} {path} {status} {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    response
}

/// The API's routes (OpenAI, Anthropic `/v1/messages`, `/v1/responses`, `/health`,
/// `/stats`, `/metrics`) with authentication, CORS, logging and the body limit.
pub fn router(app: Arc<AppState>) -> Router {
    let limit = app.config.max_body_bytes;
    Router::new()
        .route("/", get(handlers::chat_page))
        .route("/v1/models", get(handlers::list_models))
        .route("/v1/models/{*id}", get(handlers::get_model))
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        // The paths without `/v1`, which some clients use.
        .route("/models", get(handlers::list_models))
        .route("/chat/completions", post(handlers::chat_completions))
        .route("/completions", post(handlers::completions))
        .route("/responses", post(responses::create))
        .route("/health", get(handlers::health))
        .route("/stats", get(handlers::stats))
        .route("/metrics", get(handlers::metrics))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(Extension(Arc::new(responses::ResponseStore::new(
            responses::STORE_CAPACITY,
        ))))
        .layer(middleware::from_fn_with_state(
            app.clone(),
            auth::require_api_key,
        ))
        .layer(middleware::from_fn_with_state(app.clone(), observe))
        .layer(middleware::from_fn_with_state(app.clone(), cors::cors))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(app)
}

/// Serves until `shutdown` resolves, then lets open requests finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    axum::serve(listener, router(app))
        .with_graceful_shutdown(shutdown)
        .await
        .context("serving HTTP")
}
