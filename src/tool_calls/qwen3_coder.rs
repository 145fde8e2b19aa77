//! Qwen3-Coder calls: `<tool_call>\n<function=NAME>\n<parameter=k>\nv\n
//! </parameter>…</function>\n</tool_call>`; values take the type the
//! tool's schema declares.

use std::sync::LazyLock;

use anyhow::{bail, Result};
use regex::Regex;
use serde_json::{Map, Value};

use super::values::{convert_qwen, properties};
use super::{segments, Function, ToolCall};

pub(crate) const START: &str = "<tool_call>";
const END: &str = "</tool_call>";
const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";

static PARAMETER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)<parameter=(.*?)</parameter>").expect("regex"));
static NAME: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\s*([^\s<>]+)>?").expect("regex"));

fn strip_newline(v: &str) -> &str {
    let v = v.strip_prefix('\n').unwrap_or(v);
    v.strip_suffix('\n').unwrap_or(v)
}

fn parse_one(text: &str, functions: &[Function]) -> Result<ToolCall> {
    // The function must close the block (a trailing newline aside).
    let body = text.strip_suffix('\n').unwrap_or(text);
    let (Some(at), true) = (body.find(FUNCTION), body.ends_with(FUNCTION_END)) else {
        bail!("no <function=…></function> in {text:?}");
    };
    let Some(inner) = body.get(at + FUNCTION.len()..body.len() - FUNCTION_END.len()) else {
        bail!("no <function=…></function> in {text:?}");
    };
    let Some(head) = NAME.captures(inner) else {
        bail!("no function name in {text:?}");
    };
    let name = head[1].to_string();
    let schema = properties(functions, &name);
    let mut arguments = Map::new();
    for p in PARAMETER.captures_iter(&inner[head.get(0).expect("match").end()..]) {
        let Some(ph) = NAME.captures(&p[1]) else {
            continue;
        };
        let key = ph[1].to_string();
        let value = strip_newline(&p[1][ph.get(0).expect("match").end()..]);
        let value = convert_qwen(value, schema.and_then(|s| s.get(&key)))?;
        arguments.insert(key, value);
    }
    Ok(ToolCall {
        id: None,
        name,
        arguments: Value::Object(arguments),
    })
}

pub fn parse(text: &str, functions: &[Function]) -> Result<Vec<ToolCall>> {
    segments(text, START, END)
        .into_iter()
        .map(|s| parse_one(s, functions))
        .collect()
}
