//! Muse Spark calls: `<atem:function_calls><atem:invoke name="NAME">
//! <atem:parameter name="k">v</atem:parameter>…</atem:invoke>
//! </atem:function_calls>`; a value is JSON when it parses as JSON.

use std::sync::LazyLock;

use anyhow::{bail, Result};
use regex::Regex;
use serde_json::{Map, Value};

use super::{segments, ToolCall};

pub(crate) const START: &str = "<atem:function_calls>";
const END: &str = "</atem:function_calls>";

static INVOKE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?s)<atem:invoke\b[^>]*?\bname="(?P<name>[^"]+)">(?P<body>(?:<atem:parameter\b.*?</atem:parameter>|.)*?)(?:</atem:invoke>|$)"#,
    )
    .expect("regex")
});
static PARAM: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?s)<atem:parameter\b[^>]*?\bname="(?P<name>[^"]+)"[^>]*?>(?P<value>.*?)</atem:parameter>"#)
        .expect("regex")
});

pub fn parse(text: &str) -> Result<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for block in segments(text, START, END) {
        for invoke in INVOKE.captures_iter(block) {
            let arguments: Map<String, Value> = PARAM
                .captures_iter(&invoke["body"])
                .map(|p| {
                    let raw = &p["value"];
                    let value = serde_json::from_str(raw)
                        .unwrap_or_else(|_| Value::String(raw.trim().to_string()));
                    (p["name"].to_string(), value)
                })
                .collect();
            calls.push(ToolCall {
                id: None,
                name: invoke["name"].to_string(),
                arguments: Value::Object(arguments),
            });
        }
    }
    if calls.is_empty() {
        bail!("no Muse Spark call in {text:?}");
    }
    Ok(calls)
}
