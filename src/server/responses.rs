//! OpenAI's Responses API at `/v1/responses`, which Codex-style agents
//! speak. `instructions` and the `input` items (messages,
//! `function_call`, `function_call_output`, `reasoning`) become the same
//! chat request the chat route runs; the answer comes back as output items
//! (`reasoning`, `message`, `function_call`), streamed as the API's typed
//! events. The last [`STORE_CAPACITY`] stored responses keep their whole
//! conversation, so a request can continue one with `previous_response_id`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::stream::{self, Stream, StreamExt};
use serde_json::{json, Map, Value};

use super::agent::{random_id, Answer, AnswerStream, Step};
use super::error::ApiError;
use super::fields::Fields;
use super::handlers::{chat_prompt_ids, collect, read_json, start_generation, Started};
use super::request::Endpoint;
use super::response::unix_now;
use super::AppState;
use crate::gateway::GatewayEvent;
use crate::generate::{FinishReason, GenerationResult};
use crate::tokenizer::Tokenizer;
use crate::tool_calls::ToolCall;

/// How many stored responses are kept; the oldest is dropped first.
pub const STORE_CAPACITY: usize = 256;

/// A stored response: the conversation it answered (earlier items first,
/// its own output last) and the response object.
struct Stored {
    items: Vec<Value>,
    response: Value,
}

/// Stored responses by id, dropped in insertion order past the capacity.
pub struct ResponseStore {
    capacity: usize,
    inner: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    order: VecDeque<String>,
    by_id: HashMap<String, Arc<Stored>>,
}

impl ResponseStore {
    /// A store holding at most `capacity` responses.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Entries::default()),
        }
    }

    fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.inner.lock().unwrap().by_id.get(id).cloned()
    }

    fn put(&self, id: String, stored: Stored) {
        let mut e = self.inner.lock().unwrap();
        if e.by_id.insert(id.clone(), Arc::new(stored)).is_none() {
            e.order.push_back(id);
        }
        while e.order.len() > self.capacity {
            if let Some(old) = e.order.pop_front() {
                e.by_id.remove(&old);
            }
        }
    }

    fn remove(&self, id: &str) -> bool {
        let mut e = self.inner.lock().unwrap();
        e.order.retain(|k| k != id);
        e.by_id.remove(id).is_some()
    }
}

fn bad(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(field, message)
}

/// 404 for an id no stored response has; as `previous_response_id`, an
/// error about that field.
fn unknown_response(id: &str, previous: bool) -> ApiError {
    let message = format!(
        "no stored response has the id {id:?}; the server keeps the last {STORE_CAPACITY} in memory"
    );
    if !previous {
        return ApiError::not_found(message);
    }
    let mut e =
        ApiError::invalid("previous_response_id", message).with_code("previous_response_not_found");
    e.status = StatusCode::NOT_FOUND;
    e
}

/// Chat-route field names in errors, spelled as this API spells them.
fn responses_param(mut e: ApiError) -> ApiError {
    let (from, to) = match e.param.as_deref() {
        Some("messages") => ("messages", "input"),
        Some("max_tokens") => ("max_tokens", "max_output_tokens"),
        Some("response_format") => ("response_format", "text.format"),
        _ => return e,
    };
    // Message indexes differ from input indexes, so those keep their words.
    if from != "messages" {
        e.message = e.message.replace(from, to);
    }
    e.param = Some(to.to_string());
    e
}

/// The text of a message's `content`: a string or a list of text parts.
fn content_text(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
    let parts = match content {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::String(s)) => return Ok(s.clone()),
        Some(Value::Array(parts)) => parts,
        Some(_) => {
            return Err(bad(
                "input",
                format!("{at}.content must be a string or a list of content parts"),
            ))
        }
    };
    let mut out = String::new();
    for (j, part) in parts.iter().enumerate() {
        match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => {
                let text = part.get("text").and_then(Value::as_str).ok_or_else(|| {
                    bad(
                        "input",
                        format!("{at}.content[{j}] needs a \"text\" string"),
                    )
                })?;
                out.push_str(text);
            }
            Some("refusal") => {}
            other => {
                return Err(bad(
                    "input",
                    format!(
                        "{at}.content[{j}]: parts of type {:?} are not supported; use input_text",
                        other.unwrap_or("")
                    ),
                ))
            }
        }
    }
    Ok(out)
}

