//! Hugging Face chat templates rendered with minijinja as transformers
//! renders them with Jinja2: its environment (trimmed blocks, loop controls,
//! `raise_exception`, `strftime_now`, a `tojson` that is Python's
//! `json.dumps`), Python's string methods and printing (`True`, `None`,
//! `{'a': 1}`). tests/chat_templates.rs holds real templates to that.

use std::collections::HashSet;

use anyhow::{anyhow, bail, Result};

use minijinja::value::{from_args, Kwargs, Rest, ValueKind};
use minijinja::{context, escape_formatter, Environment, Error, ErrorKind, Output, State, Value};
use serde::{Deserialize, Serialize};

/// One chat message. `content` is plain text; OpenAI content-part arrays are
/// flattened to their text parts on the way in. An assistant turn may carry
/// `tool_calls` (OpenAI's objects; their `arguments` are given to templates
/// as JSON objects, as mlx-lm does) and a tool turn its `tool_call_id`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Message {
    /// `role`: `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// `content`, as text.
    #[serde(deserialize_with = "content_text", default)]
    pub content: String,
    /// An assistant turn's `tool_calls`, OpenAI's objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool turn's `tool_call_id`: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// `name`: the speaker's name, or the function a tool turn answers for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An earlier turn's reasoning, for templates that render it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    /// A message of `role` with text `content` and nothing else.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }

    /// The message as templates see it: call arguments given as JSON strings
    /// (OpenAI's spelling) become objects, and the reasoning is also given as
    /// `thinking`, as transformers gives it.
    fn for_template(&self) -> serde_json::Value {
        let mut m = self.clone();
        for call in m.tool_calls.iter_mut().flatten() {
            let f = match call.get_mut("function") {
                Some(f) => f,
                None => call,
            };
            if let Some(serde_json::Value::String(s)) = f.get("arguments") {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(s) {
                    f["arguments"] = v;
                }
            }
        }
        let fields = serde_json::to_value(&m).expect("a message serializes");
        let serde_json::Value::Object(fields) = fields else {
            unreachable!("a message serializes to an object")
        };
        let mut out = serde_json::Map::new();
        if let Some(r) = &m.reasoning_content {
            out.insert("thinking".into(), r.clone().into());
        }
        out.extend(fields);
        serde_json::Value::Object(out)
    }
}

fn content_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    match v {
        serde_json::Value::Null => Ok(String::new()),
        serde_json::Value::String(s) => Ok(s),
        serde_json::Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match p.get("type").and_then(|t| t.as_str()) {
                    Some("text") | None => {
                        let t = p.get("text").and_then(|t| t.as_str()).ok_or_else(|| {
                            serde::de::Error::custom("content part without a text field")
                        })?;
                        out.push_str(t);
                    }
                    Some(other) => {
                        return Err(serde::de::Error::custom(format!(
                            "unsupported content part type {other:?}"
                        )))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(serde::de::Error::custom(
            "content must be a string or an array of parts",
        )),
    }
}

pub(crate) const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];

/// Checks roles and emptiness; returns a message fit for a 400 answer.
pub(crate) fn validate_messages(messages: &[Message]) -> Result<()> {
    if messages.is_empty() {
        bail!("messages must not be empty");
    }
    for (i, m) in messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            bail!(
                "messages[{i}].role {:?} is not one of {}",
                m.role,
                ROLES.join(", ")
            );
        }
    }
    Ok(())
}

/// Instructions one rendering may run: real templates need a few dozen per
/// message, so this allows conversations far beyond any context length.
const TEMPLATE_FUEL: u64 = 20_000_000;

/// A model's Hugging Face chat template, compiled, with its `bos_token` and `eos_token`.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// The instant `strftime_now` and `datetime` read; the clock when unset.
    now: Option<i64>,
    /// Variables the template reads without setting them.
    reads: HashSet<String>,
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

