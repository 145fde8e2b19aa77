//! From a `ConstraintSpec` to a ready matcher: the llguidance grammar for each
//! kind of constraint, and the process-wide cache of compiled grammars keyed
//! by (tokenizer, grammar), so a repeated schema compiles once.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::Matcher;
use serde_json::{json, Value};

use super::one_of::check_one_of;
use super::token_env::{TokenEnvironment, TokenizerKey};
use super::ConstraintSpec;

/// How many compiled grammars the cache keeps (least recently used leave).
const CACHE_CAPACITY: usize = 128;

/// The one warning we accept: `oneOf` compiled as `anyOf`, which is exact
/// because `check_one_of` proved the branches mutually exclusive.
const ONE_OF_WARNING: &str = "oneOf not fully supported";

/// JSON layout rules applied unless the schema carries its own `x-guidance`.
/// Separators are fixed (`, ` and `: `) and no other whitespace may appear,
/// so the output is one canonical line and can never stall in whitespace.
fn json_options() -> Value {
    json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
        "coerce_one_of": true,
    })
}

fn json_schema_grammar(schema: &Value) -> Result<TopLevelGrammar> {
    let mut schema = match schema {
        Value::Object(_) => schema.clone(),
        Value::Bool(true) => json!({}),
        Value::Bool(false) => bail!("the JSON schema `false` accepts no value"),
        other => bail!(
            "a JSON schema must be an object, got {}",
            super::request::kind_of(other)
        ),
    };
    check_one_of(&schema)?;
    let obj = schema.as_object_mut().expect("checked above");
    if !obj.contains_key("x-guidance") {
        obj.insert("x-guidance".to_string(), json_options());
    }
    Ok(TopLevelGrammar::from_json_schema(schema))
}

/// A Lark string literal (JSON string syntax, which the Lark lexer reads,
/// except that it also refuses a raw DEL character).
fn lark_literal(s: &str) -> String {
    serde_json::to_string(s)
        .expect("strings always serialize")
        .replace('\u{7f}', "\\u007f")
}

fn choice_grammar(choices: &[String]) -> Result<TopLevelGrammar> {
    if choices.is_empty() {
        bail!("a choice constraint needs at least one choice");
    }
    if choices.iter().any(|c| c.is_empty()) {
        bail!("choices must not be empty strings");
    }
    let alternatives: Vec<String> = choices.iter().map(|c| lark_literal(c)).collect();
    Ok(TopLevelGrammar::from_lark(format!(
        "start: {}\n",
        alternatives.join(" | ")
    )))
}

/// The output always has to match the whole pattern, so the usual `^...$`
/// spelling of a full match is accepted and its anchors dropped.
fn strip_anchors(rx: &str) -> &str {
    let rx = rx.strip_prefix('^').unwrap_or(rx);
    match rx.strip_suffix('$') {
        Some(body) => {
            let backslashes = body.chars().rev().take_while(|&c| c == '\\').count();
            if backslashes % 2 == 0 {
                body
            } else {
                rx
            }
        }
        None => rx,
    }
}

fn regex_grammar(rx: &str) -> Result<TopLevelGrammar> {
    let body = strip_anchors(rx);
    if body.is_empty() {
        bail!("the regular expression is empty");
    }
    Ok(TopLevelGrammar::from_regex(body))
}

fn lark_grammar(src: &str) -> Result<TopLevelGrammar> {
    if src.trim().is_empty() {
        bail!("the Lark grammar is empty");
    }
    Ok(TopLevelGrammar::from_lark(src.to_string()))
}

/// The llguidance grammar for `spec`.
fn grammar_for(spec: &ConstraintSpec) -> Result<TopLevelGrammar> {
    match spec {
        ConstraintSpec::JsonSchema(schema) => json_schema_grammar(schema),
        ConstraintSpec::JsonObject => json_schema_grammar(&json!({"type": "object"})),
        ConstraintSpec::Regex(rx) => regex_grammar(rx),
        ConstraintSpec::Choice(choices) => choice_grammar(choices),
        ConstraintSpec::Lark(src) => lark_grammar(src),
    }
}

fn kind_name(spec: &ConstraintSpec) -> &'static str {
    match spec {
        ConstraintSpec::JsonSchema(_) => "JSON schema",
        ConstraintSpec::JsonObject => "JSON object grammar",
        ConstraintSpec::Regex(_) => "regular expression",
        ConstraintSpec::Choice(_) => "choice list",
        ConstraintSpec::Lark(_) => "Lark grammar",
    }
}