fn required_str<'a>(item: &'a Value, key: &str, at: &str) -> Result<&'a str, ApiError> {
    item.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad("input", format!("{at}.{key} must be a non-empty string")))
}

/// The text of an earlier `reasoning` item: its reasoning text, else its summary.
fn reasoning_text(item: &Value) -> String {
    let texts = |key: &str| -> String {
        item.get(key)
            .and_then(Value::as_array)
            .map(|parts| {
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    };
    let content = texts("content");
    if content.is_empty() {
        texts("summary")
    } else {
        content
    }
}

/// Conversation items as chat messages: calls join the assistant turn
/// before them, each call output is a `tool` message, and reasoning goes
/// with the next assistant turn. The first `stored` items come from a
/// stored response; errors count the request's own `input` from 0.
fn chat_messages(items: &[Value], stored: usize, out: &mut Vec<Value>) -> Result<(), ApiError> {
    fn assistant(out: &mut Vec<Value>, mut message: Value, reasoning: &mut String) {
        if !reasoning.is_empty() {
            message["reasoning_content"] = json!(std::mem::take(reasoning));
        }
        out.push(message);
    }
    let mut reasoning = String::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{}]", i.saturating_sub(stored));
        if !item.is_object() {
            return Err(bad("input", format!("{at} must be an object")));
        }
        let kind = match item.get("type").and_then(Value::as_str) {
            Some(kind) => kind,
            None if item.get("role").is_some() => "message",
            None => return Err(bad("input", format!("{at} needs a \"type\""))),
        };
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("");
                if !["user", "system", "developer", "assistant"].contains(&role) {
                    return Err(bad(
                        "input",
                        format!("{at}.role must be user, system, developer or assistant"),
                    ));
                }
                let text = content_text(item.get("content"), &at)?;
                let message = json!({"role": role, "content": text});
                if role == "assistant" {
                    assistant(out, message, &mut reasoning);
                } else {
                    out.push(message);
                }
            }
            "function_call" => {
                let arguments = match item.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Object(_)) => v.to_string(),
                    _ => {
                        return Err(bad(
                            "input",
                            format!("{at}.arguments must be a JSON string"),
                        ))
                    }
                };
                let call = json!({
                    "id": required_str(item, "call_id", &at)?,
                    "type": "function",
                    "function": {"name": required_str(item, "name", &at)?, "arguments": arguments},
                });
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" && reasoning.is_empty() => {
                        match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => assistant(
                        out,
                        json!({"role": "assistant", "content": "", "tool_calls": [call]}),
                        &mut reasoning,
                    ),
                }
            }
            "function_call_output" => {
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content_text(Some(v), &format!("{at}.output"))?,
                    _ => {
                        return Err(bad(
                            "input",
                            format!("{at}.output must be a string or a list of content parts"),
                        ))
                    }
                };
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": required_str(item, "call_id", &at)?,
                    "content": output,
                }));
            }
            "reasoning" => reasoning.push_str(&reasoning_text(item)),
            other => {
                return Err(bad(
                    "input",
                    format!("{at}: items of type {other:?} are not supported; use message, function_call, function_call_output or reasoning"),
                ))
            }
        }
    }
    Ok(())
}

/// Function tools, flat as this API writes them, in the chat route's shape.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let tools = tools
        .as_array()
        .ok_or_else(|| bad("tools", "tools must be an array"))?;
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "function" {
            return Err(bad(
                "tools",
                format!("tools[{i}]: type {kind:?} is not supported; only function tools run here"),
            ));
        }
        if tool.get("function").is_some_and(Value::is_object) {
            out.push(tool.clone());
            continue;
        }
        let name = tool.get("name").and_then(Value::as_str);
        if name.filter(|n| !n.is_empty()).is_none() {
            return Err(bad(
                "tools",
                format!("tools[{i}].name must be a non-empty string"),
            ));
        }
        let mut function = Map::new();
        for key in ["name", "description", "parameters", "strict"] {
            if let Some(v) = tool.get(key).filter(|v| !v.is_null()) {
                function.insert(key.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(out))
}

fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = o.get("name").and_then(Value::as_str).ok_or_else(|| {
                    bad(
                        "tool_choice",
                        "tool_choice {\"type\": \"function\"} needs a \"name\"",
                    )
                })?;
                Ok(json!({"type": "function", "function": {"name": name}}))
            }
            other => Err(bad(
                "tool_choice",
                format!("tool_choice of type {:?} is not supported; use auto, none, required or {{\"type\": \"function\", \"name\": …}}", other.unwrap_or("")),
            )),
        },
        _ => Err(bad(
            "tool_choice",
            "tool_choice must be a string or an object",
        )),
    }
}

