//! Calls' arguments as the model writes them: for the formats whose
//! arguments are JSON text, each call's head (name, id) as soon as it is
//! complete, then its arguments re-written piece by piece in the compact
//! form `serde_json` gives the parsed value, so the pieces joined are the
//! arguments string of the whole answer. Other formats show their calls
//! when the answer ends.

use serde_json::{Deserializer, Value};

use super::{harmony, kimi_k2, mistral, ToolCall, ToolFormat};

/// A step of a call, as streams send it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum CallEvent {
    /// Call `index` begins (its id when the format carries one).
    Start {
        index: usize,
        id: Option<String>,
        name: String,
    },
    /// More of call `index`'s arguments.
    Arguments { index: usize, text: String },
}

/// The text of an answer from its first call on, read as it grows.
pub(crate) struct CallStream {
    format: ToolFormat,
    text: String,
    /// Where the search for the next call's head starts.
    pos: usize,
    /// The call whose arguments are being read, and how far.
    current: Option<(usize, Compact)>,
    scanned: usize,
    /// The arguments sent so far, per call.
    sent: Vec<String>,
    max_calls: usize,
}

struct Head {
    id: Option<String>,
    name: String,
    /// Where the arguments' `{` is.
    args_at: usize,
}

impl CallStream {
    pub fn new(format: ToolFormat, max_calls: usize) -> Self {
        Self {
            format,
            text: String::new(),
            pos: 0,
            current: None,
            scanned: 0,
            sent: Vec::new(),
            max_calls,
        }
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn push(&mut self, text: &str) -> Vec<CallEvent> {
        self.text.push_str(text);
        let mut out = Vec::new();
        loop {
            if let Some((index, compact)) = &mut self.current {
                let (piece, end) = compact.feed(&self.text[self.scanned..]);
                if !piece.is_empty() {
                    self.sent[*index].push_str(&piece);
                    out.push(CallEvent::Arguments {
                        index: *index,
                        text: piece,
                    });
                }
                match end {
                    Some(n) => {
                        self.pos = self.scanned + n;
                        self.scanned = self.pos;
                        self.current = None;
                    }
                    None => {
                        self.scanned = self.text.len();
                        return out;
                    }
                }
            }
            if self.sent.len() >= self.max_calls {
                return out;
            }
            let Some(head) = head(self.format, &self.text, self.pos) else {
                return out;
            };
            let index = self.sent.len();
            out.push(CallEvent::Start {
                index,
                id: head.id,
                name: head.name,
            });
            self.sent.push(String::new());
            self.current = Some((index, Compact::default()));
            self.scanned = head.args_at;
        }
    }

    /// The rest of every call once the whole text parsed into `calls`: the
    /// missing end of streamed arguments, and the calls not streamed whole.
    /// (Arguments that streamed text the parsed value does not start with,
    /// such as a repeated key, cannot be taken back and are left as sent.)
    pub fn finish(&mut self, calls: &[ToolCall]) -> Vec<CallEvent> {
        let mut out = Vec::new();
        for (index, call) in calls.iter().enumerate() {
            let full = call.arguments.to_string();
            match self.sent.get(index) {
                Some(sent) => {
                    if let Some(rest) = full.strip_prefix(sent.as_str()).filter(|r| !r.is_empty()) {
                        out.push(CallEvent::Arguments {
                            index,
                            text: rest.to_string(),
                        });
                    }
                }
                None => {
                    out.push(CallEvent::Start {
                        index,
                        id: call.id.clone(),
                        name: call.name.clone(),
                    });
                    out.push(CallEvent::Arguments { index, text: full });
                }
            }
        }
        out
    }
}

/// The next call head at or after `from` whose arguments have begun.
fn head(format: ToolFormat, text: &str, from: usize) -> Option<Head> {
    match format {
        ToolFormat::JsonTools => {
            let at = from + text[from..].find(super::json_tools::START)?;
            object_head(text, at)
        }
        ToolFormat::Llama3 | ToolFormat::Phi => object_head(text, from),
        ToolFormat::Mistral => {
            let first = text.find(mistral::START)?;
            let list = text[first + mistral::START.len()..]
                .trim_start()
                .starts_with(['[', '{']);
            if list {
                return object_head(text, from.max(first));
            }
            let at = from + text[from..].find(mistral::START)? + mistral::START.len();
            let args = at + text[at..].find(mistral::ARGS)?;
            let name = text[at..args].trim();
            let args_at = object_start(text, args + mistral::ARGS.len())?;
            Some(Head {
                id: None,
                name: name.to_string(),
                args_at,
            })
        }
        ToolFormat::Harmony => {
            let at = from + text[from..].find(harmony::RECIPIENT)? + harmony::RECIPIENT.len();
            let name_len = text[at..].find(|c: char| c.is_whitespace() || c == '<')?;
            let message = at + text[at..].find(harmony::MESSAGE)? + harmony::MESSAGE.len();
            Some(Head {
                id: None,
                name: text[at..at + name_len].to_string(),
                args_at: object_start(text, message)?,
            })
        }
        ToolFormat::KimiK2 => {
            let at = from + text[from..].find(kimi_k2::CALL)? + kimi_k2::CALL.len();
            let (id, name, len) = kimi_k2::head(&text[at..])?;
            Some(Head {
                id: Some(id),
                name,
                args_at: object_start(text, at + len)?,
            })
        }
        _ => None,
    }
}

/// The `{` after whitespace at `at`.
fn object_start(text: &str, at: usize) -> Option<usize> {
    let rest = &text[at..];
    let start = at + rest.len() - rest.trim_start().len();
    text[start..].starts_with('{').then_some(start)
}

/// One JSON value at `at`, and where it ends; `None` while it may still grow.
fn value_at(text: &str, at: usize) -> Option<(Value, usize)> {
    let rest = &text[at..];
    let skipped = rest.len() - rest.trim_start().len();
    let mut values = Deserializer::from_str(&rest[skipped..]).into_iter::<Value>();
    let v = values.next()?.ok()?;
    let end = at + skipped + values.byte_offset();
    (end < text.len()).then_some((v, end))
}

/// The head of the JSON call object at the first `{` (outside strings) at
/// or after `from`: its `name`, then `arguments` (or `parameters`) opening
/// an object. `None` while incomplete, or when the object is not one that
/// streams (arguments before the name, or as a string).
fn object_head(text: &str, from: usize) -> Option<Head> {
    let mut in_string = false;
    let mut escaped = false;
    let mut open = None;
    for (i, c) in text[from..].char_indices() {
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (true, false, '"') => in_string = false,
            (false, _, '"') => in_string = true,
            (false, _, '{') => {
                open = Some(from + i);
                break;
            }
            _ => {}
        }
    }
    let mut at = open? + 1;
    let mut name = None;
    loop {
        let (key, after) = value_at(text, at)?;
        let colon = after + text[after..].find(|c: char| !c.is_whitespace())?;
        text[colon..].starts_with(':').then_some(())?;
        let key = key.as_str()?.to_string();
        if key == "arguments" || key == "parameters" {
            return Some(Head {
                id: None,
                name: name?,
                args_at: object_start(text, colon + 1)?,
            });
        }
        let (value, after) = value_at(text, colon + 1)?;
        if key == "name" {
            name = Some(value.as_str()?.to_string());
        }
        let next = after + text[after..].find(|c: char| !c.is_whitespace())?;
        text[next..].starts_with(',').then_some(())?;
        at = next + 1;
    }
}

