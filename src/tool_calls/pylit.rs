//! Python literals as JSON: what `ast.literal_eval` reads in mlx-lm's
//! parsers (strings in either quotes, numbers, `True`/`False`/`None`, lists,
//! tuples, dicts), and the keyword calls of the pythonic format.

use serde_json::{Map, Number, Value};

pub(crate) struct Parser<'a> {
    text: &'a str,
    pos: usize,
    /// Also read JSON's `true`, `false` and `null` (templates render nested
    /// values as JSON inside pythonic calls).
    json_names: bool,
}

/// `ast.literal_eval(text)`, or `None` where Python would raise.
pub(crate) fn literal(text: &str) -> Option<Value> {
    let mut p = Parser::new(text, false);
    let v = p.value()?;
    p.end().then_some(v)
}

/// A call as pythonic tool calls write it: `name(key=value, …)`.
pub(crate) type Call = (String, Map<String, Value>);

/// `[f(a=1), g(b="x")]`: the list of keyword-only calls, or `None`.
pub(crate) fn call_list(text: &str) -> Option<Vec<Call>> {
    let mut p = Parser::new(text, true);
    p.eat('[').then_some(())?;
    let mut calls = Vec::new();
    loop {
        p.ws();
        if p.eat(']') {
            break;
        }
        calls.push(p.call()?);
        p.ws();
        if !p.eat(',') {
            p.ws();
            p.eat(']').then_some(())?;
            break;
        }
    }
    (p.end() && !calls.is_empty()).then_some(calls)
}

impl<'a> Parser<'a> {
    fn new(text: &'a str, json_names: bool) -> Self {
        Self {
            text,
            pos: 0,
            json_names,
        }
    }

    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn ws(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start().len();
    }

    fn eat(&mut self, c: char) -> bool {
        self.ws();
        if self.rest().starts_with(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn end(&mut self) -> bool {
        self.ws();
        self.pos == self.text.len()
    }

    fn ident(&mut self) -> Option<&'a str> {
        self.ws();
        let rest = self.rest();
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if len == 0 || rest.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        self.pos += len;
        Some(&rest[..len])
    }

    fn call(&mut self) -> Option<Call> {
        let mut name = self.ident()?.to_string();
        while self.rest().starts_with('.') {
            self.pos += 1;
            name.push('.');
            name.push_str(self.ident()?);
        }
        self.eat('(').then_some(())?;
        let mut args = Map::new();
        loop {
            if self.eat(')') {
                break;
            }
            let key = self.ident()?.to_string();
            self.eat('=').then_some(())?;
            args.insert(key, self.value()?);
            if !self.eat(',') {
                self.eat(')').then_some(())?;
                break;
            }
        }
        Some((name, args))
    }

    fn value(&mut self) -> Option<Value> {
        self.ws();
        let c = self.rest().chars().next()?;
        match c {
            '\'' | '"' => self.string().map(Value::String),
            '[' | '(' => {
                self.pos += 1;
                let close = if c == '[' { ']' } else { ')' };
                let mut items = Vec::new();
                loop {
                    if self.eat(close) {
                        break;
                    }
                    items.push(self.value()?);
                    if !self.eat(',') {
                        self.eat(close).then_some(())?;
                        break;
                    }
                }
                Some(Value::Array(items))
            }
            '{' => {
                self.pos += 1;
                let mut map = Map::new();
                loop {
                    if self.eat('}') {
                        break;
                    }
                    let key = match self.value()? {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    self.eat(':').then_some(())?;
                    map.insert(key, self.value()?);
                    if !self.eat(',') {
                        self.eat('}').then_some(())?;
                        break;
                    }
                }
                Some(Value::Object(map))
            }
            '-' | '+' | '.' | '0'..='9' => self.number(),
            _ => match self.ident()? {
                "True" => Some(Value::Bool(true)),
                "False" => Some(Value::Bool(false)),
                "None" => Some(Value::Null),
                "true" if self.json_names => Some(Value::Bool(true)),
                "false" if self.json_names => Some(Value::Bool(false)),
                "null" if self.json_names => Some(Value::Null),
                _ => None,
            },
        }
    }

    fn number(&mut self) -> Option<Value> {
        let rest = self.rest();
        let len = rest
            .char_indices()
            .find(|&(i, c)| {
                !(c.is_ascii_alphanumeric()
                    || c == '.'
                    || c == '_'
                    || (i > 0 && (c == '-' || c == '+') && rest[..i].ends_with(['e', 'E']))
                    || (i == 0 && (c == '-' || c == '+')))
            })
            .map_or(rest.len(), |(i, _)| i);
        let token = rest[..len].replace('_', "");
        self.pos += len;
        let (sign, digits) = match token.strip_prefix('-') {
            Some(d) => (-1i64, d),
            None => (1, token.strip_prefix('+').unwrap_or(&token)),
        };
        if let Some(v) = self.number_value(sign, digits.trim_start()) {
            return Some(v);
        }
        None
    }

    fn number_value(&self, sign: i64, digits: &str) -> Option<Value> {
        if digits.is_empty() || digits.starts_with(['-', '+']) {
            return None;
        }
        if digits.bytes().all(|b| b.is_ascii_digit()) {
            if digits.len() > 1 && digits.starts_with('0') {
                return None;
            }
            if let Ok(n) = digits.parse::<i64>() {
                return Some(Value::Number((sign * n).into()));
            }
            if sign > 0 {
                if let Ok(n) = digits.parse::<u64>() {
                    return Some(Value::Number(n.into()));
                }
            }
        }
        let f: f64 = digits.parse().ok()?;
        if !f.is_finite()
            || digits.contains(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        {
            return None;
        }
        Number::from_f64(sign as f64 * f).map(Value::Number)
    }

    fn string(&mut self) -> Option<String> {
        let quote = self.rest().chars().next()?;
        self.pos += 1;
        let mut out = String::new();
        let mut chars = self.rest().char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                c if c == quote => {
                    self.pos += i + 1;
                    return Some(out);
                }
                '\n' => return None,
                '\\' => {
                    let (_, e) = chars.next()?;
                    match e {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        '0' => out.push('\0'),
                        '\\' | '\'' | '"' => out.push(e),
                        '\n' => {}
                        'x' | 'u' => {
                            let n = if e == 'x' { 2 } else { 4 };
                            let hex: String =
                                (0..n).filter_map(|_| chars.next()).map(|p| p.1).collect();
                            let code = u32::from_str_radix(&hex, 16).ok()?;
                            out.push(char::from_u32(code)?);
                        }
                        other => {
                            out.push('\\');
                            out.push(other);
                        }
                    }
                }
                c => out.push(c),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn literals_and_calls() {
        assert_eq!(
            literal("{'category': 'books', 'in_stock': True}"),
            Some(json!({"category": "books", "in_stock": true}))
        );
        assert_eq!(
            literal("['fiction', 'new']"),
            Some(json!(["fiction", "new"]))
        );
        assert_eq!(literal("48838483920"), Some(json!(48838483920u64)));
        assert_eq!(literal("-1.5"), Some(json!(-1.5)));
        assert_eq!(literal("version 3.10.5-beta"), None);
        assert_eq!(literal("2025-06-15T10:30:00Z"), None);
        assert_eq!(literal("true"), None);
        let calls = call_list("[a.b(x=1, y='s, t'), c(z={\"k\": null})]").unwrap();
        assert_eq!(calls[0].0, "a.b");
        assert_eq!(calls[0].1["y"], "s, t");
        assert_eq!(calls[1].1["z"], json!({"k": null}));
        assert!(call_list("[f(1)]").is_none());
    }
}