/// `text.format` as the chat route's `response_format`.
fn response_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let schema = format
                .get("schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| {
                    bad(
                        "text.format",
                        "a json_schema format needs a \"schema\" object",
                    )
                })?;
            Ok(Some(json!({"type": "json_schema", "json_schema": {
                "name": format.get("name").cloned().unwrap_or(json!("response")),
                "schema": schema,
                "strict": format.get("strict").cloned().unwrap_or(Value::Null),
            }})))
        }
        other => Err(bad(
            "text.format",
            format!(
                "text.format.type {:?} is not one of text, json_object or json_schema",
                other.unwrap_or("")
            ),
        )),
    }
}

/// A Responses request, read: the chat request it runs, the conversation
/// so far, and the request fields the response object repeats.
#[derive(Debug)]
struct Request {
    chat: Value,
    items: Vec<Value>,
    echo: Map<String, Value>,
    store: bool,
}

/// Fields passed to the chat route unchanged (mlx-bun's extensions too).
const PASSED: [&str; 13] = [
    "model",
    "chat_template_kwargs",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stream",
    "parallel_tool_calls",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
];

fn read_request(
    body: &Value,
    store: &ResponseStore,
    defaults: &crate::sampling::SamplingParams,
) -> Result<Request, ApiError> {
    let f = Fields::of(body)?;
    let instructions = f.string("instructions")?;
    let previous = f.string("previous_response_id")?;
    let keep = f.bool("store")?.unwrap_or(true);
    let mut items = match previous {
        Some(id) => match store.get(id) {
            Some(stored) => stored.items.clone(),
            None => return Err(unknown_response(id, true)),
        },
        None => Vec::new(),
    };
    let stored = items.len();
    match f.get("input") {
        None | Some(Value::Null) if previous.is_some() => {}
        None | Some(Value::Null) => return Err(bad("input", "input is required")),
        Some(Value::String(s)) => {
            items.push(json!({"type": "message", "role": "user", "content": s}))
        }
        Some(Value::Array(list)) => items.extend(list.iter().cloned()),
        Some(_) => {
            return Err(bad(
                "input",
                "input must be a string or a list of input items",
            ))
        }
    }
    let mut messages = Vec::new();
    if let Some(text) = instructions {
        messages.push(json!({"role": "system", "content": text}));
    }
    chat_messages(&items, stored, &mut messages)?;

    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    for key in PASSED {
        if let Some(v) = f.get(key).filter(|v| !v.is_null()) {
            chat.insert(key.into(), v.clone());
        }
    }
    if let Some(n) = f.get("max_output_tokens").filter(|v| !v.is_null()) {
        chat.insert("max_tokens".into(), n.clone());
    }
    if let Some(tools) = f.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = f.get("tool_choice").filter(|v| !v.is_null()) {
        chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    for key in ["text", "metadata", "reasoning"] {
        f.object(key)?;
    }
    if let Some(format) = response_format(&body["text"])? {
        chat.insert("response_format".into(), format);
    }

    let given = |key: &str, default: Value| {
        f.get(key)
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(default)
    };
    let mut echo = Map::new();
    for (key, default) in [
        ("instructions", Value::Null),
        ("max_output_tokens", Value::Null),
        ("previous_response_id", Value::Null),
        ("tools", json!([])),
        ("tool_choice", json!("auto")),
        ("parallel_tool_calls", json!(true)),
        ("temperature", json!(defaults.temperature)),
        ("top_p", json!(defaults.top_p)),
        ("metadata", json!({})),
        ("text", json!({"format": {"type": "text"}})),
        ("reasoning", json!({"effort": null, "summary": null})),
    ] {
        echo.insert(key.into(), given(key, default));
    }
    echo.insert("store".into(), json!(keep));
    echo.insert("truncation".into(), json!("disabled"));
    Ok(Request {
        chat: Value::Object(chat),
        items,
        echo,
        store: keep,
    })
}

/// What every state of one response shares.
struct Head {
    id: String,
    created_at: u64,
    model: String,
    echo: Map<String, Value>,
}

impl Head {
    fn object(&self, status: &str, output: &[Value], usage: Value) -> Value {
        let mut o = Map::new();
        o.insert("id".into(), json!(self.id));
        o.insert("object".into(), json!("response"));
        o.insert("created_at".into(), json!(self.created_at));
        o.insert("status".into(), json!(status));
        if status == "completed" {
            o.insert("completed_at".into(), json!(unix_now()));
        }
        o.insert("error".into(), Value::Null);
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        o.insert(
            "incomplete_details".into(),
            incomplete.unwrap_or(Value::Null),
        );
        o.insert("model".into(), json!(self.model));
        o.insert("output".into(), Value::Array(output.to_vec()));
        o.insert("usage".into(), usage);
        o.extend(self.echo.clone());
        Value::Object(o)
    }
}

fn status(result: &GenerationResult, called: bool) -> &'static str {
    match result.finish_reason {
        FinishReason::Length if !called => "incomplete",
        _ => "completed",
    }
}

