//! Pythonic calls (LFM2 and others): `<|tool_call_start|>[name(key=value,
//! …), …]<|tool_call_end|>`, Python keyword calls whose values are literals.

use std::sync::LazyLock;

use anyhow::{bail, Result};
use regex::Regex;
use serde_json::{Map, Value};

use super::{pylit, segments, ToolCall};

pub(crate) const START: &str = "<|tool_call_start|>";
const END: &str = "<|tool_call_end|>";

static CALL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)\[(?P<name>[\w.]+)\((?P<args>.*?)\)\]").expect("regex"));
static ARG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?s)(?P<key>\w+)=(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>[^,]+))(?:,\s*|$)"#)
        .expect("regex")
});

/// The regex reading mlx-lm falls back to for text that is not Python.
fn loose(text: &str) -> Option<ToolCall> {
    let m = CALL.captures(text)?;
    let mut arguments = Map::new();
    for a in ARG.captures_iter(&m["args"]) {
        let raw = match a.name("bare") {
            Some(b) => b.as_str().trim(),
            None => a.name("dq").or(a.name("sq")).map_or("", |q| q.as_str()),
        };
        let value = pylit::literal(raw).unwrap_or_else(|| Value::String(raw.to_string()));
        arguments.insert(a["key"].trim().to_string(), value);
    }
    Some(ToolCall {
        id: None,
        name: m["name"].to_string(),
        arguments: Value::Object(arguments),
    })
}

fn parse_one(text: &str) -> Option<Vec<ToolCall>> {
    if let (Some(start), Some(end)) = (text.find('['), text.rfind(']')) {
        if end > start {
            if let Some(calls) = pylit::call_list(&text[start..=end]) {
                return Some(
                    calls
                        .into_iter()
                        .map(|(name, args)| ToolCall {
                            id: None,
                            name,
                            arguments: Value::Object(args),
                        })
                        .collect(),
                );
            }
        }
    }
    loose(text).map(|c| vec![c])
}

pub fn parse(text: &str) -> Result<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for block in segments(text, START, END) {
        match parse_one(block) {
            Some(c) => calls.extend(c),
            None => bail!("no pythonic call in {block:?}"),
        }
    }
    Ok(calls)
}
