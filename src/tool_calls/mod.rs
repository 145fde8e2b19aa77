//! Tool calls in model output: the formats model families write them in,
//! which format a chat template implies (as mlx-lm infers it), parsing the
//! text into calls, and the grammar that forces a call whose arguments
//! follow the function's JSON schema. Free of HTTP: the server maps these
//! calls onto OpenAI's and Anthropic's shapes.

mod gemma;
mod grammar;
mod harmony;
mod json_tools;
mod llama3;
mod mistral;
mod phi;
mod prompt;

use anyhow::{bail, Result};
use serde_json::Value;

pub use grammar::{call_grammar, grammar_head, Function, ReasoningPrefix, ToolChoice};
pub use prompt::{template_supports_tools, with_tools_in_prompt};

/// One call the model asked for. `arguments` is the parsed JSON object.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The model's own id, when its format carries one (Mistral may).
    pub id: Option<String>,
    pub name: String,
    pub arguments: Value,
}

/// The tool-call formats of the model families mlx-bun loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// Hermes / Qwen 2.5 / Qwen 3: `<tool_call>{"name": …, "arguments": …}</tool_call>`
    /// (mlx-lm's `json_tools`).
    JsonTools,
    /// Llama 3.1-3.3: `{"name": …, "parameters": …}`, optionally after `<|python_tag|>`.
    Llama3,
    /// Mistral: `[TOOL_CALLS][{"name": …, "arguments": …}]` or `[TOOL_CALLS]name[ARGS]{…}`.
    Mistral,
    /// FunctionGemma: `<start_function_call>call:name{key:<escape>value<escape>}<end_function_call>`.
    FunctionGemma,
    /// Phi-4-mini: `<|tool_call|>[{"name": …, "arguments": …}]<|/tool_call|>`.
    Phi,
    /// GPT-OSS harmony: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`.
    Harmony,
}

pub(crate) const FORMAT_NAMES: [&str; 6] = [
    "json_tools",
    "llama3",
    "mistral",
    "function_gemma",
    "phi",
    "harmony",
];

impl ToolFormat {
    /// The format named on the command line (mlx-lm's names where it has one;
    /// `hermes` and `qwen` are aliases of `json_tools`).
    pub fn from_name(name: &str) -> Result<Self> {
        Ok(match name {
            "json_tools" | "hermes" | "qwen" => Self::JsonTools,
            "llama3" | "llama3_json" => Self::Llama3,
            "mistral" => Self::Mistral,
            "function_gemma" | "gemma" => Self::FunctionGemma,
            "phi" | "phi4" => Self::Phi,
            "harmony" | "gpt_oss" => Self::Harmony,
            other => bail!(
                "unknown tool-call parser {other:?}; expected one of {}",
                FORMAT_NAMES.join(", ")
            ),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::JsonTools => "json_tools",
            Self::Llama3 => "llama3",
            Self::Mistral => "mistral",
            Self::FunctionGemma => "function_gemma",
            Self::Phi => "phi",
            Self::Harmony => "harmony",
        }
    }

    /// The format a chat template writes calls in, by the markers it names
    /// (the checks and their order follow mlx-lm's inference for the formats
    /// both know). `None`: the template shows no tool-call format.
    pub fn infer(template: &str) -> Option<Self> {
        if template.contains("<start_function_call>") {
            Some(Self::FunctionGemma)
        } else if template.contains("[TOOL_CALLS]") {
            Some(Self::Mistral)
        } else if template.contains("<tool_call>") && template.contains("tool_call.name") {
            Some(Self::JsonTools)
        } else if template.contains("<|tool_call|>") {
            Some(Self::Phi)
        } else if template.contains("<|channel|>") && template.contains("to=functions") {
            Some(Self::Harmony)
        } else if template.contains("<|python_tag|>")
            || template.contains("respond with a JSON for a function call")
        {
            Some(Self::Llama3)
        } else {
            None
        }
    }

    /// The text that opens a call; output before it is ordinary content.
    pub(crate) fn start_marker(self) -> &'static str {
        match self {
            Self::JsonTools => json_tools::START,
            Self::Llama3 => llama3::START,
            Self::Mistral => mistral::START,
            Self::FunctionGemma => gemma::START,
            Self::Phi => phi::START,
            Self::Harmony => harmony::START,
        }
    }

