//! Tool calls in model output: the formats model families write them in,
//! which format a chat template implies (as mlx-lm infers it), parsing the
//! text into calls, and the grammar that forces a call whose arguments
//! follow the function's JSON schema. Free of HTTP: the server maps these
//! calls onto OpenAI's and Anthropic's shapes.

mod gemma;
mod gemma4;
mod glm47;
mod grammar;
mod harmony;
mod json_tools;
mod kimi_k2;
mod kimi_k3;
mod llama3;
mod longcat;
mod minicpm5;
mod minimax_m2;
mod mistral;
mod muse_spark;
mod phi;
mod prompt;
mod pylit;
mod pythonic;
mod qwen3_coder;
#[cfg(feature = "server")]
mod stream;
mod values;

use anyhow::{bail, Result};
use serde_json::Value;

pub use grammar::{call_grammar, grammar_head, Function, ReasoningPrefix, ToolChoice};
pub(crate) use prompt::{template_supports_tools, with_tools_in_prompt};
#[cfg(feature = "server")]
pub(crate) use stream::{CallEvent, CallStream};

/// One call the model asked for. `arguments` is the parsed JSON object.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The model's own id, when its format carries one (Mistral may).
    pub id: Option<String>,
    /// The function's name.
    pub name: String,
    /// The arguments, a JSON object.
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
    /// Gemma 4: `<|tool_call>call:NAME{key:<|"|>value<|"|>}<tool_call|>`.
    Gemma4,
    /// GLM-4.7: `<tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`.
    Glm47,
    /// Poolside Laguna: GLM-4.7's format under mlx-lm's name for it.
    Laguna,
    /// Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{…}<|tool_call_end|>…`.
    KimiK2,
    /// Kimi K3 XTML: `<|open|>tools<|sep|><|open|>call tool="NAME"<|sep|>…<|close|>call<|sep|><|close|>tools<|sep|>`.
    KimiK3,
    /// LongCat: `<longcat_tool_call>NAME<longcat_arg_key>k</longcat_arg_key><longcat_arg_value>v</longcat_arg_value></longcat_tool_call>`.
    Longcat,
    /// MiniCPM5: `<function name="NAME"><param name="k">v</param></function>`.
    MiniCpm5,
    /// MiniMax-M2: `<minimax:tool_call><invoke name="NAME"><parameter name="k">v</parameter></invoke></minimax:tool_call>`.
    MinimaxM2,
    /// Muse Spark: `<atem:function_calls><atem:invoke name="NAME"><atem:parameter name="k">v</atem:parameter></atem:invoke></atem:function_calls>`.
    MuseSpark,
    /// Pythonic (LFM2 and others): `<|tool_call_start|>[NAME(k=v, …)]<|tool_call_end|>`.
    Pythonic,
    /// Qwen3-Coder: `<tool_call><function=NAME><parameter=k>v</parameter></function></tool_call>`.
    Qwen3Coder,
}

pub(crate) const FORMAT_NAMES: [&str; 17] = [
    "json_tools",
    "llama3",
    "mistral",
    "function_gemma",
    "phi",
    "harmony",
    "gemma4",
    "glm47",
    "laguna",
    "kimi_k2",
    "kimi_k3",
    "longcat",
    "minicpm5",
    "minimax_m2",
    "muse_spark",
    "pythonic",
    "qwen3_coder",
];

const ALL: [ToolFormat; 17] = [
    ToolFormat::JsonTools,
    ToolFormat::Llama3,
    ToolFormat::Mistral,
    ToolFormat::FunctionGemma,
    ToolFormat::Phi,
    ToolFormat::Harmony,
    ToolFormat::Gemma4,
    ToolFormat::Glm47,
    ToolFormat::Laguna,
    ToolFormat::KimiK2,
    ToolFormat::KimiK3,
    ToolFormat::Longcat,
    ToolFormat::MiniCpm5,
    ToolFormat::MinimaxM2,
    ToolFormat::MuseSpark,
    ToolFormat::Pythonic,
    ToolFormat::Qwen3Coder,
];

impl ToolFormat {
    /// The format named on the command line (mlx-lm's names where it has one;
    /// `hermes` and `qwen` are aliases of `json_tools`).
    pub fn from_name(name: &str) -> Result<Self> {
        Ok(match name {
            "hermes" | "qwen" => Self::JsonTools,
            "llama3_json" => Self::Llama3,
            "gemma" => Self::FunctionGemma,
            "phi4" => Self::Phi,
            "gpt_oss" => Self::Harmony,
            other => match ALL.into_iter().find(|f| f.name() == other) {
                Some(f) => f,
                None => bail!(
                    "unknown tool-call parser {other:?}; expected one of {}",
                    FORMAT_NAMES.join(", ")
                ),
            },
        })
    }

