//! Hermes / Qwen 2.5 / Qwen 3 calls: each call a JSON object between
//! `<tool_call>` and `</tool_call>`, several calls one after another.

use anyhow::Result;

use super::{call_from_json, json_values, ToolCall};

pub(crate) const START: &str = "<tool_call>";
pub(crate) const END: &str = "</tool_call>";

/// The calls' JSON is read string-aware, so an end marker inside a string
/// argument (code that prints `</tool_call>`) does not end the call.
pub fn parse(text: &str) -> Result<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(START) {
        let body = &rest[at + START.len()..];
        let (values, after) = json_values(body);
        if values.is_empty() {
            if !body.contains(END) && !calls.is_empty() {
                // A last call cut short by the token limit after complete ones.
                break;
            }
            let inner = body.split(END).next().unwrap_or_default();
            anyhow::bail!("no JSON call inside <tool_call>: {inner:?}");
        }
        for v in &values {
            calls.push(call_from_json(v)?);
        }
        rest = after.strip_prefix(END).unwrap_or(after);
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn qwen_2_5_single_call() {
        // Qwen2.5-7B-Instruct, the weather example of its function-calling docs.
        let out = "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, USA\"}}\n</tool_call>";
        let calls = parse(out).unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_current_temperature");
        assert_eq!(
            calls[0].arguments,
            json!({"location": "San Francisco, CA, USA"})
        );
    }

    #[test]
    fn qwen3_parallel_calls_after_thinking() {
        // Qwen3-8B: two calls after its reasoning (the reasoning is split off first).
        let out = "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, USA\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_temperature_date\", \"arguments\": {\"location\": \"San Francisco, CA, USA\", \"date\": \"2024-10-01\", \"unit\": \"celsius\"}}\n</tool_call>";
        let calls = parse(out).unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].name, "get_temperature_date");
        assert_eq!(calls[1].arguments["date"], "2024-10-01");
    }

    #[test]
    fn hermes_arguments_as_string_and_truncated_end() {
        // NousResearch Hermes-2-Pro sometimes writes the arguments as a string.
        let out = "<tool_call>\n{\"arguments\": \"{\\\"symbol\\\": \\\"TSLA\\\"}\", \"name\": \"get_stock_fundamentals\"}\n";
        let calls = parse(out).unwrap();
        assert_eq!(calls[0].name, "get_stock_fundamentals");
        assert_eq!(calls[0].arguments, json!({"symbol": "TSLA"}));
        assert!(parse("<tool_call>\n{\"name\": \"f\", \"argum").is_err());
        let cut =
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"na";
        assert_eq!(parse(cut).unwrap().len(), 1);
    }

    #[test]
    fn end_marker_inside_a_string_argument() {
        let out = "<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print('</tool_call>')\"}}\n</tool_call>";
        let calls = parse(out).unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].arguments["code"], "print('</tool_call>')");
    }
}