fn usage(result: &GenerationResult, reasoning: &str, tokenizer: &Tokenizer) -> Value {
    let reasoning_tokens = if reasoning.is_empty() {
        0
    } else {
        tokenizer.encode(reasoning).map_or(0, |ids| ids.len())
    };
    json!({
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": result.cached_tokens},
        "output_tokens": result.generation_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": result.prompt_tokens + result.generation_tokens,
    })
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    let content: Vec<Value> = if text.is_empty() {
        Vec::new()
    } else {
        vec![json!({"type": "reasoning_text", "text": text})]
    };
    json!({"type": "reasoning", "id": id, "summary": [], "content": content, "status": status})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text.map(text_part).into_iter().collect();
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn call_item(id: &str, call: &ToolCall, arguments: &str, status: &str) -> Value {
    json!({
        "type": "function_call",
        "id": id,
        "call_id": call.id.clone().unwrap_or_else(|| random_id("call_")),
        "name": call.name,
        "arguments": arguments,
        "status": status,
    })
}

/// The output items of a whole answer.
fn output_items(answer: &Answer, status: &str) -> Vec<Value> {
    let mut output = Vec::new();
    if !answer.reasoning.is_empty() {
        output.push(reasoning_item(
            &random_id("rs_"),
            &answer.reasoning,
            "completed",
        ));
    }
    if !answer.content.is_empty() || answer.calls.is_empty() {
        output.push(message_item(
            &random_id("msg_"),
            Some(&answer.content),
            status,
        ));
    }
    for call in &answer.calls {
        let arguments = call.arguments.to_string();
        output.push(call_item(&random_id("fc_"), call, &arguments, "completed"));
    }
    output
}

/// Where a finished response goes: the store, with the conversation it answered.
struct Keep {
    store: Arc<ResponseStore>,
    items: Vec<Value>,
}

impl Keep {
    fn put(self, response: &Value) {
        let mut items = self.items;
        items.extend(response["output"].as_array().cloned().unwrap_or_default());
        let id = response["id"].as_str().unwrap_or_default().to_string();
        self.store.put(
            id,
            Stored {
                items,
                response: response.clone(),
            },
        );
    }
}

/// The reasoning or message item being streamed, with its text.
struct Open {
    message: bool,
    id: String,
    index: usize,
    text: String,
}

/// A call item being streamed: its arguments grow until the answer ends.
struct OpenCall {
    item: Value,
    index: usize,
    arguments: String,
    done: bool,
}

/// The streamed response: typed events with sequence numbers, items opening
/// and closing as the answer moves from reasoning to text to calls.
struct Events {
    head: Head,
    answer: AnswerStream,
    tokenizer: Arc<Tokenizer>,
    seq: u64,
    /// Finished items by output index.
    output: BTreeMap<usize, Value>,
    items: usize,
    open: Option<Open>,
    /// By the answer's call index.
    calls: Vec<OpenCall>,
    reasoning: String,
}

impl Events {
    fn new(head: Head, answer: AnswerStream, tokenizer: Arc<Tokenizer>) -> Self {
        Self {
            head,
            answer,
            tokenizer,
            seq: 0,
            output: BTreeMap::new(),
            items: 0,
            open: None,
            calls: Vec::new(),
            reasoning: String::new(),
        }
    }

    fn event(&mut self, kind: &str, mut body: Value) -> Event {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        Event::default().event(kind).data(body.to_string())
    }

    fn object(&self, status: &str, usage: Value) -> Value {
        let output: Vec<Value> = self.output.values().cloned().collect();
        self.head.object(status, &output, usage)
    }

    fn start(&mut self) -> Vec<Event> {
        let response = self.object("in_progress", Value::Null);
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    fn item_done(&mut self, index: usize, item: Value, out: &mut Vec<Event>) {
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.output.insert(index, item);
    }

    fn close_text(&mut self, status: &str, out: &mut Vec<Event>) {
        let Some(Open {
            message,
            id,
            index,
            text,
        }) = self.open.take()
        else {
            return;
        };
        let at = json!({"item_id": id, "output_index": index, "content_index": 0});
        let (kind, part, item) = if message {
            let item = message_item(&id, Some(&text), status);
            ("response.output_text.done", text_part(&text), item)
        } else {
            let part = json!({"type": "reasoning_text", "text": text});
            let item = reasoning_item(&id, &text, "completed");
            ("response.reasoning_text.done", part, item)
        };
        let mut done = at.clone();
        done["text"] = json!(text);
        if message {
            done["logprobs"] = json!([]);
        }
        out.push(self.event(kind, done));
        let mut part_done = at;
        part_done["part"] = part;
        out.push(self.event("response.content_part.done", part_done));
        self.item_done(index, item, out);
    }

    fn close_calls(&mut self, out: &mut Vec<Event>) {
        for k in 0..self.calls.len() {
            if self.calls[k].done {
                continue;
            }
            self.calls[k].done = true;
            let call = &self.calls[k];
            let (index, arguments) = (call.index, call.arguments.clone());
            let mut item = call.item.clone();
            out.push(self.event(
                "response.function_call_arguments.done",
                json!({"item_id": item["id"], "output_index": index,
                    "name": item["name"], "arguments": arguments}),
            ));
            item["arguments"] = json!(arguments);
            item["status"] = json!("completed");
            self.item_done(index, item, out);
        }
    }

    /// The open reasoning or message item, opened unless one of its kind is.
    fn text_item(&mut self, message: bool, out: &mut Vec<Event>) -> &mut Open {
        self.close_calls(out);
        if self.open.as_ref().is_some_and(|o| o.message != message) {
            self.close_text("completed", out);
        }
        if self.open.is_none() {
            let index = self.items;
            self.items += 1;
            let id = random_id(if message { "msg_" } else { "rs_" });
            let (item, part) = if message {
                (message_item(&id, None, "in_progress"), text_part(""))
            } else {
                let part = json!({"type": "reasoning_text", "text": ""});
                (reasoning_item(&id, "", "in_progress"), part)
            };
            out.push(self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ));
            out.push(self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            ));
            self.open = Some(Open {
                message,
                id,
                index,
                text: String::new(),
            });
        }
        self.open.as_mut().expect("opened")
    }

    fn text(&mut self, message: bool, delta: String, out: &mut Vec<Event>) {
        let open = self.text_item(message, out);
        open.text.push_str(&delta);
        let mut body = json!({"item_id": open.id, "output_index": open.index,
            "content_index": 0, "delta": delta});
        if message {
            body["logprobs"] = json!([]);
            out.push(self.event("response.output_text.delta", body));
        } else {
            self.reasoning.push_str(&delta);
            out.push(self.event("response.reasoning_text.delta", body));
        }
    }

    fn call_start(&mut self, id: Option<String>, name: String, out: &mut Vec<Event>) {
        self.close_text("completed", out);
        let index = self.items;
        self.items += 1;
        let call = ToolCall {
            id,
            name,
            arguments: Value::Null,
        };
        let item = call_item(&random_id("fc_"), &call, "", "in_progress");
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        self.calls.push(OpenCall {
            item,
            index,
            arguments: String::new(),
            done: false,
        });
    }

    fn call_arguments(&mut self, k: usize, text: String, out: &mut Vec<Event>) {
        let Some(call) = self.calls.get_mut(k).filter(|c| !c.done) else {
            return;
        };
        call.arguments.push_str(&text);
        let body = json!({"item_id": call.item["id"], "output_index": call.index, "delta": text});
        out.push(self.event("response.function_call_arguments.delta", body));
    }

    fn steps(&mut self, steps: Vec<Step>) -> Vec<Event> {
        let mut out = Vec::new();
        for step in steps {
            match step {
                Step::Reasoning(t) => self.text(false, t, &mut out),
                Step::Content(t) => self.text(true, t, &mut out),
                Step::CallStart { id, name, .. } => self.call_start(id, name, &mut out),
                Step::CallArguments { index, text } => self.call_arguments(index, text, &mut out),
                // Every call has streamed by then.
                Step::Call(_) => {}
            }
        }
        out
    }

    /// The last events and the finished response object.
    fn finish(&mut self, result: &GenerationResult) -> (Vec<Event>, Value) {
        let rest = self.answer.finish();
        let mut out = self.steps(rest);
        let status = status(result, !self.calls.is_empty());
        if self.items == 0 {
            self.text_item(true, &mut out);
        }
        self.close_text(status, &mut out);
        self.close_calls(&mut out);
        let usage = usage(result, &self.reasoning, &self.tokenizer);
        let response = self.object(status, usage);
        let kind = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        out.push(self.event(kind, json!({"response": response})));
        (out, response)
    }

    fn fail(&mut self, message: String) -> Vec<Event> {
        let mut response = self.object("failed", Value::Null);
        response["error"] = json!({"code": "server_error", "message": message});
        vec![self.event("response.failed", json!({"response": response}))]
    }
}

