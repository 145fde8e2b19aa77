//! OpenAI request bodies (`/v1/chat/completions`, `/v1/completions`) read
//! into what the engine needs, with every bad field answered by a 400 that
//! names it. Unknown fields are ignored.

use std::collections::HashMap;

use serde_json::Value;

use super::error::ApiError;
use super::fields::Fields;
use crate::chat_template::{validate_messages, Message};
use crate::grammar::ConstraintSpec;
use crate::prompt::{ChatInput, PromptInput};
use crate::sampling::SamplingParams;

/// Which OpenAI endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`: a list of `messages`.
    Chat,
    /// `/v1/completions`: a raw `prompt`.
    Completions,
}

impl Endpoint {
    /// The field that carries the prompt, for error messages.
    pub(crate) fn prompt_param(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Completions => "prompt",
        }
    }
}

/// The most tokens a stop list, a logprobs request or a bias map may name.
const MAX_STOPS: usize = 16;
const MAX_TOP_LOGPROBS: i64 = 20;
const MAX_COMPLETION_LOGPROBS: i64 = 20;
/// Choices per prompt, and choices per request (prompts x n).
const MAX_N: i64 = 16;
const MAX_CHOICES: usize = 64;

/// An OpenAI request body, validated and read into what the engine needs.
pub struct ParsedRequest {
    /// The endpoint the body came to.
    pub endpoint: Endpoint,
    /// One prompt, or (completions) a list of them; each gets `n` choices.
    pub inputs: Vec<PromptInput>,
    /// `n`: choices per prompt.
    pub n: usize,
    /// As asked; `None` means the server's default.
    pub max_tokens: Option<usize>,
    /// Sampling fields (`temperature`, `top_p`, penalties, `logit_bias`, `seed`, …)
    /// over the server's defaults.
    pub sampling: SamplingParams,
    /// `stop`: strings that end a choice.
    pub stop: Vec<String>,
    /// `Some(k)`: report each token's log-probability and the top `k`.
    pub logprobs: Option<usize>,
    /// `stream`: answer with server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Extension: also return the prompt's and the completion's token ids.
    pub return_token_ids: bool,
    /// Structured output from `response_format` or a `guided_*` field.
    pub constraint: Option<ConstraintSpec>,
    /// The field the constraint came from, for errors about it.
    pub constraint_param: Option<&'static str>,
    /// Chat only: tools, `tool_choice` and `parallel_tool_calls`.
    pub agent: Option<super::agent::AgentRequest>,
}

/// The request fields that can carry a structured-output constraint.
const CONSTRAINT_FIELDS: [&str; 5] = [
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
];

fn parse_messages(value: Option<&Value>) -> Result<Vec<Message>, ApiError> {
    let items = match value {
        None => return Err(ApiError::invalid("messages", "messages is required")),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(ApiError::invalid(
                "messages",
                "messages must be an array of message objects",
            ))
        }
    };
    let messages = items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            if !m.is_object() {
                return Err(ApiError::invalid(
                    "messages",
                    format!("messages[{i}] must be an object with role and content"),
                ));
            }
            serde_json::from_value::<Message>(m.clone())
                .map_err(|e| ApiError::invalid("messages", format!("messages[{i}]: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    validate_messages(&messages).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    Ok(messages)
}

fn token_ids(items: &[Value], vocab: usize) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .filter(|&id| (id as usize) < vocab)
                .map(|id| id as u32)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "prompt",
                        format!("prompt token ids must be integers below the vocabulary size {vocab}, got {v}"),
                    )
                })
        })
        .collect()
}

/// The `prompt` of a completions request: a string, token ids, or a list of
/// strings or token-id lists (one choice group per prompt).
fn parse_prompts(value: Option<&Value>, vocab: usize) -> Result<Vec<PromptInput>, ApiError> {
    let text = |s: &str| PromptInput::Text {
        text: s.to_string(),
        system: None,
        use_chat_template: false,
    };
    let empty = || ApiError::invalid("prompt", "prompt must not be empty");
    let shape = || {
        ApiError::invalid(
            "prompt",
            "prompt must be a string, token ids, or a list of strings or token-id lists",
        )
    };
    match value {
        None => Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Value::String(s)) if s.is_empty() => Err(empty()),
        Some(Value::String(s)) => Ok(vec![text(s)]),
        Some(Value::Array(items)) => match items.as_slice() {
            [] => Err(empty()),
            [Value::Number(_), ..] => Ok(vec![PromptInput::Tokens(token_ids(items, vocab)?)]),
            _ => items
                .iter()
                .map(|item| match item {
                    Value::String(s) if s.is_empty() => Err(empty()),
                    Value::String(s) => Ok(text(s)),
                    Value::Array(ids) if ids.is_empty() => Err(empty()),
                    Value::Array(ids) => Ok(PromptInput::Tokens(token_ids(ids, vocab)?)),
                    _ => Err(shape()),
                })
                .collect(),
        },
        Some(_) => Err(shape()),
    }
}

