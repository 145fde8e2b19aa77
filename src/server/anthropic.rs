//! Anthropic's Messages API at `/v1/messages`, which agent CLIs speak: the
//! request is read into the same chat request the OpenAI route runs (system,
//! text, `tool_use` and `tool_result` blocks, tools, `tool_choice`,
//! `thinking`), and the answer is written back as content blocks (`thinking`,
//! `text`, `tool_use`), streamed as Anthropic's named SSE events; and
//! `/v1/messages/count_tokens`, the same request's prompt length.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, Stream, StreamExt};
use serde_json::{json, Map, Value};

use super::agent::{random_id, Answer, AnswerPlan, AnswerStream, Step};
use super::error::ApiError;
use super::handlers::{chat_prompt_ids, collect, read_json, start_generation, Started};
use super::request::Endpoint;
use super::AppState;
use crate::gateway::{GatewayEvent, Ticket};
use crate::generate::{FinishReason, GenerationResult};
use crate::tool_calls::ToolCall;

/// An error in Anthropic's shape, with the same status.
fn error_response(e: ApiError) -> Response {
    let kind = match e.status.as_u16() {
        400 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        404 => "not_found_error",
        429 | 503 => "overloaded_error",
        _ => "api_error",
    };
    let message = match &e.param {
        Some(p) => format!("{}: {}", p, e.message),
        None => e.message.clone(),
    };
    (
        e.status,
        Json(json!({"type": "error", "error": {"type": kind, "message": message}})),
    )
        .into_response()
}

fn bad(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(field, message)
}

/// The text of a `content` that is a string or a list of blocks.
fn block_text(content: &Value, field: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        out.push_str(b.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    other => {
                        return Err(bad(
                            field,
                            format!("content blocks of type {other:?} are not supported here"),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(bad(field, "content must be a string or a list of blocks")),
    }
}

/// One Anthropic message as OpenAI chat messages (tool results become
/// `tool` messages of their own).
fn convert_message(i: usize, m: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let field = format!("messages[{i}]");
    let role = m.get("role").and_then(Value::as_str).unwrap_or("");
    if role != "user" && role != "assistant" {
        return Err(bad(
            "messages",
            format!("{field}.role must be \"user\" or \"assistant\""),
        ));
    }
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(bad(
                "messages",
                format!("{field}.content must be a string or a list of blocks"),
            ))
        }
    };
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "text" => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            "thinking" => {
                reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""))
            }
            "redacted_thinking" => {}
            "tool_use" => calls.push(json!({
                "id": b.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {
                    "name": b.get("name").cloned().unwrap_or(Value::Null),
                    "arguments": b.get("input").cloned().unwrap_or(json!({})).to_string(),
                },
            })),
            "tool_result" => {
                let content = block_text(b.get("content").unwrap_or(&Value::Null), "messages")?;
                let content = if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    format!("Error: {content}")
                } else {
                    content
                };
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                    "content": content,
                }));
            }
            other => {
                return Err(bad(
                    "messages",
                    format!("{field}.content[{j}]: block type {other:?} is not supported"),
                ))
            }
        }
    }
    if !text.is_empty() || !calls.is_empty() || !reasoning.is_empty() {
        let mut msg = json!({"role": role, "content": text});
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        if !reasoning.is_empty() {
            msg["reasoning_content"] = json!(reasoning);
        }
        out.push(msg);
    }
    Ok(())
}

