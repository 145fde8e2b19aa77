//! GPT-OSS harmony calls: a message on the `commentary` channel addressed
//! `to=functions.NAME`, its JSON arguments ending at `<|call|>`.

use anyhow::{bail, Result};

use super::{json_values, ToolCall};

pub(crate) const START: &str = "<|channel|>commentary to=functions.";
pub(crate) const RECIPIENT: &str = "to=functions.";
pub(crate) const MESSAGE: &str = "<|message|>";

/// The header of the first message addressed to a function, which may also
/// put the recipient before the channel (`<|start|>assistant to=functions.f<|channel|>…`).
pub(crate) fn find_start(text: &str) -> Option<usize> {
    let at = text.find(RECIPIENT)?;
    let head = &text[..at];
    [head.rfind("<|start|>"), head.rfind("<|channel|>")]
        .into_iter()
        .flatten()
        .min_by_key(|&i| at - i)
        .or(Some(at))
}

pub fn parse(text: &str) -> Result<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for part in text.split(RECIPIENT).skip(1) {
        let name_end = part
            .find(|c: char| c.is_whitespace() || c == '<')
            .unwrap_or(part.len());
        let name = &part[..name_end];
        let Some(msg) = part.find(MESSAGE) else {
            bail!("the call to {name} has no <|message|>");
        };
        let (values, _) = json_values(&part[msg + MESSAGE.len()..]);
        let Some(arguments) = values.into_iter().next().filter(|v| v.is_object()) else {
            bail!("the arguments of {name} are not a complete JSON object");
        };
        calls.push(ToolCall {
            id: None,
            name: name.to_string(),
            arguments,
        });
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn gpt_oss_call_after_analysis() {
        // gpt-oss-20b: its analysis, then the call on the commentary channel.
        let out = "<|channel|>analysis<|message|>User asks weather in Tokyo. Use get_weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"Tokyo\"}<|call|>";
        let at = find_start(out).unwrap();
        assert!(out[at..].starts_with("<|channel|>commentary to=functions.get_weather"));
        let calls = parse(&out[at..]).unwrap();
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, json!({"location": "Tokyo"}));
    }

    #[test]
    fn recipient_in_the_header() {
        let out = "<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{\"q\": \"mlx\"}<|call|>";
        assert_eq!(parse(out).unwrap()[0].name, "lookup");
    }
}
