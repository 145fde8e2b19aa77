//! Route handlers.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::agent::AnswerPlan;
use super::error::ApiError;
use super::metrics::{prometheus, stats_json};
use super::models::Served;
use super::request::{self, completion_budget, Endpoint, ParsedRequest};
use super::response::{new_id, unix_now, Reply};
use super::{sse, AppState};
use crate::gateway::Health;
use crate::gateway::{GatewayEvent, GatewayRequest, Ticket};
use crate::generate::{GenerateOptions, GenerationResult, DEFAULT_PREFILL_STEP};
use crate::prompt::{build_prompt, PromptInput};

pub(crate) fn read_json(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Value, ApiError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
        } else {
            ApiError::bad_request(rejection.body_text())
        }
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "the request body is empty; send a JSON object",
        ));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

/// Tokenizes the prompt off the async threads (templates and long texts);
/// returns the rendered text too, when there is one.
async fn tokenize(
    served: &Served,
    endpoint: Endpoint,
    input: PromptInput,
) -> Result<(String, Vec<u32>), ApiError> {
    let tokenizer = served.tokenizer.clone();
    let built = tokio::task::spawn_blocking(move || build_prompt(&tokenizer, &input))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?;
    let (text, ids) =
        built.map_err(|e| ApiError::invalid(endpoint.prompt_param(), format!("{e:#}")))?;
    Ok((text.unwrap_or_default(), ids))
}

/// Waits until the worker has taken the request, so that errors found there
/// (a grammar that does not compile) still get a proper status code.
async fn wait_started(ticket: &mut Ticket) -> Result<(), ApiError> {
    match ticket.events.recv().await {
        Some(GatewayEvent::Started { .. }) => Ok(()),
        Some(GatewayEvent::Failed(e)) => Err(e.into()),
        Some(_) => Err(ApiError::internal("the generation started out of order")),
        None => Err(ApiError::internal("the generation worker stopped")),
    }
}

pub(crate) async fn collect(ticket: &mut Ticket) -> Result<GenerationResult, ApiError> {
    loop {
        match ticket.events.recv().await {
            Some(GatewayEvent::Done(result)) => return Ok(*result),
            Some(GatewayEvent::Failed(e)) => return Err(e.into()),
            Some(_) => {}
            None => return Err(ApiError::internal("the generation ended unexpectedly")),
        }
    }
}

/// The seed of choice `j` of a prompt: different draws for `n > 1`, the same
/// draws for the same request.
fn choice_seed(seed: Option<u64>, j: usize) -> Option<u64> {
    seed.map(|s| s.wrapping_add(j as u64))
}

