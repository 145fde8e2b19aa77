//! What agents need from a chat answer: the request's tools, `tool_choice`
//! and template variables; the plan for one answer (which tool-call format,
//! which reasoning markers, which grammar); and the stream that turns the
//! generated text into reasoning, content and tool calls.

use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::fields::Fields;
use crate::grammar::ConstraintSpec;
use crate::reasoning::{partial_tail, Piece, ReasoningMarkers, ReasoningSplitter};
use crate::tokenizer::Tokenizer;
use crate::tool_calls::{
    call_grammar, grammar_head, CallEvent, CallStream, ReasoningPrefix, ToolCall, ToolChoice,
    ToolFormat,
};

pub use crate::tool_calls::Function;

/// The server's settings for agent features (`mlx-bun serve` flags).
#[derive(Clone, Debug, Default)]
pub struct AgentConfig {
    /// `--tool-call-parser`: the format, instead of the one the template implies.
    pub tool_call_parser: Option<ToolFormat>,
    /// `--reasoning-parser`: `Some(None)` turns the split off; `None` infers.
    pub reasoning_parser: Option<Option<ReasoningMarkers>>,
    /// `--chat-template-args`: template variables for every request.
    pub chat_template_args: Map<String, Value>,
}

/// The tool fields of one chat request.
#[derive(Clone, Debug)]
pub struct AgentRequest {
    /// OpenAI tool objects, as the template gets them.
    pub tools: Vec<Value>,
    /// The tools' names and parameter schemas.
    pub functions: Vec<Function>,
    /// `tool_choice`.
    pub choice: ToolChoice,
    /// `parallel_tool_calls`: more than one call may be made.
    pub parallel: bool,
}

fn parse_tool(i: usize, tool: &Value) -> Result<Function, ApiError> {
    let bad = |msg: &str| ApiError::invalid("tools", format!("tools[{i}]: {msg}"));
    let kind = tool
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("function");
    if kind != "function" {
        return Err(bad(&format!(
            "type {kind:?} is not supported; use \"function\""
        )));
    }
    let f = tool
        .get("function")
        .filter(|f| f.is_object())
        .ok_or_else(|| bad("needs a \"function\" object"))?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad("function.name must be a non-empty string"))?;
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => json!({}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => return Err(bad("function.parameters must be a JSON schema object")),
    };
    Ok(Function {
        name: name.to_string(),
        parameters,
    })
}