fn parse_logit_bias(f: &Fields, vocab: usize) -> Result<HashMap<u32, f32>, ApiError> {
    let Some(bias) = f.object("logit_bias")? else {
        return Ok(HashMap::new());
    };
    bias.entries()
        .map(|(k, v)| {
            let id: u32 = k
                .trim()
                .parse()
                .ok()
                .filter(|&id: &u32| (id as usize) < vocab)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "logit_bias",
                        format!("logit_bias keys must be token ids below {vocab}, got {k:?}"),
                    )
                })?;
            let b = v
                .as_f64()
                .filter(|b| (-100.0..=100.0).contains(b))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "logit_bias",
                        format!("logit_bias values must be numbers from -100 to 100, got {v}"),
                    )
                })?;
            Ok((id, b as f32))
        })
        .collect()
}

fn parse_sampling(
    f: &Fields,
    vocab: usize,
    defaults: &SamplingParams,
) -> Result<SamplingParams, ApiError> {
    let mut p = SamplingParams {
        temperature: f
            .number("temperature", 0.0, 2.0)?
            .map_or(defaults.temperature, |x| x as f32),
        top_p: f
            .number("top_p", 0.0, 1.0)?
            .map_or(defaults.top_p, |x| x as f32),
        min_p: f
            .number("min_p", 0.0, 1.0)?
            .map_or(defaults.min_p, |x| x as f32),
        presence_penalty: f.number("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        frequency_penalty: f.number("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32,
        xtc_probability: f
            .number("xtc_probability", 0.0, 1.0)?
            .map_or(defaults.xtc_probability, |x| x as f32),
        xtc_threshold: f
            .number("xtc_threshold", 0.0, 0.5)?
            .map_or(defaults.xtc_threshold, |x| x as f32),
        min_tokens_to_keep: defaults.min_tokens_to_keep,
        logit_bias: parse_logit_bias(f, vocab)?,
        ..SamplingParams::default()
    };
    for (name, size) in [
        ("presence_context_size", &mut p.presence_context_size),
        ("frequency_context_size", &mut p.frequency_context_size),
    ] {
        if let Some(n) = f.integer(name, 0, 1 << 20)? {
            *size = n as usize;
        }
    }
    if p.top_p == 0.0 {
        return Err(ApiError::invalid("top_p", "top_p must be greater than 0"));
    }
    // -1 is the common spelling of "no top-k".
    p.top_k = match f.integer("top_k", -1, vocab as i64)? {
        Some(k) => k.max(0) as usize,
        None => defaults.top_k,
    };
    // mlx-lm's clients send 0 (and 1) for "no repetition penalty".
    if let Some(r) = f.number("repetition_penalty", 0.0, 10.0)? {
        if r != 0.0 && r != 1.0 {
            p.repetition_penalty = Some(r as f32);
        }
    }
    if let Some(n) = f.integer("repetition_context_size", 1, 1 << 20)? {
        p.repetition_context_size = n as usize;
    }
    p.seed = f.integer("seed", i64::MIN, i64::MAX)?.map(|s| s as u64);
    Ok(p)
}

fn parse_max_tokens(f: &Fields) -> Result<Option<usize>, ApiError> {
    for name in ["max_completion_tokens", "max_tokens"] {
        if let Some(n) = f.integer(name, 1, u32::MAX as i64)? {
            return Ok(Some(n as usize));
        }
    }
    Ok(None)
}

fn parse_logprobs(f: &Fields, endpoint: Endpoint) -> Result<Option<usize>, ApiError> {
    match endpoint {
        Endpoint::Chat => {
            let on = f.bool("logprobs")?.unwrap_or(false);
            let top = f.integer("top_logprobs", 0, MAX_TOP_LOGPROBS)?;
            match (on, top) {
                (false, Some(_)) => Err(ApiError::invalid(
                    "top_logprobs",
                    "top_logprobs needs logprobs set to true",
                )),
                (false, None) => Ok(None),
                (true, top) => Ok(Some(top.unwrap_or(0) as usize)),
            }
        }
        // OpenAI's completions take a count; mlx-lm's clients also send a bool.
        Endpoint::Completions => match f.get("logprobs") {
            Some(serde_json::Value::Bool(on)) => Ok(on.then_some(0)),
            _ => Ok(f
                .integer("logprobs", 0, MAX_COMPLETION_LOGPROBS)?
                .map(|k| k as usize)),
        },
    }
}

/// Reads a request body. `vocab` bounds token ids in prompts and biases.
pub fn parse(endpoint: Endpoint, body: &Value, vocab: usize) -> Result<ParsedRequest, ApiError> {
    parse_with_defaults(endpoint, body, vocab, &SamplingParams::default())
}

/// [`parse`], with the server's sampling defaults for fields a request omits.
pub(crate) fn parse_with_defaults(
    endpoint: Endpoint,
    body: &Value,
    vocab: usize,
    defaults: &SamplingParams,
) -> Result<ParsedRequest, ApiError> {
    let f = Fields::of(body)?;
    f.string("model")?;
    f.string("user")?;
    let n = f.integer("n", 1, MAX_N)?.unwrap_or(1) as usize;
    let inputs = match endpoint {
        Endpoint::Chat => vec![PromptInput::Chat(ChatInput {
            messages: parse_messages(f.get("messages"))?,
            tools: Vec::new(),
            kwargs: super::agent::parse_template_kwargs(&f)?,
        })],
        Endpoint::Completions => {
            if f.bool("echo")?.unwrap_or(false) {
                return Err(ApiError::invalid("echo", "echo is not supported"));
            }
            parse_prompts(f.get("prompt"), vocab)?
        }
    };
    if inputs.len() * n > MAX_CHOICES {
        return Err(ApiError::invalid(
            if inputs.len() > 1 { "prompt" } else { "n" },
            format!(
                "{} prompts x n = {n} asks for {} choices; at most {MAX_CHOICES} per request",
                inputs.len(),
                inputs.len() * n
            ),
        ));
    }
    let stop: Vec<String> = f
        .strings("stop")?
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    if stop.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOPS} stop sequences are supported"),
        ));
    }
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.object("stream_options")? {
        Some(o) => o.bool("include_usage")?.unwrap_or(false),
        None => false,
    };
    let constraint_param = CONSTRAINT_FIELDS
        .into_iter()
        .find(|name| f.get(name).is_some());
    let constraint = crate::grammar::constraint_from_request(body).map_err(|e| {
        ApiError::invalid(
            constraint_param.unwrap_or("response_format"),
            format!("{e:#}"),
        )
    })?;
    let agent = match endpoint {
        Endpoint::Chat => Some(super::agent::parse_request(&f)?),
        Endpoint::Completions => None,
    };
    let mut inputs = inputs;
    if let (Some(agent), [PromptInput::Chat(chat)]) = (&agent, inputs.as_mut_slice()) {
        chat.tools = agent.tools.clone();
    }
    Ok(ParsedRequest {
        agent,
        endpoint,
        inputs,
        n,
        max_tokens: parse_max_tokens(&f)?,
        sampling: parse_sampling(&f, vocab, defaults)?,
        stop,
        logprobs: parse_logprobs(&f, endpoint)?,
        stream,
        include_usage,
        return_token_ids: f.bool("return_token_ids")?.unwrap_or(false),
        constraint,
        constraint_param,
    })
}

