//! Phi-4-mini calls: a JSON list (or one object) between `<|tool_call|>`
//! and `<|/tool_call|>`.

use anyhow::Result;
use serde_json::Value;

use super::{call_from_json, json_values, ToolCall};

pub(crate) const START: &str = "<|tool_call|>";
const END: &str = "<|/tool_call|>";

pub fn parse(text: &str) -> Result<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(START) {
        let (values, after) = json_values(&rest[at + START.len()..]);
        rest = after.strip_prefix(END).unwrap_or(after);
        if values.is_empty() {
            break;
        }
        for v in values {
            match v {
                Value::Array(items) => {
                    for item in &items {
                        calls.push(call_from_json(item)?);
                    }
                }
                other => calls.push(call_from_json(&other)?),
            }
        }
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phi_4_mini_list() {
        // Phi-4-mini-instruct, its model card's tool example.
        let out = "<|tool_call|>[{\"type\": \"function\", \"name\": \"get_weather_updates\", \"arguments\": {\"location\": \"London\"}}]<|/tool_call|>";
        let calls = parse(out).unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather_updates");
        assert_eq!(calls[0].arguments["location"], "London");
    }
}