/// The Anthropic request as an OpenAI chat request body.
pub(crate) fn to_chat_request(body: &Value) -> Result<Value, ApiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    let mut messages = Vec::new();
    if let Some(system) = obj.get("system").filter(|v| !v.is_null()) {
        messages.push(json!({"role": "system", "content": block_text(system, "system")?}));
    }
    let list = obj
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("messages", "messages must be an array"))?;
    for (i, m) in list.iter().enumerate() {
        convert_message(i, m, &mut messages)?;
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    let max_tokens = obj
        .get("max_tokens")
        .ok_or_else(|| bad("max_tokens", "max_tokens is required"))?;
    chat.insert("max_tokens".into(), max_tokens.clone());
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stream", "stream"),
        ("stop_sequences", "stop"),
        ("model", "model"),
        // mlx-bun's structured-output extensions, as on the chat route.
        ("guided_json", "guided_json"),
        ("guided_regex", "guided_regex"),
        ("guided_choice", "guided_choice"),
        ("guided_grammar", "guided_grammar"),
        ("seed", "seed"),
    ] {
        if let Some(v) = obj.get(from).filter(|v| !v.is_null()) {
            chat.insert(to.into(), v.clone());
        }
    }
    if let Some(tools) = obj.get("tools").filter(|v| !v.is_null()) {
        let tools = tools
            .as_array()
            .ok_or_else(|| bad("tools", "tools must be an array"))?
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.get("name").cloned().unwrap_or(Value::Null),
                    "description": t.get("description").cloned().unwrap_or(Value::Null),
                    "parameters": t.get("input_schema").cloned().unwrap_or(json!({})),
                }})
            })
            .collect();
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = obj.get("tool_choice").filter(|v| !v.is_null()) {
        let kind = choice.get("type").and_then(Value::as_str).unwrap_or("");
        let openai = match kind {
            "auto" => json!("auto"),
            "any" => json!("required"),
            "none" => json!("none"),
            "tool" => {
                json!({"type": "function", "function": {"name": choice.get("name").cloned().unwrap_or(Value::Null)}})
            }
            other => {
                return Err(bad(
                    "tool_choice",
                    format!("tool_choice.type {other:?} is not one of auto, any, tool or none"),
                ))
            }
        };
        chat.insert("tool_choice".into(), openai);
        if choice
            .get("disable_parallel_tool_use")
            .and_then(Value::as_bool)
            == Some(true)
        {
            chat.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    let mut kwargs = Map::new();
    if let Some(thinking) = obj.get("thinking").filter(|v| !v.is_null()) {
        let on = thinking.get("type").and_then(Value::as_str) == Some("enabled");
        kwargs.insert("enable_thinking".into(), json!(on));
    }
    if let Some(Value::Object(extra)) = obj.get("chat_template_kwargs") {
        kwargs.extend(extra.clone());
    }
    if !kwargs.is_empty() {
        chat.insert("chat_template_kwargs".into(), Value::Object(kwargs));
    }
    Ok(Value::Object(chat))
}

fn stop_reason(result: &GenerationResult, called: bool) -> &'static str {
    if called {
        "tool_use"
    } else {
        match result.finish_reason {
            FinishReason::Length => "max_tokens",
            FinishReason::Stop | FinishReason::Cancelled => "end_turn",
        }
    }
}

fn tool_use(call: &ToolCall) -> Value {
    json!({
        "type": "tool_use",
        "id": call.id.clone().unwrap_or_else(|| random_id("toolu_")),
        "name": call.name,
        "input": call.arguments,
    })
}

fn message_body(started: &Started, result: &GenerationResult) -> Value {
    let plan = started.reply.plan.clone().unwrap_or_default();
    let answer = Answer::of(&plan, &result.text);
    let mut content = Vec::new();
    if !answer.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": answer.reasoning, "signature": ""}));
    }
    if !answer.content.is_empty() {
        content.push(json!({"type": "text", "text": answer.content}));
    }
    content.extend(answer.calls.iter().map(tool_use));
    json!({
        "id": random_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": started.reply.model,
        "content": content,
        "stop_reason": stop_reason(result, !answer.calls.is_empty()),
        "stop_sequence": null,
        "usage": {"input_tokens": result.prompt_tokens, "output_tokens": result.generation_tokens},
    })
}

fn event(name: &str, body: Value) -> Event {
    Event::default().event(name).data(body.to_string())
}

