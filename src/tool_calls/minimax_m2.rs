//! MiniMax-M2 calls: `<minimax:tool_call><invoke name="NAME"><parameter
//! name="k">v</parameter>…</invoke>…</minimax:tool_call>`; values take the
//! type the tool's schema declares.

use std::sync::LazyLock;

use anyhow::Result;
use regex::Regex;
use serde_json::{Map, Value};

use super::values::{convert_with_types, properties, schema_types, unquote};
use super::{segments, Function, ToolCall};

pub(crate) const START: &str = "<minimax:tool_call>";
const END: &str = "</minimax:tool_call>";

static INVOKE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)<invoke name=(.*?)</invoke>").expect("regex"));
static PARAMETER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)<parameter name=(.*?)</parameter>").expect("regex"));

pub fn parse(text: &str, functions: &[Function]) -> Result<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for block in segments(text, START, END) {
        for invoke in INVOKE.captures_iter(block) {
            let body = &invoke[1];
            let head = body.find('>').unwrap_or(body.len());
            let name = unquote(&body[..head]).to_string();
            let schema = properties(functions, &name);
            let mut arguments = Map::new();
            for p in PARAMETER.captures_iter(body) {
                let Some((key, value)) = p[1].split_once('>').filter(|(k, _)| !k.is_empty()) else {
                    continue;
                };
                let key = unquote(key).to_string();
                let value = value.trim();
                let types = match schema.and_then(|s| s.get(&key)) {
                    Some(s) => schema_types(Some(s)),
                    None => vec!["string".to_string()],
                };
                arguments.insert(key, convert_with_types(value, &types));
            }
            calls.push(ToolCall {
                id: None,
                name,
                arguments: Value::Object(arguments),
            });
        }
    }
    if calls.is_empty() {
        anyhow::bail!("no MiniMax call in {text:?}");
    }
    Ok(calls)
}