    /// Parses the output from its first call marker on into calls.
    pub fn parse(self, text: &str) -> Result<Vec<ToolCall>> {
        let calls = match self {
            Self::JsonTools => json_tools::parse(text)?,
            Self::Llama3 => llama3::parse(text)?,
            Self::Mistral => mistral::parse(text)?,
            Self::FunctionGemma => gemma::parse(text)?,
            Self::Phi => phi::parse(text)?,
            Self::Harmony => harmony::parse(text)?,
        };
        if calls.is_empty() {
            bail!("no tool call found in {text:?}");
        }
        Ok(calls)
    }

    /// Where calls begin in `text`, if anywhere: the start marker, or for
    /// Llama 3 also a JSON object that opens the answer.
    pub(crate) fn find_start(self, text: &str) -> Option<usize> {
        if let Some(at) = text.find(self.start_marker()) {
            return Some(at);
        }
        match self {
            Self::Llama3 => llama3::bare_start(text),
            Self::Harmony => harmony::find_start(text),
            _ => None,
        }
    }

    /// Splits a whole answer into the content before the calls and the calls.
    /// Text that does not parse as calls stays content.
    pub fn split(self, text: &str) -> (String, Vec<ToolCall>) {
        match self.find_start(text) {
            Some(at) => match self.parse(&text[at..]) {
                Ok(calls) => (text[..at].to_string(), calls),
                Err(_) => (text.to_string(), Vec::new()),
            },
            None => (text.to_string(), Vec::new()),
        }
    }
}

/// A call object as the JSON formats write it: `name` plus `arguments`
/// (or Llama's `parameters`), the arguments an object or a string holding one.
pub(crate) fn call_from_json(v: &Value) -> Result<ToolCall> {
    let Some(obj) = v.as_object() else {
        bail!("a tool call must be a JSON object, got {v}");
    };
    let name = match obj.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => bail!("a tool call needs a \"name\" string, got {v}"),
    };
    let args = obj
        .get("arguments")
        .or_else(|| obj.get("parameters"))
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    let arguments = match args {
        Value::String(s) => serde_json::from_str(&s)
            .map_err(|e| anyhow::anyhow!("tool call arguments are not JSON: {e}"))?,
        other => other,
    };
    if !arguments.is_object() {
        bail!("tool call arguments must be a JSON object, got {arguments}");
    }
    Ok(ToolCall {
        id: obj.get("id").and_then(Value::as_str).map(str::to_string),
        name,
        arguments,
    })
}

/// Every JSON value in `text`, one after another (separated by whitespace,
/// `;` or `,`), and the rest that is not JSON.
pub(crate) fn json_values(text: &str) -> (Vec<Value>, &str) {
    let mut values = Vec::new();
    let mut rest = text.trim_start();
    loop {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match stream.next() {
            Some(Ok(v)) => {
                values.push(v);
                rest = rest[stream.byte_offset()..].trim_start();
                rest = rest.strip_prefix([';', ',']).unwrap_or(rest).trim_start();
            }
            _ => return (values, rest),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inference_follows_the_template_markers() {
        let qwen = r#"{%- for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>\n{"name": "{{ tool_call.name }}"}"#;
        assert_eq!(ToolFormat::infer(qwen), Some(ToolFormat::JsonTools));
        assert_eq!(
            ToolFormat::infer("{{ '[TOOL_CALLS]' + calls }}"),
            Some(ToolFormat::Mistral)
        );
        assert_eq!(
            ToolFormat::infer("{{- '<|python_tag|>' + tool_call.name }}"),
            Some(ToolFormat::Llama3)
        );
        assert_eq!(
            ToolFormat::infer("<|tool_call|>{{ tool_calls }}<|/tool_call|>"),
            Some(ToolFormat::Phi)
        );
        assert_eq!(
            ToolFormat::infer("<|channel|>commentary to=functions.{{ name }}"),
            Some(ToolFormat::Harmony)
        );
        assert_eq!(
            ToolFormat::infer("<start_function_call>call:"),
            Some(ToolFormat::FunctionGemma)
        );
        assert_eq!(
            ToolFormat::infer("<|im_start|>{{ m.role }}\n{{ m.content }}"),
            None
        );
        assert!(ToolFormat::from_name("hermes").is_ok());
        assert!(ToolFormat::from_name("nope")
            .unwrap_err()
            .to_string()
            .contains("json_tools"));
    }

    #[test]
    fn split_keeps_unparsable_text_as_content() {
        let (content, calls) = ToolFormat::JsonTools.split("I will call <tool_call>\nnot json");
        assert_eq!(content, "I will call <tool_call>\nnot json");
        assert!(calls.is_empty());
    }
}