/// Re-writes streamed JSON in `serde_json`'s compact form: no whitespace
/// between tokens, strings with its escapes, numbers and literals as it
/// prints them.
#[derive(Default)]
struct Compact {
    depth: usize,
    string: Option<InString>,
    scalar: String,
}

#[derive(Default)]
struct InString {
    /// What followed a backslash, while the escape is incomplete.
    escape: Option<String>,
    /// A high surrogate waiting for its pair.
    high: Option<u32>,
}

/// A character as `serde_json` writes it inside a string.
fn push_escaped(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
        c => out.push(c),
    }
}

impl Compact {
    /// The compact form of `text`, and where the value ended in it if it did.
    fn feed(&mut self, text: &str) -> (String, Option<usize>) {
        let mut out = String::new();
        for (i, c) in text.char_indices() {
            if let Some(s) = &mut self.string {
                if let Some(escape) = &mut s.escape {
                    escape.push(c);
                    let decoded = if let Some(hex) = escape.strip_prefix('u') {
                        if hex.len() < 4 {
                            continue;
                        }
                        let code = u32::from_str_radix(hex, 16).unwrap_or(0xFFFD);
                        s.escape = None;
                        match (s.high.take(), code) {
                            (None, 0xD800..=0xDBFF) => {
                                s.high = Some(code);
                                continue;
                            }
                            (Some(hi), 0xDC00..=0xDFFF) => {
                                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (code - 0xDC00))
                            }
                            (_, code) => char::from_u32(code),
                        }
                    } else {
                        s.escape = None;
                        Some(match c {
                            'b' => '\u{8}',
                            'f' => '\u{c}',
                            'n' => '\n',
                            'r' => '\r',
                            't' => '\t',
                            other => other,
                        })
                    };
                    if let Some(d) = decoded {
                        push_escaped(&mut out, d);
                    }
                    continue;
                }
                match c {
                    '\\' => s.escape = Some(String::new()),
                    '"' => {
                        out.push('"');
                        self.string = None;
                    }
                    c => push_escaped(&mut out, c),
                }
                continue;
            }
            if !self.scalar.is_empty() {
                if c.is_ascii_alphanumeric() || "+-.".contains(c) {
                    self.scalar.push(c);
                    continue;
                }
                let token = std::mem::take(&mut self.scalar);
                match serde_json::from_str::<Value>(&token) {
                    Ok(v) => out.push_str(&v.to_string()),
                    Err(_) => out.push_str(&token),
                }
            }
            match c {
                '"' => {
                    out.push('"');
                    self.string = Some(InString::default());
                }
                '{' | '[' => {
                    self.depth += 1;
                    out.push(c);
                }
                '}' | ']' => {
                    self.depth = self.depth.saturating_sub(1);
                    out.push(c);
                    if self.depth == 0 {
                        return (out, Some(i + c.len_utf8()));
                    }
                }
                ',' | ':' => out.push(c),
                c if c.is_whitespace() => {}
                c => self.scalar.push(c),
            }
        }
        (out, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(format: ToolFormat, out: &str) -> (Vec<CallEvent>, Vec<ToolCall>) {
        let mut s = CallStream::new(format, usize::MAX);
        let mut events = Vec::new();
        for c in out.chars() {
            events.extend(s.push(&c.to_string()));
        }
        let calls = format.parse(s.text()).unwrap();
        events.extend(s.finish(&calls));
        (events, calls)
    }

    fn arguments(events: &[CallEvent], index: usize) -> (usize, String) {
        let pieces: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                CallEvent::Arguments { index: i, text } if *i == index => Some(text.as_str()),
                _ => None,
            })
            .collect();
        (pieces.len(), pieces.concat())
    }

    #[test]
    fn arguments_stream_in_pieces_that_join_to_the_parsed_value() {
        let out = "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"code\": \"print(\\\"</tool_call>\\\")\\n\\u00e9\", \"n\": 1.50, \"ok\": true, \"xs\": [1, 2e3]}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        let (events, calls) = streamed(ToolFormat::JsonTools, out);
        assert_eq!(calls.len(), 2);
        assert!(matches!(&events[0], CallEvent::Start { index: 0, name, .. } if name == "run"));
        let (n, joined) = arguments(&events, 0);
        assert!(n > 5, "{events:?}");
        assert_eq!(joined, calls[0].arguments.to_string());
        assert_eq!(arguments(&events, 1).1, "{}");
    }

    #[test]
    fn heads_of_the_other_json_formats() {
        for (format, out) in [
            (ToolFormat::Mistral, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]t[ARGS]{}"),
            (ToolFormat::Mistral, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"Q2w3E4r5T\"}, {\"name\": \"t\", \"arguments\": {}}]"),
            (ToolFormat::Llama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"t\", \"parameters\": {}}"),
            (ToolFormat::Phi, "<|tool_call|>[{\"type\": \"function\", \"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"t\", \"arguments\": {}}]<|/tool_call|>"),
            (ToolFormat::Harmony, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|><|start|>assistant<|channel|>commentary to=functions.t <|constrain|>json<|message|>{}<|call|>"),
            (ToolFormat::KimiK2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.t:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"),
        ] {
            let (events, calls) = streamed(format, out);
            let starts = events.iter().filter(|e| matches!(e, CallEvent::Start { .. })).count();
            assert_eq!(starts, 2, "{format:?}: {events:?}");
            let (n, joined) = arguments(&events, 0);
            assert!(n > 3, "{format:?}: {events:?}");
            assert_eq!(joined, "{\"city\":\"Paris\"}", "{format:?}");
            assert_eq!(joined, calls[0].arguments.to_string());
        }
    }

    #[test]
    fn formats_without_json_arguments_send_them_at_the_end() {
        let out = "<minimax:tool_call><invoke name=\"f\"><parameter name=\"a\">1</parameter></invoke></minimax:tool_call>";
        let (events, _) = streamed(ToolFormat::MinimaxM2, out);
        assert_eq!(events.len(), 2);
        assert_eq!(arguments(&events, 0), (1, "{\"a\":\"1\"}".to_string()));
    }
}
