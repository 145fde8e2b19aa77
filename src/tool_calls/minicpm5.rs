//! MiniCPM5 calls: `<function name="NAME"><param name="k">v</param>…
//! </function>` with no outer wrapper; values holding `<`, `&` or newlines
//! sit in a CDATA block. Values take the type the schema declares.

use std::sync::LazyLock;

use anyhow::{bail, Result};
use regex::Regex;
use serde_json::{Map, Value};

use super::values::{convert_with_types, properties, schema_types, unquote};
use super::{segments, Function, ToolCall};

pub(crate) const START: &str = "<function name=";
const END: &str = "</function>";

static FUNCTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?s)(?:<function\s+)?(?:name\s*=\s*)?(?P<name>"[^"]*"|'[^']*'|[^\s"'<>]+)\s*>(?P<body>.*?)(?:</function>|$)"#,
    )
    .expect("regex")
});
static PARAM: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?s)<param\s+name\s*=\s*(?P<name>"[^"]*"|'[^']*'|[^\s"'<>]+)\s*>(?P<value>.*?)</param>"#,
    )
    .expect("regex")
});
static CDATA: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)^\s*<!\[CDATA\[(.*?)\]\]>\s*$").expect("regex"));

pub fn parse(text: &str, functions: &[Function]) -> Result<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for payload in segments(text, START, END) {
        for f in FUNCTION.captures_iter(payload) {
            let name = unquote(&f["name"]).to_string();
            let schema = properties(functions, &name);
            let mut arguments = Map::new();
            for p in PARAM.captures_iter(&f["body"]) {
                let key = unquote(&p["name"]).to_string();
                let raw = &p["value"];
                let value = match CDATA.captures(raw) {
                    Some(c) => c[1].to_string(),
                    None => raw.trim().to_string(),
                };
                let types = match schema.and_then(|s| s.get(&key)) {
                    Some(s) => schema_types(Some(s)),
                    None => vec!["string".to_string()],
                };
                arguments.insert(key, convert_with_types(&value, &types));
            }
            calls.push(ToolCall {
                id: None,
                name,
                arguments: Value::Object(arguments),
            });
        }
    }
    if calls.is_empty() {
        bail!("no MiniCPM5 call in {text:?}");
    }
    Ok(calls)
}
