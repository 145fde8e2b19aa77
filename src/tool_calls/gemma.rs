//! FunctionGemma calls: `<start_function_call>call:NAME{key:value,…}<end_function_call>`
//! where string values sit between `<escape>` marks and others are JSON.

use anyhow::{bail, Result};
use serde_json::{Map, Value};

use super::ToolCall;

pub(crate) const START: &str = "<start_function_call>";
const END: &str = "<end_function_call>";
const ESCAPE: &str = "<escape>";

fn arguments(mut s: &str) -> Result<Map<String, Value>> {
    let mut out = Map::new();
    while !s.is_empty() {
        let Some(colon) = s.find(':') else {
            bail!("an argument without a value in {s:?}");
        };
        let key = s[..colon].trim().to_string();
        s = &s[colon + 1..];
        if let Some(body) = s.strip_prefix(ESCAPE) {
            let Some(end) = body.find(ESCAPE) else {
                bail!("an unterminated <escape> string for {key}");
            };
            out.insert(key, Value::String(body[..end].to_string()));
            s = body[end + ESCAPE.len()..].trim_start_matches(',');
        } else {
            let end = s.find(',').unwrap_or(s.len());
            let raw = s[..end].trim();
            let value = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.into()));
            out.insert(key, value);
            s = s.get(end + 1..).unwrap_or("");
        }
    }
    Ok(out)
}

pub fn parse(text: &str) -> Result<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for part in text.split(START).skip(1) {
        let inner = part.split(END).next().unwrap_or_default().trim();
        let Some(call) = inner.strip_prefix("call:") else {
            bail!("a FunctionGemma call must start with `call:`, got {inner:?}");
        };
        let (Some(open), Some(close)) = (call.find('{'), call.rfind('}')) else {
            bail!("no {{arguments}} in {call:?}");
        };
        calls.push(ToolCall {
            id: None,
            name: call[..open].trim().to_string(),
            arguments: Value::Object(arguments(&call[open + 1..close])?),
        });
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn function_gemma_call() {
        // FunctionGemma-270M, its model card's weather example.
        let out = "<start_function_call>call:get_current_temperature{location:<escape>London<escape>,days:3}<end_function_call>";
        let calls = parse(out).unwrap();
        assert_eq!(calls[0].name, "get_current_temperature");
        assert_eq!(calls[0].arguments, json!({"location": "London", "days": 3}));
    }
}