/// The number of tokens to generate for a prompt of `prompt_len` tokens:
/// the asked amount must fit the context; the default is cut to fit.
pub(crate) fn completion_budget(
    endpoint: Endpoint,
    asked: Option<usize>,
    prompt_len: usize,
    context: Option<usize>,
    default: usize,
) -> Result<usize, ApiError> {
    let Some(context) = context else {
        return Ok(asked.unwrap_or(default));
    };
    if prompt_len >= context {
        return Err(ApiError::invalid(
            endpoint.prompt_param(),
            format!(
                "the prompt is {prompt_len} tokens, but the model's context is {context} tokens"
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let room = context - prompt_len;
    match asked {
        Some(n) if n > room => Err(ApiError::invalid(
            "max_tokens",
            format!(
                "the prompt ({prompt_len} tokens) plus max_tokens ({n}) exceeds the model's context of {context} tokens"
            ),
        )
        .with_code("context_length_exceeded")),
        Some(n) => Ok(n),
        None => Ok(default.min(room)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(extra: Value) -> Result<ParsedRequest, ApiError> {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        parse(Endpoint::Chat, &body, 100)
    }

    fn param_of(r: Result<ParsedRequest, ApiError>) -> String {
        r.err().expect("should fail").param.unwrap_or_default()
    }

    #[test]
    fn defaults_and_unknown_fields() {
        let r = chat(json!({"foo": 1, "max_tokens": null})).unwrap();
        assert_eq!(r.max_tokens, None);
        assert!(r.sampling.is_greedy());
        assert!(!r.stream);
        assert_eq!(r.logprobs, None);
    }

    #[test]
    fn bad_fields_name_their_param() {
        assert_eq!(param_of(chat(json!({"max_tokens": -1}))), "max_tokens");
        assert_eq!(param_of(chat(json!({"max_tokens": 0}))), "max_tokens");
        assert_eq!(param_of(chat(json!({"max_tokens": "5"}))), "max_tokens");
        assert_eq!(param_of(chat(json!({"temperature": -0.5}))), "temperature");
        assert_eq!(param_of(chat(json!({"n": 0}))), "n");
        assert_eq!(param_of(chat(json!({"n": 17}))), "n");
        assert_eq!(chat(json!({"n": 3})).unwrap().n, 3);
        assert_eq!(param_of(chat(json!({"stop": [1]}))), "stop");
        assert_eq!(
            param_of(chat(json!({"logit_bias": {"500": 1}}))),
            "logit_bias"
        );
        assert_eq!(param_of(chat(json!({"top_logprobs": 2}))), "top_logprobs");
        assert_eq!(param_of(chat(json!({"messages": []}))), "messages");
        assert_eq!(
            param_of(chat(
                json!({"messages": [{"role": "wizard", "content": "x"}]})
            )),
            "messages"
        );
    }

    #[test]
    fn mlx_lm_spellings_and_server_defaults() {
        let r = chat(json!({"repetition_penalty": 0})).unwrap();
        assert_eq!(r.sampling.repetition_penalty, None);
        let c = |v: Value| parse(Endpoint::Completions, &v, 100).unwrap();
        assert_eq!(
            c(json!({"prompt": "x", "logprobs": true})).logprobs,
            Some(0)
        );
        assert_eq!(c(json!({"prompt": "x", "logprobs": false})).logprobs, None);
        let defaults = SamplingParams {
            temperature: 0.7,
            top_k: 5,
            ..SamplingParams::default()
        };
        let body = json!({"messages": [{"role": "user", "content": "hi"}], "top_k": 2});
        let r = parse_with_defaults(Endpoint::Chat, &body, 100, &defaults).unwrap();
        assert_eq!((r.sampling.temperature, r.sampling.top_k), (0.7, 2));
    }

    #[test]
    fn logprobs_and_stops() {
        let r = chat(json!({"logprobs": true, "top_logprobs": 3, "stop": "x"})).unwrap();
        assert_eq!(r.logprobs, Some(3));
        assert_eq!(r.stop, vec!["x"]);
    }

    #[test]
    fn prompt_shapes() {
        let p = |v: Value| parse(Endpoint::Completions, &json!({ "prompt": v }), 100);
        let one = |v: Value| {
            let mut inputs = p(v).unwrap().inputs;
            assert_eq!(inputs.len(), 1);
            inputs.remove(0)
        };
        assert!(matches!(one(json!("hi")), PromptInput::Text { .. }));
        assert!(matches!(one(json!(["hi"])), PromptInput::Text { .. }));
        assert!(matches!(one(json!([1, 2])), PromptInput::Tokens(ref t) if t == &[1, 2]));
        assert!(matches!(one(json!([[3]])), PromptInput::Tokens(_)));
        assert_eq!(p(json!(["a", "b"])).unwrap().inputs.len(), 2);
        assert_eq!(p(json!([[1], [2, 3], "c"])).unwrap().inputs.len(), 3);
        assert_eq!(param_of(p(json!(["a", ""]))), "prompt");
        assert_eq!(param_of(p(json!(["a", 5]))), "prompt");
        assert_eq!(param_of(p(json!([1, 200]))), "prompt");
        assert_eq!(param_of(p(json!(""))), "prompt");
        assert_eq!(param_of(p(json!({}))), "prompt");
        let many: Vec<String> = (0..9).map(|i| i.to_string()).collect();
        let r = parse(Endpoint::Completions, &json!({"prompt": many, "n": 8}), 100);
        assert_eq!(param_of(r), "prompt");
    }

    #[test]
    fn budget_fits_the_context() {
        let b = |asked, len| completion_budget(Endpoint::Chat, asked, len, Some(100), 50);
        assert_eq!(b(None, 10).unwrap(), 50);
        assert_eq!(b(None, 80).unwrap(), 20);
        assert_eq!(b(Some(90), 10).unwrap(), 90);
        assert_eq!(
            b(Some(91), 10).unwrap_err().param.as_deref(),
            Some("max_tokens")
        );
        assert_eq!(b(None, 100).unwrap_err().param.as_deref(), Some("messages"));
    }
}
