//! Llama 3.1-3.3 JSON calls: `{"name": …, "parameters": {…}}`, either after
//! `<|python_tag|>` or as the whole answer; several separated by `;`.

use anyhow::{bail, Result};

use super::{call_from_json, json_values, ToolCall};

pub(crate) const START: &str = "<|python_tag|>";

/// A call written without the tag: the answer opens with a JSON object.
pub(crate) fn bare_start(text: &str) -> Option<usize> {
    let trimmed = text.trim_start();
    trimmed
        .starts_with('{')
        .then_some(text.len() - trimmed.len())
}

pub fn parse(text: &str) -> Result<Vec<ToolCall>> {
    let body = text.trim_start();
    let body = body.strip_prefix(START).unwrap_or(body);
    let (values, _) = json_values(body);
    if values.is_empty() {
        bail!("no JSON call in {text:?}");
    }
    values.iter().map(call_from_json).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn llama_3_1_json_call() {
        // Llama-3.1-8B-Instruct with JSON-based tool calling (its template's system prompt).
        let out = "{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": \"San Francisco, CA\", \"unit\": \"Fahrenheit\"}}";
        assert_eq!(bare_start(out), Some(0));
        let calls = parse(out).unwrap();
        assert_eq!(calls[0].name, "get_current_conditions");
        assert_eq!(calls[0].arguments["unit"], "Fahrenheit");
    }

    #[test]
    fn llama_3_2_python_tag_and_several_calls() {
        // Llama-3.2-3B-Instruct: the tag, then calls separated by `; `.
        let out = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}<|eom_id|>";
        let calls = parse(out).unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].arguments, json!({"city": "Rome"}));
        assert_eq!(bare_start("The answer is 4."), None);
    }
}