/// llguidance errors can carry the whole grammar; keep the message readable.
fn short_error(e: impl std::fmt::Display) -> String {
    const LIMIT: usize = 600;
    let msg = e.to_string();
    let msg = msg.trim();
    if msg.chars().count() <= LIMIT {
        return msg.to_string();
    }
    let cut: String = msg.chars().take(LIMIT).collect();
    format!("{cut}...")
}

fn compile(
    env: &TokenEnvironment,
    spec: &ConstraintSpec,
    grammar: TopLevelGrammar,
) -> Result<Matcher> {
    let what = kind_name(spec);
    let parser = env
        .factory
        .create_parser(grammar)
        .map_err(|e| anyhow!("invalid {what}: {}", short_error(e)))?;
    let mut matcher = Matcher::new(Ok(parser));
    if let Some(e) = matcher.get_error() {
        bail!("invalid {what}: {}", short_error(e));
    }
    let warnings: Vec<String> = matcher
        .grammar_warnings()
        .into_iter()
        .filter(|w| !w.contains(ONE_OF_WARNING))
        .collect();
    if !warnings.is_empty() {
        bail!(
            "the {what} cannot be enforced exactly: {}",
            short_error(warnings.join("; "))
        );
    }
    // The first mask builds the lexer's start states; doing it here makes a
    // cached grammar start warm and surfaces grammars that allow nothing.
    matcher
        .compute_mask()
        .map_err(|e| anyhow!("the {what} cannot start: {}", short_error(e)))?;
    Ok(matcher)
}

/// How a matcher came to be: compiled now or taken from the cache.
#[derive(Clone, Copy, Debug)]
pub struct CompileInfo {
    /// How long compiling (or taking it from the cache) took.
    pub elapsed: Duration,
    /// Whether the grammar came from the compiled-grammar cache.
    pub cached: bool,
}

type CacheKey = (TokenizerKey, String);

#[derive(Default)]
struct GrammarCache {
    entries: HashMap<CacheKey, (Matcher, u64)>,
    clock: u64,
}

impl GrammarCache {
    fn get(&mut self, key: &CacheKey) -> Option<Matcher> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(key).map(|(m, used)| {
            *used = clock;
            m.clone()
        })
    }

    fn insert(&mut self, key: CacheKey, matcher: Matcher) {
        if self.entries.len() >= CACHE_CAPACITY && !self.entries.contains_key(&key) {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.entries.remove(&k);
            }
        }
        self.clock += 1;
        self.entries.insert(key, (matcher, self.clock));
    }
}

fn cache() -> &'static Mutex<GrammarCache> {
    static CACHE: OnceLock<Mutex<GrammarCache>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// A fresh matcher for `spec`, compiled or cloned from the cache.
pub(crate) fn matcher_for(
    env: &TokenEnvironment,
    spec: &ConstraintSpec,
) -> Result<(Matcher, CompileInfo)> {
    let start = Instant::now();
    let grammar = grammar_for(spec)?;
    let text = serde_json::to_string(&grammar).map_err(|e| anyhow!("serializing grammar: {e}"))?;
    let key = (env.key, text);
    if let Some(m) = cache().lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        let info = CompileInfo {
            elapsed: start.elapsed(),
            cached: true,
        };
        return Ok((m, info));
    }
    let matcher = compile(env, spec, grammar)?;
    cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, matcher.clone());
    let info = CompileInfo {
        elapsed: start.elapsed(),
        cached: false,
    };
    Ok((matcher, info))
}

/// Drops every compiled grammar (for measuring cold compiles).
pub fn clear_cache() {
    let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
    c.entries.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_are_dropped_only_when_unescaped() {
        assert_eq!(strip_anchors("^a+$"), "a+");
        assert_eq!(strip_anchors("a\\$"), "a\\$");
        assert_eq!(strip_anchors("a\\\\$"), "a\\\\");
        assert_eq!(strip_anchors("abc"), "abc");
    }

    #[test]
    fn choice_literals_escape_quotes_and_control_characters() {
        assert_eq!(lark_literal("say \"hi\"\n"), "\"say \\\"hi\\\"\\n\"");
        assert_eq!(lark_literal("a\u{7f}"), "\"a\\u007f\"");
    }
}