/// `--chat-template-args`, under the request's own template variables.
fn with_server_template_args(app: &AppState, input: &mut PromptInput) {
    if let PromptInput::Chat(chat) = input {
        for (k, v) in &app.config.agent.chat_template_args {
            chat.kwargs.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
}

/// The prompt ids of a chat request's first prompt, exactly as
/// [`start_generation`] would submit them, without generating.
pub(crate) async fn chat_prompt_ids(
    app: &Arc<AppState>,
    body: &Value,
) -> Result<Vec<u32>, ApiError> {
    let served = app.models.acquire(body).await?;
    let parsed = request::parse_with_defaults(
        Endpoint::Chat,
        body,
        served.vocab_size,
        &app.config.default_sampling,
    )?;
    let mut input = parsed
        .inputs
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::invalid("messages", "messages is required"))?;
    with_server_template_args(app, &mut input);
    let (_, ids) = tokenize(&served, Endpoint::Chat, input).await?;
    Ok(ids)
}

/// A request whose choices have all started: what the response needs.
pub(crate) struct Started {
    pub reply: Reply,
    pub tickets: Vec<Ticket>,
    pub stream: bool,
}

/// Parses, tokenizes and submits a request, and waits until every choice
/// has started (so that errors still get a status code).
pub(crate) async fn start_generation(
    app: &Arc<AppState>,
    endpoint: Endpoint,
    body: &Value,
) -> Result<Started, ApiError> {
    // Held until every choice is submitted; the gateway then counts them.
    let served = app.models.acquire(body).await?;
    let ParsedRequest {
        inputs,
        n,
        max_tokens,
        sampling,
        stop,
        logprobs,
        stream,
        include_usage,
        return_token_ids,
        mut constraint,
        mut constraint_param,
        agent,
        ..
    } = request::parse_with_defaults(
        endpoint,
        body,
        served.vocab_size,
        &app.config.default_sampling,
    )?;
    // Every choice is its own request to the gateway: with batching on,
    // the choices of one request run as rows of the same batch.
    let mut prompts = Vec::with_capacity(inputs.len() * n);
    let mut requests = Vec::with_capacity(inputs.len() * n);
    let mut plan = None;
    for mut input in inputs {
        with_server_template_args(app, &mut input);
        let (text, prompt) = tokenize(&served, endpoint, input).await?;
        if let Some(agent) = &agent {
            let answer =
                AnswerPlan::for_request(&app.config.agent, &served.tokenizer, agent, &text);
            if let Some(call) = answer.call_constraint(agent, &served.tokenizer)? {
                if let Some(param) = constraint_param {
                    return Err(ApiError::invalid(
                        param,
                        format!("{param} cannot be combined with a tool_choice that forces a call"),
                    ));
                }
                constraint = Some(call);
                constraint_param = Some("tool_choice");
            } else if let Some(spec) = constraint.take() {
                constraint = Some(answer.answer_constraint(spec));
            }
            plan = answer.is_active().then_some(answer);
        }
        let max_tokens = completion_budget(
            endpoint,
            max_tokens,
            prompt.len(),
            served.context_length,
            app.config.max_tokens_default,
        )?;
        for j in 0..n {
            let mut sampling = sampling.clone();
            sampling.seed = choice_seed(sampling.seed, j);
            requests.push(GatewayRequest {
                prompt: prompt.clone(),
                options: GenerateOptions {
                    max_tokens,
                    sampling,
                    stop: stop.clone(),
                    logprobs,
                    prefill_step: DEFAULT_PREFILL_STEP,
                },
                constraint: constraint.clone(),
            });
            prompts.push(prompt.clone());
        }
    }
    let mut tickets = Vec::with_capacity(requests.len());
    for request in requests {
        tickets.push(served.gateway.submit(request)?);
    }
    for ticket in tickets.iter_mut() {
        wait_started(ticket)
            .await
            .map_err(|e| match constraint_param {
                // The worker compiles the constraint; its complaints are about that field.
                Some(param) if e.status == StatusCode::BAD_REQUEST => e.with_param(param),
                _ => e,
            })?;
    }
    Ok(Started {
        reply: Reply {
            endpoint,
            id: new_id(endpoint),
            created: unix_now(),
            model: served.id.clone(),
            fingerprint: app.config.fingerprint.clone(),
            tokenizer: served.tokenizer.clone(),
            include_usage,
            return_token_ids,
            logprobs: logprobs.is_some(),
            prompts,
            n,
            plan,
        },
        tickets,
        stream,
    })
}

async fn run_generation(
    app: Arc<AppState>,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = read_json(body, app.config.max_body_bytes)?;
    let Started {
        reply,
        mut tickets,
        stream,
    } = start_generation(&app, endpoint, &body).await?;
    if stream {
        return Ok(sse::stream(reply, tickets).into_response());
    }
    let mut results = Vec::with_capacity(tickets.len());
    for ticket in tickets.iter_mut() {
        results.push(collect(ticket).await?);
    }
    Ok(Json(reply.complete(&results)).into_response())
}

pub(crate) async fn chat_completions(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run_generation(app, Endpoint::Chat, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub(crate) async fn completions(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run_generation(app, Endpoint::Completions, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

fn model_object(app: &AppState, id: &str, loaded: bool) -> Value {
    json!({
        "id": id,
        "object": "model",
        "created": app.models.created(),
        "owned_by": "mlx-bun",
        "loaded": loaded,
    })
}

pub(crate) async fn list_models(State(app): State<Arc<AppState>>) -> Json<Value> {
    let models = app.models.clone();
    let listed = tokio::task::spawn_blocking(move || models.list())
        .await
        .unwrap_or_default();
    let data: Vec<Value> = listed
        .iter()
        .map(|m| model_object(&app, &m.id, m.loaded))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

pub(crate) async fn get_model(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Response {
    if app.models.serves(&id) {
        let loaded = app.models.loaded_ids().contains(&id);
        Json(model_object(&app, &id, loaded)).into_response()
    } else {
        ApiError::not_found(format!(
            "model {id:?} is not served here; GET /v1/models lists the models this server may serve"
        ))
        .with_param("model")
        .with_code("model_not_found")
        .into_response()
    }
}

/// The chat page: one static file, no build step.
pub(crate) async fn chat_page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("page.html"),
    )
        .into_response()
}

pub(crate) async fn health(State(app): State<Arc<AppState>>) -> Response {
    match app.models.health() {
        Health::Ready => Json(json!({"status": "ok"})).into_response(),
        Health::Starting => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "loading"})),
        )
            .into_response(),
        Health::Failed(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "error", "reason": reason})),
        )
            .into_response(),
    }
}

pub(crate) async fn stats(State(app): State<Arc<AppState>>) -> Json<Value> {
    let mut stats = stats_json(
        app.models.default_id(),
        app.models.is_ready(),
        &app.metrics,
        &app.models.stats(),
    );
    stats["loaded_models"] = json!(app.models.loaded_ids());
    Json(stats)
}

pub(crate) async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        prometheus(&app.metrics, &app.models.stats()),
    )
        .into_response()
}

pub(crate) async fn not_found(method: Method, uri: Uri) -> Response {
    ApiError::not_found(format!("no route for {method} {}", uri.path())).into_response()
}

pub(crate) async fn method_not_allowed() -> Response {
    ApiError::method_not_allowed().into_response()
}