fn parse_choice(v: Option<&Value>, has_tools: bool) -> Result<ToolChoice, ApiError> {
    let bad = |msg: String| ApiError::invalid("tool_choice", msg);
    let choice = match v {
        None | Some(Value::Null) => {
            return Ok(if has_tools {
                ToolChoice::Auto
            } else {
                ToolChoice::None
            })
        }
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "tool_choice {other:?} is not one of auto, none, required or a function object"
                )))
            }
        },
        Some(obj @ Value::Object(_)) => {
            let name = obj
                .pointer("/function/name")
                .or_else(|| obj.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    bad("tool_choice as an object must be {\"type\": \"function\", \"function\": {\"name\": …}}".into())
                })?;
            ToolChoice::Function(name.to_string())
        }
        Some(_) => return Err(bad("tool_choice must be a string or an object".into())),
    };
    if choice.forces_call() && !has_tools {
        return Err(bad(
            "tool_choice asks for a call, but the request has no tools".into(),
        ));
    }
    Ok(choice)
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`.
pub(crate) fn parse_request(f: &Fields) -> Result<AgentRequest, ApiError> {
    let tools = match f.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.clone(),
        Some(_) => return Err(ApiError::invalid("tools", "tools must be an array")),
    };
    let functions = tools
        .iter()
        .enumerate()
        .map(|(i, t)| parse_tool(i, t))
        .collect::<Result<Vec<_>, _>>()?;
    let choice = parse_choice(f.get("tool_choice"), !tools.is_empty())?;
    if let ToolChoice::Function(name) = &choice {
        if !functions.iter().any(|f| &f.name == name) {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice names {name:?}, which is not among the tools"),
            ));
        }
    }
    Ok(AgentRequest {
        tools,
        functions,
        choice,
        parallel: f.bool("parallel_tool_calls")?.unwrap_or(true),
    })
}

/// `chat_template_kwargs` of a request (vLLM's spelling; `chat_template_args`
/// too, as mlx-lm's flag is named).
pub(crate) fn parse_template_kwargs(f: &Fields) -> Result<Map<String, Value>, ApiError> {
    for name in ["chat_template_kwargs", "chat_template_args"] {
        match f.get(name) {
            None | Some(Value::Null) => {}
            Some(Value::Object(o)) => return Ok(o.clone()),
            Some(_) => return Err(ApiError::invalid(name, format!("{name} must be an object"))),
        }
    }
    Ok(Map::new())
}

/// How one chat answer is read.
#[derive(Clone, Debug, Default)]
pub struct AnswerPlan {
    /// The format calls are parsed in; `None`: no tools, or `tool_choice: none`.
    pub tools: Option<ToolFormat>,
    /// The reasoning block's markers; `None`: no reasoning split.
    pub reasoning: Option<ReasoningMarkers>,
    /// The prompt opened a reasoning block: the answer begins inside it.
    pub opens: bool,
    /// The prompt ends with a closed (empty) reasoning block, as templates
    /// write it when thinking is off: the answer starts at once.
    pub closed: bool,
    /// At most one call (`parallel_tool_calls: false`).
    pub single_call: bool,
    /// The request's functions: formats that write values as text take
    /// their types from the schemas.
    pub functions: Vec<Function>,
}

impl AnswerPlan {
    pub(crate) fn for_request(
        config: &AgentConfig,
        tokenizer: &Tokenizer,
        request: &AgentRequest,
        prompt: &str,
    ) -> Self {
        let source = tokenizer.chat_template.as_ref().map(|t| t.source());
        let tools = (!request.tools.is_empty() && request.choice != ToolChoice::None).then(|| {
            config
                .tool_call_parser
                .or_else(|| {
                    let name = tokenizer.tool_parser_type.as_deref()?;
                    ToolFormat::from_name(name).ok()
                })
                .or_else(|| source.and_then(ToolFormat::infer))
                .or_else(|| ToolFormat::infer_from_vocab(&|t| tokenizer.token_to_id(t).is_some()))
                // Templates without tools get the Hermes format in the prompt.
                .unwrap_or(ToolFormat::JsonTools)
        });
        let reasoning = match &config.reasoning_parser {
            Some(fixed) => fixed.clone(),
            None => ReasoningMarkers::infer(tokenizer, source),
        };
        let opens = reasoning.as_ref().is_some_and(|m| m.prompt_opens(prompt));
        let closed = reasoning
            .as_ref()
            .is_some_and(|m| prompt.trim_end().ends_with(m.end.as_str()));
        Self {
            tools,
            reasoning,
            opens,
            closed,
            single_call: !request.parallel,
            functions: request.functions.clone(),
        }
    }

    /// Whether the answer needs more than plain text handling.
    pub(crate) fn is_active(&self) -> bool {
        self.tools.is_some() || self.reasoning.is_some()
    }

    /// The reasoning a grammar lets come first; none when the prompt
    /// already closed the block.
    fn prefix(&self) -> Option<ReasoningPrefix> {
        if self.closed {
            return None;
        }
        self.reasoning.as_ref().map(|m| ReasoningPrefix {
            start: m.start.clone(),
            end: m.end.clone(),
            open: self.opens,
        })
    }

    /// The grammar that forces a call, when `tool_choice` asks for one.
    pub(crate) fn call_constraint(
        &self,
        request: &AgentRequest,
        tokenizer: &Tokenizer,
    ) -> Result<Option<ConstraintSpec>, ApiError> {
        let Some(format) = self.tools.filter(|_| request.choice.forces_call()) else {
            return Ok(None);
        };
        let lookup = |t: &str| tokenizer.token_to_id(t);
        call_grammar(
            format,
            &request.functions,
            &request.choice,
            request.parallel,
            self.prefix().as_ref(),
            &lookup,
        )
        .map(|g| Some(ConstraintSpec::Lark(g)))
        .map_err(|e| ApiError::invalid("tool_choice", format!("{e:#}")))
    }

    /// A structured-output constraint made to apply to the answer only: a
    /// reasoning block may come first. Lark grammars are taken as they are.
    pub(crate) fn answer_constraint(&self, spec: ConstraintSpec) -> ConstraintSpec {
        let Some(prefix) = self.prefix() else {
            return spec;
        };
        let body = match &spec {
            ConstraintSpec::JsonSchema(schema) if schema.is_object() => {
                let mut schema = schema.clone();
                if schema.get("x-guidance").is_none() {
                    schema["x-guidance"] = json!({"whitespace_flexible": false,
                        "item_separator": ", ", "key_separator": ": "});
                }
                format!("%json {schema}")
            }
            ConstraintSpec::JsonObject => format!(
                "%json {}",
                json!({"type": "object", "x-guidance": {"whitespace_flexible": false,
                    "item_separator": ", ", "key_separator": ": "}})
            ),
            ConstraintSpec::Choice(choices) => choices
                .iter()
                .map(|c| serde_json::to_string(c).expect("string"))
                .collect::<Vec<_>>()
                .join(" | "),
            _ => return spec,
        };
        ConstraintSpec::Lark(format!("{}body: {body}\n", grammar_head(Some(&prefix))))
    }
}

/// One step of an answer, with each call whole (whole answers).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Delta {
    Reasoning(String),
    Content(String),
    Call(ToolCall),
}

/// One step of an answer, with calls' arguments as they are written
/// (OpenAI's streamed `tool_calls` deltas, Anthropic's `input_json_delta`s).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Step {
    Reasoning(String),
    Content(String),
    /// Call `index` begins; `id` when the format carries one.
    CallStart {
        index: usize,
        id: Option<String>,
        name: String,
    },
    /// More of call `index`'s arguments: joined, they are the JSON string
    /// of the whole call's arguments.
    CallArguments {
        index: usize,
        text: String,
    },
    /// A call, whole, once the answer ends.
    Call(ToolCall),
}

/// The steps a consumer of [`AnswerStream`] takes: [`Delta`] or [`Step`].
pub(crate) trait FromStep: Sized {
    fn from_step(step: Step) -> Option<Self>;
}

impl FromStep for Step {
    fn from_step(step: Step) -> Option<Self> {
        Some(step)
    }
}

impl FromStep for Delta {
    fn from_step(step: Step) -> Option<Self> {
        match step {
            Step::Reasoning(t) => Some(Delta::Reasoning(t)),
            Step::Content(t) => Some(Delta::Content(t)),
            Step::Call(c) => Some(Delta::Call(c)),
            Step::CallStart { .. } | Step::CallArguments { .. } => None,
        }
    }
}

impl From<CallEvent> for Step {
    fn from(e: CallEvent) -> Self {
        match e {
            CallEvent::Start { index, id, name } => Step::CallStart { index, id, name },
            CallEvent::Arguments { index, text } => Step::CallArguments { index, text },
        }
    }
}

/// Turns streamed text into steps: reasoning split off first, then content
/// until a call begins; calls' arguments as they come where the format
/// writes them as JSON, and the calls whole when the answer ends.
pub(crate) struct AnswerStream {
    plan: AnswerPlan,
    splitter: Option<ReasoningSplitter>,
    held: String,
    calls: Option<CallStream>,
    content_sent: bool,
}

impl AnswerStream {
    pub fn new(plan: AnswerPlan) -> Self {
        let splitter = plan
            .reasoning
            .clone()
            .map(|m| ReasoningSplitter::new(m, plan.opens));
        Self {
            plan,
            splitter,
            held: String::new(),
            calls: None,
            content_sent: false,
        }
    }

    /// The steps `text` completes, as [`Delta`]s or [`Step`]s.
    pub fn push<D: FromStep>(&mut self, text: &str) -> Vec<D> {
        let pieces = match &mut self.splitter {
            Some(s) => s.push(text),
            None => vec![Piece::Answer(text.to_string())],
        };
        self.route(pieces)
            .into_iter()
            .filter_map(D::from_step)
            .collect()
    }

    pub fn finish<D: FromStep>(&mut self) -> Vec<D> {
        let pieces = match &mut self.splitter {
            Some(s) => s.finish(),
            None => Vec::new(),
        };
        let mut out = self.route(pieces);
        let held = std::mem::take(&mut self.held);
        if !held.is_empty() {
            out.push(Step::Content(held));
        }
        if let (Some(mut stream), Some(format)) = (self.calls.take(), self.plan.tools) {
            match format.parse_with(stream.text(), &self.plan.functions) {
                Ok(mut calls) => {
                    if self.plan.single_call {
                        calls.truncate(1);
                    }
                    out.extend(stream.finish(&calls).into_iter().map(Step::from));
                    out.extend(calls.into_iter().map(Step::Call));
                }
                Err(_) => out.push(Step::Content(stream.text().to_string())),
            }
        }
        out.into_iter().filter_map(D::from_step).collect()
    }

    fn route(&mut self, pieces: Vec<Piece>) -> Vec<Step> {
        let mut out = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Reasoning(t) => out.push(Step::Reasoning(t)),
                Piece::Answer(t) => self.answer(&t, &mut out),
            }
        }
        out
    }

    fn answer(&mut self, text: &str, out: &mut Vec<Step>) {
        if let Some(calls) = &mut self.calls {
            out.extend(calls.push(text).into_iter().map(Step::from));
            return;
        }
        let Some(format) = self.plan.tools else {
            out.extend(self.content(text.to_string()));
            return;
        };
        self.held.push_str(text);
        let start = if self.content_sent {
            self.held.find(format.start_marker())
        } else {
            format.find_start(&self.held)
        };
        if let Some(at) = start {
            let before = self.held[..at].to_string();
            let max_calls = if self.plan.single_call { 1 } else { usize::MAX };
            let mut calls = CallStream::new(format, max_calls);
            let rest = self.held.split_off(at);
            self.held.clear();
            out.extend(self.content(before));
            out.extend(calls.push(&rest).into_iter().map(Step::from));
            self.calls = Some(calls);
            return;
        }
        // Hold back what may still become a marker (or, before any content,
        // leading whitespace and a JSON call that has not opened yet).
        let keep = if !self.content_sent && self.held.trim().is_empty() {
            self.held.len()
        } else {
            partial_tail(&self.held, format.start_marker())
        };
        let ready = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        out.extend(self.content(ready));
    }

    fn content(&mut self, text: String) -> Option<Step> {
        if text.is_empty() {
            return None;
        }
        self.content_sent = true;
        Some(Step::Content(text))
    }
}

/// A whole answer, split.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    /// The reasoning text (`reasoning_content`), markers removed.
    pub reasoning: String,
    /// The answer's text (`content`), calls removed.
    pub content: String,
    /// The tool calls it made.
    pub calls: Vec<ToolCall>,
}

impl Answer {
    /// Splits a whole generated `text` by `plan`.
    pub fn of(plan: &AnswerPlan, text: &str) -> Self {
        let mut stream = AnswerStream::new(plan.clone());
        let mut deltas: Vec<Delta> = stream.push(text);
        deltas.extend(stream.finish::<Delta>());
        let mut answer = Answer::default();
        for d in deltas {
            match d {
                Delta::Reasoning(t) => answer.reasoning.push_str(&t),
                Delta::Content(t) => answer.content.push_str(&t),
                Delta::Call(c) => answer.calls.push(c),
            }
        }
        answer.reasoning = answer.reasoning.trim().to_string();
        if !answer.calls.is_empty() {
            answer.content = answer.content.trim().to_string();
        }
        answer
    }
}

/// A random id with a prefix, such as `call_3kT9…`.
pub(crate) fn random_id(prefix: &str) -> String {
    use rand::distributions::Alphanumeric;
    use rand::Rng;
    let tail: String = rand::thread_rng()
        .sample_iter(&Alphanumeric)
        .take(24)
        .map(char::from)
        .collect();
    format!("{prefix}{tail}")
}

/// A call in OpenAI's shape (arguments as a JSON string).
pub(crate) fn openai_call(call: &ToolCall) -> Value {
    json!({
        "id": call.id.clone().unwrap_or_else(|| random_id("call_")),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments.to_string()},
    })
}

/// The `message` of a non-streamed chat choice.
pub(crate) fn openai_message(answer: &Answer) -> Value {
    let mut message = json!({"role": "assistant"});
    message["content"] = if answer.content.is_empty() && !answer.calls.is_empty() {
        Value::Null
    } else {
        json!(answer.content)
    };
    if !answer.reasoning.is_empty() {
        message["reasoning_content"] = json!(answer.reasoning);
        message["reasoning"] = json!(answer.reasoning);
    }
    if !answer.calls.is_empty() {
        message["tool_calls"] = answer.calls.iter().map(openai_call).collect();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(tools: Option<ToolFormat>, think: bool) -> AnswerPlan {
        AnswerPlan {
            tools,
            reasoning: think.then(|| ReasoningMarkers::new("<think>", "</think>")),
            opens: false,
            closed: false,
            single_call: false,
            functions: Vec::new(),
        }
    }

    #[test]
    fn reasoning_content_and_call_from_a_qwen3_answer() {
        let out = "<think>\nNeed the weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let a = Answer::of(&plan(Some(ToolFormat::JsonTools), true), out);
        assert_eq!(a.reasoning, "Need the weather.");
        assert_eq!(a.content, "Let me check.");
        assert_eq!(a.calls.len(), 1);
        assert_eq!(a.calls[0].arguments, json!({"city": "Paris"}));
        // Token by token gives the same.
        let mut s = AnswerStream::new(plan(Some(ToolFormat::JsonTools), true));
        let mut deltas: Vec<Delta> = Vec::new();
        for c in out.chars() {
            deltas.extend(s.push::<Delta>(&c.to_string()));
        }
        deltas.extend(s.finish::<Delta>());
        let content: String = deltas
            .iter()
            .filter_map(|d| match d {
                Delta::Content(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(content.trim(), "Let me check.");
        assert!(matches!(deltas.last(), Some(Delta::Call(c)) if c.name == "get_weather"));
        let msg = openai_message(&a);
        assert_eq!(
            msg["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        assert_eq!(msg["reasoning_content"], "Need the weather.");
    }

    #[test]
    fn streamed_steps_carry_arguments_in_pieces() {
        let out = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
        let mut s = AnswerStream::new(plan(Some(ToolFormat::JsonTools), false));
        let mut steps: Vec<Step> = Vec::new();
        for c in out.chars() {
            steps.extend(s.push::<Step>(&c.to_string()));
        }
        let before_end = steps.len();
        steps.extend(s.finish::<Step>());
        let start = steps
            .iter()
            .position(
                |st| matches!(st, Step::CallStart { index: 0, name, .. } if name == "get_weather"),
            )
            .unwrap();
        assert!(start < before_end, "the head comes before the answer ends");
        let pieces: Vec<&str> = steps
            .iter()
            .filter_map(|st| match st {
                Step::CallArguments { index: 0, text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert!(pieces.len() > 3, "{steps:?}");
        let whole = Answer::of(&plan(Some(ToolFormat::JsonTools), false), out);
        let msg = openai_message(&whole);
        assert_eq!(
            pieces.concat(),
            msg["tool_calls"][0]["function"]["arguments"]
        );
        assert!(matches!(steps.last(), Some(Step::Call(c)) if c.name == "get_weather"));
    }

    /// A tokenizer of three tokens (two of LFM2's call markers) whose config names `tool_parser_type`.
    fn tokenizer_naming(parser: &str) -> Tokenizer {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"a": 0, "<|tool_call_start|>": 1, "<|tool_call_end|>": 2}, "unk_token": "a"}
        });
        std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
        let config = json!({"tool_parser_type": parser});
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
        Tokenizer::load(dir.path()).unwrap()
    }

    #[test]
    fn tool_parser_type_comes_after_the_flag_and_before_inference() {
        let request = AgentRequest {
            tools: vec![json!({"type": "function", "function": {"name": "f"}})],
            functions: Vec::new(),
            choice: ToolChoice::Auto,
            parallel: true,
        };
        let plan_with = |config: &AgentConfig, tok: &Tokenizer| {
            AnswerPlan::for_request(config, tok, &request, "").tools
        };
        let named = tokenizer_naming("qwen3_coder");
        assert_eq!(named.tool_parser_type.as_deref(), Some("qwen3_coder"));
        let none = AgentConfig::default();
        assert_eq!(plan_with(&none, &named), Some(ToolFormat::Qwen3Coder));
        let flag = AgentConfig {
            tool_call_parser: Some(ToolFormat::Llama3),
            ..AgentConfig::default()
        };
        assert_eq!(plan_with(&flag, &named), Some(ToolFormat::Llama3));
        // An unknown name is passed over: the vocabulary decides.
        let unknown = tokenizer_naming("no_such_parser");
        assert_eq!(plan_with(&none, &unknown), Some(ToolFormat::Pythonic));
    }

    #[test]
    fn plain_text_passes_and_bad_calls_stay_content() {
        let a = Answer::of(&plan(None, false), "hello <tool_call>");
        assert_eq!(a.content, "hello <tool_call>");
        let a = Answer::of(
            &plan(Some(ToolFormat::JsonTools), false),
            "x <tool_call>{oops",
        );
        assert_eq!(a.content, "x <tool_call>{oops");
        assert!(a.calls.is_empty());
    }
}
