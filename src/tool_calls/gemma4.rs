//! Gemma 4 calls: `<|tool_call>call:NAME{key:value,…}<tool_call|>`, keys
//! bare, strings between `<|"|>` marks, several calls in one block.

use anyhow::{bail, Result};
use serde_json::Value;

use super::{segments, ToolCall};

pub(crate) const START: &str = "<|tool_call>";
const END: &str = "<tool_call|>";
const QUOTE: &str = "<|\"|>";

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The length of the balanced `{…}` at the start of `s` (strings skipped).
fn braces(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        if let Some(body) = rest.strip_prefix(QUOTE) {
            i += QUOTE.len() + body.find(QUOTE)? + QUOTE.len();
            continue;
        }
        let c = rest.chars().next()?;
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += c.len_utf8();
    }
    None
}

/// Gemma's argument text as JSON: strings quoted, bare keys quoted.
fn to_json(args: &str) -> String {
    let mut out = String::new();
    let mut prev = '\0';
    let mut rest = args;
    while let Some(c) = rest.chars().next() {
        if let Some(body) = rest.strip_prefix(QUOTE) {
            if let Some(end) = body.find(QUOTE) {
                out.push_str(&serde_json::to_string(&body[..end]).expect("string"));
                rest = &body[end + QUOTE.len()..];
                prev = '\0';
                continue;
            }
        }
        if prev == '{' || prev == ',' {
            let word = rest.find(|c: char| !is_word(c)).unwrap_or(rest.len());
            if word > 0 && rest[word..].starts_with(':') {
                out.push_str(&format!("\"{}\":", &rest[..word]));
                rest = &rest[word + 1..];
                prev = ':';
                continue;
            }
        }
        out.push(c);
        prev = c;
        rest = &rest[c.len_utf8()..];
    }
    out
}

pub fn parse(text: &str) -> Result<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for block in segments(text, START, END) {
        let mut at = 0;
        while let Some(found) = block[at..].find("call:") {
            let name_at = at + found + "call:".len();
            at = name_at;
            let rest = &block[name_at..];
            let name_len = rest
                .find(|c: char| !(is_word(c) || c == '-'))
                .unwrap_or(rest.len());
            if name_len == 0 || !rest[name_len..].starts_with('{') {
                continue;
            }
            let Some(len) = braces(&rest[name_len..]) else {
                continue;
            };
            let args = &rest[name_len..name_len + len];
            let arguments: Value = serde_json::from_str(&to_json(args))
                .map_err(|e| anyhow::anyhow!("Gemma 4 arguments are not valid: {e}"))?;
            calls.push(ToolCall {
                id: None,
                name: rest[..name_len].to_string(),
                arguments,
            });
            at = name_at + name_len + len;
        }
    }
    if calls.is_empty() {
        bail!("no Gemma 4 call in {text:?}");
    }
    Ok(calls)
}
