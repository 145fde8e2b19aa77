//! Hugging Face chat templates rendered with minijinja, with the Python
//! string methods and helpers (`raise_exception`, `strftime_now`) HF templates use.

use anyhow::{anyhow, bail, Result};
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

/// One chat message. `content` is plain text; OpenAI content-part arrays are
/// flattened to their text parts on the way in. An assistant turn may carry
/// `tool_calls` (OpenAI's objects; their `arguments` are given to templates
/// as JSON objects, as mlx-lm does) and a tool turn its `tool_call_id`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Message {
    pub role: String,
    #[serde(deserialize_with = "content_text", default)]
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An earlier turn's reasoning, for templates that render it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }

    /// The message as templates see it: call arguments given as JSON strings
    /// (OpenAI's spelling) become objects.
    fn for_template(&self) -> Self {
        let mut m = self.clone();
        for call in m.tool_calls.iter_mut().flatten() {
            let f = match call.get_mut("function") {
                Some(f) => f,
                None => call,
            };
            if let Some(serde_json::Value::String(s)) = f.get("arguments") {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(s) {
                    f["arguments"] = v;
                }
            }
        }
        m
    }
}

fn content_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    match v {
        serde_json::Value::Null => Ok(String::new()),
        serde_json::Value::String(s) => Ok(s),
        serde_json::Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match p.get("type").and_then(|t| t.as_str()) {
                    Some("text") | None => {
                        let t = p.get("text").and_then(|t| t.as_str()).ok_or_else(|| {
                            serde::de::Error::custom("content part without a text field")
                        })?;
                        out.push_str(t);
                    }
                    Some(other) => {
                        return Err(serde::de::Error::custom(format!(
                            "unsupported content part type {other:?}"
                        )))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(serde::de::Error::custom(
            "content must be a string or an array of parts",
        )),
    }
}

pub(crate) const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];

/// Checks roles and emptiness; returns a message fit for a 400 answer.
pub(crate) fn validate_messages(messages: &[Message]) -> Result<()> {
    if messages.is_empty() {
        bail!("messages must not be empty");
    }
    for (i, m) in messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            bail!(
                "messages[{i}].role {:?} is not one of {}",
                m.role,
                ROLES.join(", ")
            );
        }
    }
    Ok(())
}

/// Instructions one rendering may run: real templates need a few dozen per
/// message, so this allows conversations far beyond any context length.
const TEMPLATE_FUEL: u64 = 20_000_000;

pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// Python's `json.dumps` layout, as Hugging Face's `tojson` writes it: keys
/// in their order, `", "` and `": "` separators, no HTML escaping (minijinja's
/// own filter escapes `<` and `&`, which would change tool descriptions).
fn py_json(v: &serde_json::Value, out: &mut String) {
    match v {
        serde_json::Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&serde_json::Value::String(k.clone()).to_string());
                out.push_str(": ");
                py_json(x, out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_json(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn py_tojson(value: &Value, indent: Option<usize>) -> Result<Value, Error> {
    let v = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = match indent {
        Some(n) => {
            let pad = " ".repeat(n);
            let mut buf = Vec::new();
            let fmt = serde_json::ser::PrettyFormatter::with_indent(pad.as_bytes());
            let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
            serde::Serialize::serialize(&v, &mut ser)
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
            String::from_utf8(buf).expect("JSON is UTF-8")
        }
        None => {
            let mut out = String::new();
            py_json(&v, &mut out);
            out
        }
    };
    Ok(Value::from_safe_string(text))
}

fn strftime_now(format: String) -> String {
    // Templates use it for "today's date"; render the UTC date in the common formats.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let (y, m, d) = civil_from_days(days);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    format
        .replace("%Y", &format!("{y:04}"))
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%B", MONTHS[(m - 1) as usize])
        .replace("%b", &MONTHS[(m - 1) as usize][..3])
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d)
}

impl ChatTemplate {
    pub fn new(
        source: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self> {
        let mut env = Environment::new();
        // Templates come with the model: bound their work, so a template that
        // loops for hours (nested `range` loops) is an error, not a hang.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", py_tojson);
        env.add_template_owned("chat", source.clone())
            .map_err(|e| anyhow!("invalid chat template: {e}"))?;
        Ok(Self {
            env,
            source,
            bos_token,
            eos_token,
        })
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where
    /// the assistant's reply begins.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, None, &Default::default())
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// [`render`](Self::render) with OpenAI `tools` and extra variables
    /// (`chat_template_kwargs` such as `enable_thinking`).
    pub(crate) fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Option<&[serde_json::Value]>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let tmpl = self.env.get_template("chat")?;
        let messages: Vec<Message> = messages.iter().map(Message::for_template).collect();
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
            tools => tools,
            ..Value::from_serialize(kwargs)
        })
        .map_err(|e| anyhow!("chat template failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runaway_template_is_an_error() {
        let src =
            "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src.into(), None, None).unwrap();
        let started = std::time::Instant::now();
        let err = t.render(&[Message::new("user", "hi")], true).unwrap_err();
        assert!(err.to_string().contains("fuel"), "{err}");
        assert!(started.elapsed().as_secs() < 30);
        let ok = ChatTemplate::new("{{ messages[0].content }}".into(), None, None).unwrap();
        assert_eq!(
            ok.render(&[Message::new("user", "hi")], true).unwrap(),
            "hi"
        );
    }

    /// The same conversation rendered by transformers (scripts/oracle/make_template_golden.py).
    #[test]
    fn tool_prompt_equals_transformers_rendering() {
        let golden: serde_json::Value = serde_json::from_str(include_str!(
            "../tests/data/qwen3_template_tools_golden.json"
        ))
        .unwrap();
        let t = ChatTemplate::new(
            include_str!("../tests/data/qwen3_chat_template.jinja").into(),
            None,
            None,
        )
        .unwrap();
        let messages: Vec<Message> = serde_json::from_value(golden["messages"].clone()).unwrap();
        let tools = golden["tools"].as_array().unwrap().clone();
        for thinking in [true, false] {
            let mut kwargs = serde_json::Map::new();
            kwargs.insert("enable_thinking".into(), thinking.into());
            let ours = t
                .render_with(&messages, true, Some(&tools), &kwargs)
                .unwrap();
            assert_eq!(
                ours,
                golden["rendered"][thinking.to_string()],
                "enable_thinking={thinking}"
            );
        }
    }

    #[test]
    fn tool_turns_round_trip_through_a_qwen3_template() {
        let t = ChatTemplate::new(
            include_str!("../tests/data/qwen3_chat_template.jinja").into(),
            None,
            None,
        )
        .unwrap();
        let mut call = Message::new("assistant", "");
        call.tool_calls = Some(vec![serde_json::json!({"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}})]);
        let mut result = Message::new("tool", "21 C");
        result.tool_call_id = Some("call_1".into());
        let messages = [Message::new("user", "Weather in Paris?"), call, result];
        let tools = [serde_json::json!({"type": "function", "function": {"name": "get_weather"}})];
        let mut kwargs = serde_json::Map::new();
        kwargs.insert("enable_thinking".into(), false.into());
        let text = t
            .render_with(&messages, true, Some(&tools), &kwargs)
            .unwrap();
        assert!(text.contains("<tools>\n{"), "{text}");
        assert!(text.contains("\"name\": \"get_weather\""), "{text}");
        assert!(
            text.contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
            "{text}"
        );
        assert!(
            text.contains("<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>"),
            "{text}"
        );
        assert!(
            text.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            "{text}"
        );
    }
}