    /// The format's `--tool-call-parser` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::JsonTools => "json_tools",
            Self::Llama3 => "llama3",
            Self::Mistral => "mistral",
            Self::FunctionGemma => "function_gemma",
            Self::Phi => "phi",
            Self::Harmony => "harmony",
            Self::Gemma4 => "gemma4",
            Self::Glm47 => "glm47",
            Self::Laguna => "laguna",
            Self::KimiK2 => "kimi_k2",
            Self::KimiK3 => "kimi_k3",
            Self::Longcat => "longcat",
            Self::MiniCpm5 => "minicpm5",
            Self::MinimaxM2 => "minimax_m2",
            Self::MuseSpark => "muse_spark",
            Self::Pythonic => "pythonic",
            Self::Qwen3Coder => "qwen3_coder",
        }
    }

    /// The format a chat template writes calls in, by the markers it names:
    /// mlx-lm's checks in mlx-lm's order (`_infer_tool_parser`), then
    /// mlx-bun's own for Phi, harmony and Llama 3. `None`: the template
    /// shows no tool-call format (see [`ToolFormat::infer_from_vocab`]).
    pub fn infer(template: &str) -> Option<Self> {
        let has = |s: &str| template.contains(s);
        Some(if has("<minimax:tool_call>") {
            Self::MinimaxM2
        } else if has("<|tool_call>") && has("<tool_call|>") {
            Self::Gemma4
        } else if has("<start_function_call>") {
            Self::FunctionGemma
        } else if has("<longcat_tool_call>") {
            Self::Longcat
        } else if has("<arg_key>") {
            Self::Glm47
        } else if has("<|tool_list_start|>") || has("<|tool_call_start|>") {
            Self::Pythonic
        } else if has("<tool_call>\\n<function=") || has("<tool_call>\n<function=") {
            Self::Qwen3Coder
        } else if has("<|tool_calls_section_begin|>") {
            Self::KimiK2
        } else if has("<function name=\"") && has("<param name=\"") {
            Self::MiniCpm5
        } else if has("[TOOL_CALLS]") {
            Self::Mistral
        } else if has("<atem:function_calls>") {
            Self::MuseSpark
        } else if has("<tool_call>") && has("tool_call.name") {
            Self::JsonTools
        } else if has("<|tool_call|>") {
            Self::Phi
        } else if has("<|channel|>") && has("to=functions") {
            Self::Harmony
        } else if has("<|python_tag|>") || has("respond with a JSON for a function call") {
            Self::Llama3
        } else {
            return None;
        })
    }

    /// mlx-lm's fallback when the template names no format: Kimi K3's XTML
    /// tokens, or LFM2's pythonic call tokens, in the vocabulary.
    pub fn infer_from_vocab(has_token: &dyn Fn(&str) -> bool) -> Option<Self> {
        if ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]
            .into_iter()
            .all(has_token)
        {
            Some(Self::KimiK3)
        } else if has_token("<|tool_call_start|>") && has_token("<|tool_call_end|>") {
            Some(Self::Pythonic)
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
            Self::Gemma4 => gemma4::START,
            Self::Glm47 | Self::Laguna => glm47::START,
            Self::KimiK2 => kimi_k2::START,
            Self::KimiK3 => kimi_k3::START,
            Self::Longcat => longcat::START,
            Self::MiniCpm5 => minicpm5::START,
            Self::MinimaxM2 => minimax_m2::START,
            Self::MuseSpark => muse_spark::START,
            Self::Pythonic => pythonic::START,
            Self::Qwen3Coder => qwen3_coder::START,
        }
    }

    /// Parses the output from its first call marker on into calls.
    pub fn parse(self, text: &str) -> Result<Vec<ToolCall>> {
        self.parse_with(text, &[])
    }

    /// As [`ToolFormat::parse`], with the request's functions: formats that
    /// write values as text give them the types the schemas declare.
    pub fn parse_with(self, text: &str, functions: &[Function]) -> Result<Vec<ToolCall>> {
        let calls = match self {
            Self::JsonTools => json_tools::parse(text)?,
            Self::Llama3 => llama3::parse(text)?,
            Self::Mistral => mistral::parse(text)?,
            Self::FunctionGemma => gemma::parse(text)?,
            Self::Phi => phi::parse(text)?,
            Self::Harmony => harmony::parse(text)?,
            Self::Gemma4 => gemma4::parse(text)?,
            Self::Glm47 | Self::Laguna => glm47::parse(text, functions)?,
            Self::KimiK2 => kimi_k2::parse(text)?,
            Self::KimiK3 => kimi_k3::parse(text)?,
            Self::Longcat => longcat::parse(text, functions)?,
            Self::MiniCpm5 => minicpm5::parse(text, functions)?,
            Self::MinimaxM2 => minimax_m2::parse(text, functions)?,
            Self::MuseSpark => muse_spark::parse(text)?,
            Self::Pythonic => pythonic::parse(text)?,
            Self::Qwen3Coder => qwen3_coder::parse(text, functions)?,
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
        self.split_with(text, &[])
    }

    /// As [`ToolFormat::split`], typing values by the request's functions.
    pub fn split_with(self, text: &str, functions: &[Function]) -> (String, Vec<ToolCall>) {
        match self.find_start(text) {
            Some(at) => match self.parse_with(&text[at..], functions) {
                Ok(calls) => (text[..at].to_string(), calls),
                Err(_) => (text.to_string(), Vec::new()),
            },
            None => (text.to_string(), Vec::new()),
        }
    }
}

/// The text after each `start` marker, up to its `end` marker (or the end
/// of the text: a call cut short).
pub(crate) fn segments<'a>(text: &'a str, start: &str, end: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(start) {
        let body = &rest[at + start.len()..];
        match body.find(end) {
            Some(e) => {
                out.push(&body[..e]);
                rest = &body[e + end.len()..];
            }
            None => {
                out.push(body);
                break;
            }
        }
    }
    out
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
