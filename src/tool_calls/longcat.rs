//! LongCat calls: `<longcat_tool_call>NAME<longcat_arg_key>k</longcat_arg_key>
//! <longcat_arg_value>v</longcat_arg_value>…</longcat_tool_call>`, or a JSON
//! call object between the markers.

use std::sync::LazyLock;

use anyhow::{bail, Result};
use regex::Regex;
use serde_json::{Map, Value};

use super::values::{deserialize, is_string};
use super::{call_from_json, segments, Function, ToolCall};

pub(crate) const START: &str = "<longcat_tool_call>";
const END: &str = "</longcat_tool_call>";

static ARG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?s)<longcat_arg_key>(.*?)</longcat_arg_key>(?:\\n|\s)*<longcat_arg_value>(.*?)</longcat_arg_value>",
    )
    .expect("regex")
});

fn parse_one(text: &str, functions: &[Function]) -> Result<ToolCall> {
    let text = text.trim();
    if text.starts_with('{') {
        if let Ok(v) = serde_json::from_str::<Value>(text) {
            return call_from_json(&v);
        }
    }
    let Some(at) = text.find("<longcat_arg_key>") else {
        bail!("no <longcat_arg_key> in the LongCat call {text:?}");
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
    Ok(ToolCall {
        id: None,
        name: name.to_string(),
        arguments: Value::Object(arguments),
    })
}

pub fn parse(text: &str, functions: &[Function]) -> Result<Vec<ToolCall>> {
    segments(text, START, END)
        .into_iter()
        .map(|s| parse_one(s, functions))
        .collect()
}