/// Python's `repr` of a float: the shortest round-trip digits, written in
/// exponent form below 1e-4 and from 1e16 on.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} writes an exponent");
    let exp: i32 = exp.parse().expect("{:e} writes an integer exponent");
    if (-4..16).contains(&exp) {
        let plain = format!("{f}");
        if plain.contains('.') {
            plain
        } else {
            format!("{plain}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// `json.dumps`'s options, as transformers' `tojson` filter passes them.
struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonStyle {
    fn from_args(args: &[Value]) -> Result<Self, Error> {
        let (positional, kwargs) = from_args::<(&[Value], Kwargs)>(args)?;
        let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
        if positional.len() > names.len() {
            return Err(invalid("tojson takes at most 4 arguments"));
        }
        let mut given: Vec<Option<Value>> = vec![None; names.len()];
        for (slot, v) in given.iter_mut().zip(positional) {
            *slot = Some(v.clone());
        }
        for (i, name) in names.iter().enumerate() {
            if kwargs.has(name) {
                given[i] = Some(kwargs.get::<Value>(name)?);
            }
        }
        kwargs.assert_all_used()?;
        let set = |i: usize| {
            given[i]
                .clone()
                .filter(|v| !v.is_none() && !v.is_undefined())
        };
        let indent = match set(1) {
            None => None,
            Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_string()),
            Some(v) => Some(
                " ".repeat(
                    v.as_i64()
                        .ok_or_else(|| {
                            invalid(format!(
                                "tojson: indent must be an integer or a string, not {v}"
                            ))
                        })?
                        .max(0) as usize,
                ),
            ),
        };
        let (item_sep, key_sep) = match set(2) {
            Some(v) => {
                let parts: Vec<Value> = v.try_iter()?.collect();
                match parts.as_slice() {
                    [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                        (a.to_string(), b.to_string())
                    }
                    _ => return Err(invalid("tojson: separators must be two strings")),
                }
            }
            None if indent.is_some() => (",".into(), ": ".into()),
            None => (", ".into(), ": ".into()),
        };
        Ok(Self {
            ensure_ascii: set(0).is_some_and(|v| v.is_true()),
            indent,
            item_sep,
            key_sep,
            sort_keys: set(3).is_some_and(|v| v.is_true()),
        })
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }

    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn key(&self, k: &Value) -> Result<String, Error> {
        Ok(match k.kind() {
            ValueKind::String => k.as_str().unwrap_or("").to_string(),
            ValueKind::Number if k.is_integer() => k.to_string(),
            ValueKind::Number => py_float(f64::try_from(k.clone())?),
            ValueKind::Bool => if k.is_true() { "true" } else { "false" }.into(),
            ValueKind::None => "null".into(),
            _ => {
                return Err(invalid(format!(
                    "tojson: keys must be str, int, float, bool or None, not {k}"
                )))
            }
        })
    }

    fn write(&self, v: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
            ValueKind::Number => out.push_str(&py_float(f64::try_from(v.clone())?)),
            ValueKind::String => self.string(v.as_str().unwrap_or(""), out),
            ValueKind::Map => {
                let mut entries = Vec::new();
                for k in v.try_iter()? {
                    let item = v.get_item(&k)?;
                    entries.push((self.key(&k)?, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container('{', '}', entries.len(), depth, out, |i, out| {
                    let (k, item) = &entries[i];
                    self.string(k, out);
                    out.push_str(&self.key_sep);
                    self.write(item, depth + 1, out)
                })?;
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container('[', ']', items.len(), depth, out, |i, out| {
                    self.write(&items[i], depth + 1, out)
                })?;
            }
            _ => {
                return Err(invalid(format!(
                    "tojson: a value of type {} is not JSON serializable",
                    v.kind()
                )))
            }
        }
        Ok(())
    }

    fn container(
        &self,
        open: char,
        close: char,
        len: usize,
        depth: usize,
        out: &mut String,
        mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if len > 0 {
            for i in 0..len {
                if i > 0 {
                    out.push_str(&self.item_sep);
                }
                self.newline(depth + 1, out);
                item(i, out)?;
            }
            self.newline(depth, out);
        }
        out.push(close);
        Ok(())
    }
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, arguments by position or keyword. No
/// HTML escaping, unlike minijinja's own filter.
fn py_tojson(value: &Value, args: Rest<Value>) -> Result<Value, Error> {
    let style = JsonStyle::from_args(&args)?;
    let mut out = String::new();
    style.write(value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// Python's `repr` of a string: single quotes unless the text holds one and
/// no double quote.
fn py_repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str()` of a value (`repr` inside containers), which is what
/// Jinja2 prints: `True`, `None`, `{'a': [1, 2.0]}`.
fn py_str(v: &Value, nested: bool, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined if !nested => {}
        ValueKind::None | ValueKind::Undefined => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number if !v.is_integer() => out.push_str(&py_float(f64::try_from(v.clone())?)),
        ValueKind::String if nested => py_repr_str(v.as_str().unwrap_or(""), out),
        ValueKind::Map => {
            out.push('{');
            for (i, k) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_str(&k, true, out)?;
                out.push_str(": ");
                py_str(&v.get_item(&k)?, true, out)?;
            }
            out.push('}');
        }
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_str(&item, true, out)?;
            }
            out.push(']');
        }
        _ => out.push_str(&v.to_string()),
    }
    Ok(())
}

fn py_string_filter(v: &Value) -> Result<Value, Error> {
    if v.kind() == ValueKind::String {
        return Ok(v.clone());
    }
    let mut out = String::new();
    py_str(v, false, &mut out)?;
    Ok(Value::from(out))
}

fn py_formatter(out: &mut Output, state: &State, v: &Value) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Map | ValueKind::Seq | ValueKind::Number => {
            let mut text = String::new();
            py_str(v, false, &mut text)?;
            out.write_str(&text).map_err(Error::from)
        }
        _ => escape_formatter(out, state, v),
    }
}

/// Jinja2's `iterable` test: `None`, numbers and booleans are not (minijinja
/// iterates `none` as empty), while an undefined value is.
fn py_is_iterable(v: &Value) -> bool {
    matches!(
        v.kind(),
        ValueKind::Undefined
            | ValueKind::String
            | ValueKind::Bytes
            | ValueKind::Seq
            | ValueKind::Map
            | ValueKind::Iterable
    )
}

/// Jinja2's `sequence` test: whatever has a length and items.
fn py_is_sequence(v: &Value) -> bool {
    matches!(
        v.kind(),
        ValueKind::Undefined
            | ValueKind::String
            | ValueKind::Bytes
            | ValueKind::Seq
            | ValueKind::Map
    )
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// Python's `strftime` at a UTC instant, for the directives templates use;
/// an unknown one is an error that names it.
fn strftime(secs: i64, format: &str) -> Result<String, Error> {
    let days = secs.div_euclid(86_400);
    let of_day = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hour, minute, second) = (of_day / 3600, of_day / 60 % 60, of_day % 60);
    let weekday = WEEKDAYS[(days + 4).rem_euclid(7) as usize];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let directive = chars.next().unwrap_or('%');
        let text = match directive {
            'Y' => format!("{y:04}"),
            'y' => format!("{:02}", y.rem_euclid(100)),
            'm' => format!("{m:02}"),
            'd' => format!("{d:02}"),
            'B' => month.to_string(),
            'b' | 'h' => month[..3].to_string(),
            'A' => weekday.to_string(),
            'a' => weekday[..3].to_string(),
            'H' => format!("{hour:02}"),
            'I' => format!("{:02}", (hour + 11) % 12 + 1),
            'p' => if hour < 12 { "AM" } else { "PM" }.to_string(),
            'M' => format!("{minute:02}"),
            'S' => format!("{second:02}"),
            'j' => format!("{:03}", days - days_from_civil(y, 1, 1) + 1),
            '%' => "%".to_string(),
            other => {
                return Err(invalid(format!(
                    "strftime_now: unsupported directive %{other}"
                )))
            }
        };
        out.push_str(&text);
    }
    Ok(out)
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + (153 * m + 2) / 5 + d - 1;
    era * 146_097 + doe - 719_468
}

/// The conversation with a leading system message folded into the first
/// user turn (`system + "\n\n" + user`), for templates that refuse the role.
fn merge_system(messages: &[Message]) -> Option<Vec<Message>> {
    let (first, rest) = messages.split_first()?;
    if first.role != "system" {
        return None;
    }
    let mut out = rest.to_vec();
    match out.first_mut() {
        Some(user) if user.role == "user" => {
            user.content = format!("{}\n\n{}", first.content, user.content);
        }
        _ => out.insert(0, Message::new("user", &first.content)),
    }
    Some(out)
}

impl ChatTemplate {
    /// Compiles template `source`; `bos_token` and `eos_token` are the variables
    /// templates read.
    pub fn new(
        source: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self> {
        let mut env = Environment::new();
        // Templates come with the model: bound their work, so a template that
        // loops for hours (nested `range` loops) is an error, not a hang.
        env.set_fuel(Some(TEMPLATE_FUEL));
        // transformers' environment.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(py_formatter);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", py_tojson);
        env.add_filter("string", py_string_filter);
        env.add_test("iterable", py_is_iterable);
        env.add_test("sequence", py_is_sequence);
        env.add_template_owned("chat", source.clone())
            .map_err(|e| anyhow!("invalid chat template: {e}"))?;
        let reads = env.get_template("chat")?.undeclared_variables(false);
        let mut template = Self {
            env,
            source,
            bos_token,
            eos_token,
            now: None,
            reads,
        };
        template.set_clock();
        Ok(template)
    }

    /// Renders `strftime_now` and `datetime` at `unix_secs` (UTC) instead of
    /// the clock, so that a prompt can be reproduced.
    pub fn with_now(mut self, unix_secs: i64) -> Self {
        self.now = Some(unix_secs);
        self.set_clock();
        self
    }

    fn set_clock(&mut self) {
        let now = self.now;
        self.env
            .add_function("strftime_now", move |format: String| {
                strftime(now.unwrap_or_else(unix_now), &format)
            });
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where
    /// the assistant's reply begins.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, None, &Default::default())
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// [`render`](Self::render) with OpenAI `tools` and extra variables
    /// (`chat_template_kwargs` such as `enable_thinking`). A template that
    /// refuses a leading system message gets it merged into the first user
    /// turn.
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Option<&[serde_json::Value]>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let first = self.render_once(messages, add_generation_prompt, tools, kwargs);
        match (first, merge_system(messages)) {
            (Err(e), Some(merged)) if e.kind() != ErrorKind::OutOfFuel => self
                .render_once(&merged, add_generation_prompt, tools, kwargs)
                .map_err(|_| e),
            (result, _) => result,
        }
        .map_err(|e| anyhow!("chat template failed: {e:#}"))
    }

    fn render_once(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Option<&[serde_json::Value]>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, Error> {
        let mut vars = serde_json::Map::new();
        for (name, token) in [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
        ] {
            vars.insert(name.into(), token.clone().unwrap_or_default().into());
        }
        // firefunction-v2 reads the tools as `functions` and the time as
        // `datetime`, given as llama.cpp gives them.
        if self.reads.contains("functions") {
            let text = match tools {
                Some(t) if !t.is_empty() => {
                    let style = JsonStyle {
                        ensure_ascii: false,
                        indent: Some("  ".into()),
                        item_sep: ",".into(),
                        key_sep: ": ".into(),
                        sort_keys: false,
                    };
                    let mut out = String::new();
                    style.write(&Value::from_serialize(t), 0, &mut out)?;
                    out
                }
                _ => String::new(),
            };
            vars.insert("functions".into(), text.into());
        }
        if self.reads.contains("datetime") {
            let now = self.now.unwrap_or_else(unix_now);
            vars.insert(
                "datetime".into(),
                strftime(now, "%b %d %Y %H:%M:%S GMT")?.into(),
            );
        }
        vars.extend(kwargs.clone());
        let messages: Vec<serde_json::Value> = messages.iter().map(Message::for_template).collect();
        self.env.get_template("chat")?.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            tools => tools,
            documents => (),
            ..Value::from_serialize(&vars)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render_src(src: &str, x: serde_json::Value) -> String {
        let mut env = ChatTemplate::new(src.into(), None, None).unwrap().env;
        env.add_template_owned("probe", src.to_string()).unwrap();
        env.get_template("probe")
            .unwrap()
            .render(context! { x => x })
            .unwrap()
    }

    /// Outputs of transformers' Jinja2 environment for the same sources.
    #[test]
    fn tojson_and_printing_follow_python() {
        let x = serde_json::json!({"b": [1, 2.5, {}], "a": "é\n\"<&>", "c": [],
            "f": [1e16, 0.0001, 1e-5, 123.0]});
        let cases = [
            ("{{ x | tojson(indent=2, sort_keys=true) }}",
             "{\n  \"a\": \"é\\n\\\"<&>\",\n  \"b\": [\n    1,\n    2.5,\n    {}\n  ],\n  \"c\": [],\n  \"f\": [\n    1e+16,\n    0.0001,\n    1e-05,\n    123.0\n  ]\n}"),
            ("{{ x | tojson(ensure_ascii=true) }}",
             "{\"b\": [1, 2.5, {}], \"a\": \"\\u00e9\\n\\\"<&>\", \"c\": [], \"f\": [1e+16, 0.0001, 1e-05, 123.0]}"),
            ("{{ x | tojson(separators=(',', ':')) }}",
             "{\"b\":[1,2.5,{}],\"a\":\"é\\n\\\"<&>\",\"c\":[],\"f\":[1e+16,0.0001,1e-05,123.0]}"),
            // The first positional argument is `ensure_ascii`, not `indent`.
            ("{{ x | tojson(4) }}",
             "{\"b\": [1, 2.5, {}], \"a\": \"\\u00e9\\n\\\"<&>\", \"c\": [], \"f\": [1e+16, 0.0001, 1e-05, 123.0]}"),
            ("{{ {'a': true, 'b': none, 'c': [1, \"it's\"], 'd': 2.0} }}|{{ true }}|{{ none }}|{{ [1, 'x'] | string }}",
             "{'a': True, 'b': None, 'c': [1, \"it's\"], 'd': 2.0}|True|None|[1, 'x']"),
            ("{{ none is iterable }}{{ undefined_name is iterable }}{{ 'ab' is sequence }}",
             "FalseTrueTrue"),
        ];
        for (src, python) in cases {
            assert_eq!(render_src(src, x.clone()), python, "{src}");
        }
    }

    #[test]
    fn a_template_that_refuses_the_system_role_gets_it_in_the_first_user_turn() {
        let src = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}\
                   {% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
        let t = ChatTemplate::new(src.into(), None, None).unwrap();
        let messages = [
            Message::new("system", "Be brief."),
            Message::new("user", "Hi"),
        ];
        assert_eq!(t.render(&messages, true).unwrap(), "<user>Be brief.\n\nHi");
        let alone = [Message::new("system", "Be brief.")];
        assert_eq!(t.render(&alone, true).unwrap(), "<user>Be brief.");
        let other = ChatTemplate::new("{{ raise_exception('no') }}".into(), None, None).unwrap();
        let err = other.render(&messages, true).unwrap_err().to_string();
        assert!(err.contains("no"), "{err}");
    }

    #[test]
    fn functions_and_datetime_are_given_to_templates_that_read_them() {
        let t = ChatTemplate::new("{{ functions }}|{{ datetime }}".into(), None, None)
            .unwrap()
            .with_now(1_764_590_400);
        let tools = [serde_json::json!({"type": "function", "function": {"name": "f"}})];
        let text = t
            .render_with(
                &[Message::new("user", "hi")],
                true,
                Some(&tools),
                &Default::default(),
            )
            .unwrap();
        assert_eq!(
            text,
            "[\n  {\n    \"type\": \"function\",\n    \"function\": {\n      \"name\": \"f\"\n    }\n  }\n]|Dec 01 2025 12:00:00 GMT"
        );
    }

    #[test]
    fn an_unsupported_construct_is_an_error_that_names_it() {
        let t = ChatTemplate::new("{{ strftime_now('%Q') }}".into(), None, None).unwrap();
        let err = t.render(&[Message::new("user", "hi")], true).unwrap_err();
        assert!(err.to_string().contains("%Q"), "{err}");
        let t = ChatTemplate::new("{{ 'a'.zfill(3) }}".into(), None, None).unwrap();
        let err = t.render(&[Message::new("user", "hi")], true).unwrap_err();
        assert!(err.to_string().contains("zfill"), "{err}");
    }

    #[test]
    fn a_runaway_template_is_an_error() {
        let src =
            "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src.into(), None, None).unwrap();
        let started = std::time::Instant::now();
        let err = t.render(&[Message::new("user", "hi")], true).unwrap_err();
        assert!(err.to_string().contains("fuel"), "{err}");
        assert!(started.elapsed().as_secs() < 30);
        let ok = ChatTemplate::new("{{ messages[0].content }}".into(), None, None).unwrap();
        assert_eq!(
            ok.render(&[Message::new("user", "hi")], true).unwrap(),
            "hi"
        );
    }

    /// The same conversation rendered by transformers (scripts/oracle/make_template_golden.py).
    #[test]
    fn tool_prompt_equals_transformers_rendering() {
        let golden: serde_json::Value = serde_json::from_str(include_str!(
            "../tests/data/qwen3_template_tools_golden.json"
        ))
        .unwrap();
        let t = ChatTemplate::new(
            include_str!("../tests/data/qwen3_chat_template.jinja").into(),
            None,
            None,
        )
        .unwrap();
        let messages: Vec<Message> = serde_json::from_value(golden["messages"].clone()).unwrap();
        let tools = golden["tools"].as_array().unwrap().clone();
        for thinking in [true, false] {
            let mut kwargs = serde_json::Map::new();
            kwargs.insert("enable_thinking".into(), thinking.into());
            let ours = t
                .render_with(&messages, true, Some(&tools), &kwargs)
                .unwrap();
            assert_eq!(
                ours,
                golden["rendered"][thinking.to_string()],
                "enable_thinking={thinking}"
            );
        }
    }

    #[test]
    fn tool_turns_round_trip_through_a_qwen3_template() {
        let t = ChatTemplate::new(
            include_str!("../tests/data/qwen3_chat_template.jinja").into(),
            None,
            None,
        )
        .unwrap();
        let mut call = Message::new("assistant", "");
        call.tool_calls = Some(vec![serde_json::json!({"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}})]);
        let mut result = Message::new("tool", "21 C");
        result.tool_call_id = Some("call_1".into());
        let messages = [Message::new("user", "Weather in Paris?"), call, result];
        let tools = [serde_json::json!({"type": "function", "function": {"name": "get_weather"}})];
        let mut kwargs = serde_json::Map::new();
        kwargs.insert("enable_thinking".into(), false.into());
        let text = t
            .render_with(&messages, true, Some(&tools), &kwargs)
            .unwrap();
        assert!(text.contains("<tools>\n{"), "{text}");
        assert!(text.contains("\"name\": \"get_weather\""), "{text}");
        assert!(
            text.contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
            "{text}"
        );
        assert!(
            text.contains("<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>"),
            "{text}"
        );
        assert!(
            text.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            "{text}"
        );
    }
}
