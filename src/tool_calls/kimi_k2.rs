//! Kimi K2 calls: a section of `<|tool_call_begin|>functions.NAME:IDX
//! <|tool_call_argument_begin|>{…}<|tool_call_end|>` between
//! `<|tool_calls_section_begin|>` and `<|tool_calls_section_end|>`. The
//! `functions.NAME:IDX` part is the call's id.

use std::sync::LazyLock;

use anyhow::{bail, Result};
use regex::Regex;

use super::values::deserialize;
use super::{segments, ToolCall};

pub(crate) const START: &str = "<|tool_calls_section_begin|>";
const END: &str = "<|tool_calls_section_end|>";
#[cfg(feature = "server")]
pub(crate) const CALL: &str = "<|tool_call_begin|>";
pub(crate) const ARGUMENTS: &str = "<|tool_call_argument_begin|>";

static HEAD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?s)^\s*((?:functions\.)?(.+?):\d+)\s*<\|tool_call_argument_begin\|>")
        .expect("regex")
});
static CALLS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?s)<\|tool_call_begin\|>(.*?)<\|tool_call_end\|>").expect("regex")
});

/// The id and name of a call whose head (`functions.NAME:IDX` and the
/// arguments marker) is complete at the start of `text`, and where its
/// arguments begin.
pub(crate) fn head(text: &str) -> Option<(String, String, usize)> {
    let m = HEAD.captures(text)?;
    Some((m[1].to_string(), m[2].to_string(), m.get(0)?.end()))
}

fn parse_one(text: &str) -> Result<ToolCall> {
    let Some((id, name, _)) = head(text) else {
        bail!("no Kimi K2 call head in {text:?}");
    };
    let at = text.find(ARGUMENTS).expect("the head ends with it") + ARGUMENTS.len();
    let arguments = deserialize(text[at..].trim_start());
    if !arguments.is_object() {
        bail!("the arguments of {name} are not an object");
    }
    Ok(ToolCall {
        id: Some(id),
        name,
        arguments,
    })
}

pub fn parse(text: &str) -> Result<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for section in segments(text, START, END) {
        let bodies: Vec<&str> = CALLS
            .captures_iter(section)
            .map(|m| m.get(1).expect("group").as_str())
            .collect();
        if bodies.is_empty() {
            calls.push(parse_one(section)?);
        }
        for body in bodies {
            calls.push(parse_one(body)?);
        }
    }
    Ok(calls)
}
