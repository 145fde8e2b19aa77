//! Mistral calls after `[TOOL_CALLS]`: a JSON list of `{"name", "arguments"}`
//! (v3 tokenizers), or `name[ARGS]{…}` repeated (v11 and later).

use anyhow::{bail, Result};
use serde_json::Value;

use super::{call_from_json, json_values, ToolCall};

pub(crate) const START: &str = "[TOOL_CALLS]";
pub(crate) const ARGS: &str = "[ARGS]";

/// One `name[ARGS]{…}` call at the start of `text`, and what follows it.
fn header_call(text: &str) -> Result<(ToolCall, &str)> {
    let Some(at) = text.find(ARGS) else {
        bail!("no [ARGS] after the call name in {text:?}");
    };
    let name = text[..at].trim();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_alphanumeric() || "_-.".contains(c))
    {
        bail!("bad function name {name:?}");
    }
    let (values, rest) = json_values(&text[at + ARGS.len()..]);
    let Some(arguments) = values.into_iter().next() else {
        bail!("the arguments of {name} are not complete JSON");
    };
    if !arguments.is_object() {
        bail!("the arguments of {name} must be an object");
    }
    let call = ToolCall {
        id: None,
        name: name.to_string(),
        arguments,
    };
    Ok((call, rest))
}

pub fn parse(text: &str) -> Result<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for part in text.split(START).skip(1) {
        let part = part.trim();
        if part.starts_with('[') || part.starts_with('{') {
            let (values, _) = json_values(part);
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
        } else {
            let mut rest = part;
            while !rest.trim().is_empty() {
                let (call, after) = header_call(rest)?;
                calls.push(call);
                rest = after;
            }
        }
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mistral_7b_v0_3_json_list() {
        // Mistral-7B-Instruct-v0.3 (the ids are the model's own 9-character ids).
        let out = "[TOOL_CALLS] [{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Paris, France\", \"format\": \"celsius\"}, \"id\": \"Q2w3E4r5T\"}]";
        let calls = parse(out).unwrap();
        assert_eq!(calls[0].name, "get_current_weather");
        assert_eq!(calls[0].id.as_deref(), Some("Q2w3E4r5T"));
        assert_eq!(calls[0].arguments["format"], "celsius");
    }

    #[test]
    fn mistral_small_3_2_args_headers() {
        // Mistral-Small-3.2 / Devstral: one marker per call, `name[ARGS]{...}`.
        let out = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{\"tz\": \"CET\"}";
        let calls = parse(out).unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, json!({"city": "Paris"}));
        assert_eq!(calls[1].name, "get_time");
        assert!(parse("[TOOL_CALLS]get_weather[ARGS]{\"city\": ").is_err());
    }
}