/// The streamed message: blocks open and close as the answer moves from
/// reasoning to text to calls. Calls come one after another, so a call's
/// block closes when the next block opens or the message ends.
struct Blocks {
    answer: AnswerStream,
    /// The open block's kind and index.
    open: Option<(&'static str, usize)>,
    next: usize,
    /// The block index of each call, by the call's index.
    calls: Vec<usize>,
    /// Whether the answer parsed into calls.
    called: bool,
}

impl Blocks {
    fn close(&mut self, out: &mut Vec<Event>) {
        if let Some((_, index)) = self.open.take() {
            out.push(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    fn open(&mut self, kind: &'static str, block: Value, out: &mut Vec<Event>) -> usize {
        if let Some((open, index)) = self.open {
            if open == kind && kind != "tool_use" {
                return index;
            }
        }
        self.close(out);
        let index = self.next;
        self.next += 1;
        self.open = Some((kind, index));
        out.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        index
    }

    fn steps(&mut self, steps: Vec<Step>) -> Vec<Event> {
        let mut out = Vec::new();
        for step in steps {
            let (index, delta) = match step {
                Step::Reasoning(t) => {
                    let i = self.open(
                        "thinking",
                        json!({"type": "thinking", "thinking": ""}),
                        &mut out,
                    );
                    (i, json!({"type": "thinking_delta", "thinking": t}))
                }
                Step::Content(t) => {
                    let i = self.open("text", json!({"type": "text", "text": ""}), &mut out);
                    (i, json!({"type": "text_delta", "text": t}))
                }
                Step::CallStart { id, name, .. } => {
                    let block = json!({
                        "type": "tool_use",
                        "id": id.unwrap_or_else(|| random_id("toolu_")),
                        "name": name,
                        "input": {},
                    });
                    let i = self.open("tool_use", block, &mut out);
                    self.calls.push(i);
                    continue;
                }
                Step::CallArguments { index, text } => {
                    let Some(&i) = self.calls.get(index) else {
                        continue;
                    };
                    (i, json!({"type": "input_json_delta", "partial_json": text}))
                }
                Step::Call(_) => {
                    self.called = true;
                    continue;
                }
            };
            out.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        out
    }
}

fn stream_message(started: Started) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let Started { reply, tickets, .. } = started;
    let ticket: Ticket = tickets.into_iter().next().expect("one choice");
    let input_tokens = reply.prompts.first().map_or(0, Vec::len);
    let start = event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": random_id("msg_"), "type": "message", "role": "assistant", "model": reply.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0},
        }}),
    );
    let blocks = Blocks {
        answer: AnswerStream::new(reply.plan.clone().unwrap_or_else(AnswerPlan::default)),
        open: None,
        next: 0,
        calls: Vec::new(),
        called: false,
    };
    let body = stream::unfold(Some((ticket, blocks)), |state| async move {
        let (mut ticket, mut blocks) = state?;
        let events = match ticket.events.recv().await {
            Some(GatewayEvent::Token { text, .. }) => {
                let steps = blocks.answer.push(&text);
                blocks.steps(steps)
            }
            Some(GatewayEvent::Started { .. }) => Vec::new(),
            Some(GatewayEvent::Done(result)) => {
                let rest = blocks.answer.finish();
                let mut out = blocks.steps(rest);
                blocks.close(&mut out);
                out.push(event(
                    "message_delta",
                    json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason(&result, blocks.called), "stop_sequence": null},
                        "usage": {"output_tokens": result.generation_tokens}}),
                ));
                out.push(event("message_stop", json!({"type": "message_stop"})));
                return Some((stream::iter(out), None));
            }
            Some(GatewayEvent::Failed(e)) => {
                let e = ApiError::from(e);
                let out = vec![event(
                    "error",
                    json!({"type": "error", "error": {"type": "api_error", "message": e.message}}),
                )];
                return Some((stream::iter(out), None));
            }
            None => {
                let out = vec![event(
                    "error",
                    json!({"type": "error", "error": {"type": "api_error", "message": "the generation ended unexpectedly"}}),
                )];
                return Some((stream::iter(out), None));
            }
        };
        Some((stream::iter(events), Some((ticket, blocks))))
    })
    .flatten();
    let events = stream::iter(vec![start]).chain(body).map(Ok);
    Sse::new(events).keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(10)))
}

async fn run(
    app: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = read_json(body, app.config.max_body_bytes)?;
    let chat = to_chat_request(&body)?;
    let mut started = start_generation(&app, Endpoint::Chat, &chat).await?;
    if started.stream {
        return Ok(stream_message(started).into_response());
    }
    let ticket = started.tickets.first_mut().expect("one choice");
    let result = collect(ticket).await?;
    Ok(Json(message_body(&started, &result)).into_response())
}

/// The prompt tokens `/v1/messages` reports as `usage.input_tokens` for the
/// same body; `max_tokens` may be left out.
async fn count(
    app: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut body = read_json(body, app.config.max_body_bytes)?;
    if let Some(obj) = body.as_object_mut() {
        obj.entry("max_tokens").or_insert(json!(1));
    }
    let chat = to_chat_request(&body)?;
    let ids = chat_prompt_ids(&app, &chat).await?;
    Ok(Json(json!({"input_tokens": ids.len()})).into_response())
}

pub(crate) async fn count_tokens(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    count(app, body).await.unwrap_or_else(error_response)
}

pub(crate) async fn messages(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(app, body).await.unwrap_or_else(error_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_conversation_becomes_a_chat_request() {
        let body = json!({
            "model": "m", "max_tokens": 16, "system": [{"type": "text", "text": "Be brief."}],
            "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "disabled"},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C"}]},
            ],
        });
        let chat = to_chat_request(&body).unwrap();
        assert_eq!(
            chat["messages"][0],
            json!({"role": "system", "content": "Be brief."})
        );
        assert_eq!(
            chat["messages"][2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        assert_eq!(
            chat["messages"][3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "21 C"})
        );
        assert_eq!(chat["tool_choice"], "required");
        assert_eq!(chat["parallel_tool_calls"], false);
        assert_eq!(
            chat["tools"][0]["function"]["parameters"],
            json!({"type": "object"})
        );
        assert_eq!(chat["chat_template_kwargs"]["enable_thinking"], false);
        let err = to_chat_request(&json!({"messages": []})).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("max_tokens"));
    }
}