fn stream_response(
    started: Started,
    head: Head,
    keep: Option<Keep>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let Started { reply, tickets, .. } = started;
    let ticket = tickets.into_iter().next().expect("one choice");
    let answer = AnswerStream::new(reply.plan.clone().unwrap_or_default());
    let mut events = Events::new(head, answer, reply.tokenizer.clone());
    let opening = events.start();
    let body = stream::unfold(Some((ticket, events, keep)), |state| async move {
        let (mut ticket, mut events, keep) = state?;
        let out = match ticket.events.recv().await {
            Some(GatewayEvent::Token { text, .. }) => {
                let steps = events.answer.push(&text);
                events.steps(steps)
            }
            Some(GatewayEvent::Started { .. }) => Vec::new(),
            Some(GatewayEvent::Done(result)) => {
                let (out, response) = events.finish(&result);
                if let Some(keep) = keep {
                    keep.put(&response);
                }
                return Some((stream::iter(out), None));
            }
            Some(GatewayEvent::Failed(e)) => {
                let out = events.fail(ApiError::from(e).message);
                return Some((stream::iter(out), None));
            }
            None => {
                let out = events.fail("the generation ended unexpectedly".into());
                return Some((stream::iter(out), None));
            }
        };
        Some((stream::iter(out), Some((ticket, events, keep))))
    })
    .flatten();
    let all = stream::iter(opening).chain(body).map(Ok);
    Sse::new(all).keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
}

