//! GLM-4.7 (and Poolside Laguna) calls: `<tool_call>NAME<arg_key>k</arg_key>
//! <arg_value>v</arg_value>…</tool_call>`, with mlx-lm's fallbacks for GLM
//! outputs that write JSON or `name key=value` instead.

use std::sync::LazyLock;

use anyhow::Result;
use regex::Regex;
use serde_json::{json, Map, Value};

use super::values::{deserialize, is_string};
use super::{segments, Function, ToolCall};

pub(crate) const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

static ARG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?s)<arg_key>(.*?)</arg_key>(?:\\n|\s)*<arg_value>(.*?)</arg_value>")
        .expect("regex")
});

fn call(name: &str, arguments: Map<String, Value>) -> ToolCall {
    ToolCall {
        id: None,
        name: name.to_string(),
        arguments: Value::Object(arguments),
    }
}

/// Values of non-string parameters given as text become JSON values.
fn normalize(
    name: &str,
    arguments: Map<String, Value>,
    functions: &[Function],
) -> Map<String, Value> {
    arguments
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) if !is_string(functions, name, &k) => deserialize(&s),
                v if is_string(functions, name, &k) && !v.is_string() => {
                    Value::String(v.to_string())
                }
                v => v,
            };
            (k, v)
        })
        .collect()
}

fn json_call(text: &str, functions: &[Function]) -> Option<ToolCall> {
    let mut parsed: Value = serde_json::from_str(text.trim()).ok()?;
    if let Value::Array(items) = &parsed {
        if items.first().is_some_and(Value::is_object) {
            parsed = items[0].clone();
        }
    }
    let o = parsed.as_object()?;
    let (mut name, mut arguments) = if o.contains_key("name") && o.contains_key("arguments") {
        (o.get("name").cloned(), o.get("arguments").cloned())
    } else if o.contains_key("function") && o.contains_key("arguments") {
        (o.get("function").cloned(), o.get("arguments").cloned())
    } else if let Some(tool) = o.get("tool").filter(|t| t.is_object()) {
        (tool.get("name").cloned(), tool.get("arguments").cloned())
    } else {
        (None, None)
    };
    if let Some(Value::Object(inner)) = &name {
        if arguments.as_ref().is_none_or(Value::is_null) {
            arguments = inner.get("arguments").cloned();
        }
        name = inner.get("name").cloned();
    }
    if let Some(Value::String(s)) = &arguments {
        arguments = Some(deserialize(s));
    }
    let name = name?.as_str()?.to_string();
    match arguments {
        None | Some(Value::Null) => Some(call(&name, Map::new())),
        Some(Value::Object(args)) => Some(call(&name, normalize(&name, args, functions))),
        _ => None,
    }
}

/// POSIX shell words (Python's `shlex.split`); `None` on an open quote.
fn shell_words(text: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => w.push(c),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => match chars.next()? {
                            c @ ('"' | '\\' | '$' | '`') => w.push(c),
                            '\n' => {}
                            c => {
                                w.push('\\');
                                w.push(c);
                            }
                        },
                        c => w.push(c),
                    }
                }
            }
            '\\' => {
                if let Some(c) = chars.next() {
                    if c != '\n' {
                        word.get_or_insert_with(String::new).push(c);
                    }
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Some(words)
}

fn key_values(text: &str, name: &str, functions: &[Function]) -> Option<Map<String, Value>> {
    if !text.contains('=') {
        return None;
    }
    let words = shell_words(text)?;
    if words.is_empty() {
        return None;
    }
    let mut out = Map::new();
    for w in words {
        let (k, v) = w.split_once('=')?;
        let k = k.trim();
        if k.is_empty() {
            return None;
        }
        let v = if is_string(functions, name, k) {
            Value::String(v.to_string())
        } else {
            deserialize(v)
        };
        out.insert(k.to_string(), v);
    }
    Some(out)
}

fn plain_call(text: &str, functions: &[Function]) -> Option<ToolCall> {
    let stripped = text.trim();
    if stripped.is_empty() {
        return None;
    }
    if let Some((first, rest)) = stripped.split_once('\n') {
        let (name, rest) = (first.trim(), rest.trim());
        if !name.is_empty() && !rest.is_empty() {
            if let Value::Object(args) = deserialize(rest) {
                return Some(call(name, normalize(name, args, functions)));
            }
        }
    }
    let (name, rest) = stripped.split_once(' ').unwrap_or((stripped, ""));
    let rest = rest.trim();
    if rest.is_empty() {
        return Some(call(name, Map::new()));
    }
    if let Value::Object(args) = deserialize(rest) {
        return Some(call(name, normalize(name, args, functions)));
    }
    if let Some(args) = key_values(rest, name, functions) {
        return Some(call(name, args));
    }
    Some(call(
        name,
        json!({"raw": rest})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    ))
}

fn parse_one(text: &str, functions: &[Function]) -> ToolCall {
    let Some(at) = text.find("<arg_key>") else {
        return json_call(text, functions)
            .or_else(|| plain_call(text, functions))
            .unwrap_or_else(|| {
                call(
                    "unknown",
                    json!({"raw": text.trim()})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                )
            });
    };
    let name = text[..at].trim();
    let mut arguments = Map::new();
    for m in ARG.captures_iter(text) {
        let key = m[1].trim().to_string();
        let value = m[2].trim();
        let value = if is_string(functions, name, &key) {
            Value::String(value.to_string())
        } else {
            deserialize(value)
        };
        arguments.insert(key, value);
    }
    call(name, arguments)
}

pub fn parse(text: &str, functions: &[Function]) -> Result<Vec<ToolCall>> {
    Ok(segments(text, START, END)
        .into_iter()
        .map(|s| parse_one(s, functions))
        .collect())
}
