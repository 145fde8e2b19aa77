//! Kimi K3 calls in its XTML markup: `<|open|>call tool="NAME"<|sep|>` with
//! typed `<|open|>argument key="k" type="t"<|sep|>v<|close|>argument<|sep|>`
//! pieces or one `<|open|>json …<|sep|>{…}<|close|>json<|sep|>` block, inside
//! `<|open|>tools<|sep|>…<|close|>tools<|sep|>`. A call that does not parse
//! is left out; its siblings stay.

use std::sync::LazyLock;

use anyhow::{bail, Result};
use regex::Regex;
use serde_json::{Map, Value};

use super::{segments, ToolCall};

pub(crate) const START: &str = "<|open|>tools<|sep|>";
const END: &str = "<|close|>tools<|sep|>";

static CALL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?s)<\|open\|>call(?P<attrs>.*?)<\|sep\|>(?P<body>.*?)<\|close\|>call<\|sep\|>")
        .expect("regex")
});
static ARGUMENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?s)<\|open\|>argument(?P<attrs>.*?)<\|sep\|>(?P<value>.*?)<\|close\|>argument<\|sep\|>",
    )
    .expect("regex")
});
static JSON: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?s)<\|open\|>json.*?<\|sep\|>(?P<value>.*?)<\|close\|>json<\|sep\|>")
        .expect("regex")
});
static ATTR: LazyLock<Regex> = LazyLock::new(|| Regex::new(r#"(\w+)="([^"]*)""#).expect("regex"));

fn attrs(text: &str) -> Map<String, Value> {
    ATTR.captures_iter(text)
        .map(|m| {
            let v = m[2].replace("&quot;", "\"").replace("&amp;", "&");
            (m[1].to_string(), Value::String(v))
        })
        .collect()
}

fn parse_one(attr_text: &str, body: &str) -> Result<ToolCall> {
    let a = attrs(attr_text);
    let Some(name) = a
        .get("tool")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    else {
        bail!("a Kimi K3 call without its tool name");
    };
    let arguments = if let Some(m) = JSON.captures(body) {
        let v: Value = serde_json::from_str(&m["value"])?;
        if !v.is_object() {
            bail!("a Kimi K3 JSON block must be an object");
        }
        v
    } else {
        let mut out = Map::new();
        for m in ARGUMENT.captures_iter(body) {
            let a = attrs(&m["attrs"]);
            let Some(key) = a.get("key").and_then(Value::as_str) else {
                bail!("a Kimi K3 argument without its key");
            };
            let raw = &m["value"];
            let value = match a.get("type").and_then(Value::as_str).unwrap_or("string") {
                "string" => Value::String(raw.to_string()),
                _ => serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string())),
            };
            out.insert(key.to_string(), value);
        }
        Value::Object(out)
    };
    Ok(ToolCall {
        id: None,
        name: name.to_string(),
        arguments,
    })
}

pub fn parse(text: &str) -> Result<Vec<ToolCall>> {
    let calls: Vec<ToolCall> = segments(text, START, END)
        .into_iter()
        .flat_map(|s| CALL.captures_iter(s).collect::<Vec<_>>())
        .filter_map(|m| parse_one(&m["attrs"], &m["body"]).ok())
        .collect();
    if calls.is_empty() {
        bail!("no Kimi K3 call in {text:?}");
    }
    Ok(calls)
}