async fn run(
    app: Arc<AppState>,
    store: Arc<ResponseStore>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = read_json(body, app.config.max_body_bytes)?;
    let request = read_request(&body, &store, &app.config.default_sampling)?;
    let mut started = start_generation(&app, Endpoint::Chat, &request.chat)
        .await
        .map_err(responses_param)?;
    let head = Head {
        id: random_id("resp_"),
        created_at: unix_now(),
        model: started.reply.model.clone(),
        echo: request.echo,
    };
    let keep = request.store.then(|| Keep {
        store,
        items: request.items,
    });
    if started.stream {
        return Ok(stream_response(started, head, keep).into_response());
    }
    let ticket = started.tickets.first_mut().expect("one choice");
    let result = collect(ticket).await?;
    let plan = started.reply.plan.clone().unwrap_or_default();
    let answer = Answer::of(&plan, &result.text);
    let status = status(&result, !answer.calls.is_empty());
    let usage = usage(&result, &answer.reasoning, &started.reply.tokenizer);
    let response = head.object(status, &output_items(&answer, status), usage);
    if let Some(keep) = keep {
        keep.put(&response);
    }
    Ok(Json(response).into_response())
}

pub(crate) async fn create(
    State(app): State<Arc<AppState>>,
    Extension(store): Extension<Arc<ResponseStore>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    run(app, store, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// The prompt tokens the same request would read, without generating.
async fn count(
    app: Arc<AppState>,
    store: Arc<ResponseStore>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = read_json(body, app.config.max_body_bytes)?;
    let request = read_request(&body, &store, &app.config.default_sampling)?;
    let ids = chat_prompt_ids(&app, &request.chat)
        .await
        .map_err(responses_param)?;
    Ok(Json(json!({"object": "response.input_tokens", "input_tokens": ids.len()})).into_response())
}

pub(crate) async fn input_tokens(
    State(app): State<Arc<AppState>>,
    Extension(store): Extension<Arc<ResponseStore>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    count(app, store, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub(crate) async fn retrieve(
    Extension(store): Extension<Arc<ResponseStore>>,
    Path(id): Path<String>,
) -> Response {
    match store.get(&id) {
        Some(stored) => Json(stored.response.clone()).into_response(),
        None => unknown_response(&id, false).into_response(),
    }
}

pub(crate) async fn delete(
    Extension(store): Extension<Arc<ResponseStore>>,
    Path(id): Path<String>,
) -> Response {
    if store.remove(&id) {
        Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response()
    } else {
        unknown_response(&id, false).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: Value) -> Result<Request, ApiError> {
        read_request(
            &body,
            &ResponseStore::new(4),
            &crate::sampling::SamplingParams::default(),
        )
    }

    #[test]
    fn a_tool_conversation_becomes_a_chat_request() {
        let r = read(json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 16,
            "tools": [{"type": "function", "name": "get_weather", "description": "d",
                "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
            "input": [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Check."}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
            ],
        }))
        .unwrap();
        let m = &r.chat["messages"];
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            m[1],
            json!({"role": "user", "content": "Weather in Paris?"})
        );
        assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "get_weather");
        assert_eq!(m[2]["reasoning_content"], "Check.");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "21 C"})
        );
        assert_eq!(m[4], json!({"role": "user", "content": "Thanks"}));
        assert_eq!(r.chat["tools"][0]["function"]["strict"], true);
        assert_eq!(r.chat["tool_choice"]["function"]["name"], "get_weather");
        assert_eq!(r.chat["max_tokens"], 16);
        assert_eq!(
            r.chat["response_format"]["json_schema"]["schema"],
            json!({"type": "object"})
        );
        assert_eq!(r.echo["instructions"], "Be brief.");
        assert_eq!(r.items.len(), 5);
    }

    #[test]
    fn bad_fields_name_themselves() {
        let param = |body: Value| read(body).err().unwrap().param.unwrap_or_default();
        assert_eq!(param(json!({})), "input");
        assert_eq!(param(json!({"input": [{"type": "input_image"}]})), "input");
        assert_eq!(
            param(json!({"input": "x", "tools": [{"type": "web_search"}]})),
            "tools"
        );
        assert_eq!(
            param(json!({"input": "x", "tool_choice": {"type": "file_search"}})),
            "tool_choice"
        );
        assert_eq!(
            param(json!({"input": "x", "text": {"format": {"type": "yaml"}}})),
            "text.format"
        );
        let e = read(json!({"input": "x", "previous_response_id": "resp_nope"})).unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(e.param.as_deref(), Some("previous_response_id"));
        assert_eq!(e.kind, "invalid_request_error");

        // A continued conversation: errors point into this request's input.
        let store = ResponseStore::new(4);
        let earlier = vec![json!({"role": "user", "content": "hi"})];
        store.put(
            "resp_a".into(),
            Stored {
                items: earlier,
                response: json!({}),
            },
        );
        let body = json!({"previous_response_id": "resp_a", "input": [{"type": "bogus"}]});
        let e = read_request(&body, &store, &Default::default()).unwrap_err();
        assert!(e.message.starts_with("input[0]:"), "{}", e.message);
    }

    #[test]
    fn the_store_keeps_the_newest() {
        let store = ResponseStore::new(2);
        for id in ["a", "b", "c"] {
            store.put(
                id.into(),
                Stored {
                    items: Vec::new(),
                    response: json!({"id": id}),
                },
            );
        }
        assert!(store.get("a").is_none());
        assert!(store.get("c").is_some());
        assert!(store.remove("b"));
        assert!(!store.remove("b"));
    }
}
