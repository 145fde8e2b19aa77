//! The grammar that makes `tool_choice: required`, a named function, or
//! `parallel_tool_calls: false` hold: the family's call wrapper around a JSON
//! object whose name is one of the allowed functions and whose arguments
//! follow that function's JSON schema. Arguments admit no property the
//! schema does not name unless it says otherwise, and a reasoning block the
//! prompt opened is closed at once: a forced call starts right away and ends
//! when its schema is complete.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::ToolFormat;

/// What the request allows the model to do about its tools.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// Call tools or answer, as the model likes.
    Auto,
    /// Answer only; no call is parsed.
    None,
    /// At least one call, to any of the tools.
    Required,
    /// One call to this function.
    Function(String),
}

impl ToolChoice {
    /// Whether the output must be a call (and so is grammar-constrained).
    pub fn forces_call(&self) -> bool {
        matches!(self, Self::Required | Self::Function(_))
    }
}

/// One function offered to the model: its name and its parameters' schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    /// The function's `name`.
    pub name: String,
    /// Its `parameters`: a JSON schema of the arguments object.
    pub parameters: Value,
}

/// The reasoning the model may write before the call.
#[derive(Clone, Debug, PartialEq)]
pub struct ReasoningPrefix {
    /// The marker that opens the reasoning block.
    pub start: String,
    /// The marker that closes it.
    pub end: String,
    /// The prompt already opened the block: the output begins inside it.
    pub open: bool,
}

/// The layout rules every JSON in a forced call follows (as for
/// `response_format`): one canonical line, so the call cannot stall.
fn x_guidance() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

fn parameters_schema(f: &Function) -> Value {
    match &f.parameters {
        Value::Object(o) if !o.is_empty() => {
            let mut schema = f.parameters.clone();
            close_objects(&mut schema);
            schema
        }
        _ => json!({"type": "object", "properties": {}, "additionalProperties": false}),
    }
}

/// Sets `additionalProperties: false` on every object schema that names its
/// properties and does not say, however deep (properties, items, combinators,
/// definitions). An object without `properties` stays a free-form map.
fn close_objects(schema: &mut Value) {
    let Value::Object(o) = schema else { return };
    if o.contains_key("properties") && !o.contains_key("additionalProperties") {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    for key in ["properties", "patternProperties", "$defs", "definitions"] {
        if let Some(Value::Object(children)) = o.get_mut(key) {
            children.values_mut().for_each(close_objects);
        }
    }
    for key in ["items", "additionalProperties", "not", "if", "then", "else"] {
        if let Some(child) = o.get_mut(key) {
            close_objects(child);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(children)) = o.get_mut(key) {
            children.iter_mut().for_each(close_objects);
        }
    }
}

/// `{"name": <one of>, <args_key>: <its schema>}` for each allowed function.
fn call_schema(functions: &[&Function], args_key: &str) -> Value {
    let alternatives: Vec<Value> = functions
        .iter()
        .map(|f| {
            json!({
                "type": "object",
                "properties": {"name": {"const": f.name}, args_key: parameters_schema(f)},
                "required": ["name", args_key],
                "additionalProperties": false,
            })
        })
        .collect();
    let mut schema = if alternatives.len() == 1 {
        alternatives.into_iter().next().expect("one")
    } else {
        json!({"anyOf": alternatives})
    };
    schema["x-guidance"] = x_guidance();
    schema
}

fn with_guidance(mut schema: Value) -> Value {
    if schema.is_object() {
        schema["x-guidance"] = x_guidance();
    }
    schema
}

fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.^$|?*+()[]{}/-".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Spells `text` in Lark: pieces in `<…>` or `[…]` that are single tokens
/// of the vocabulary (`lookup`) become token references, the rest literals.
pub(crate) fn spell(text: &str, lookup: &dyn Fn(&str) -> Option<u32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        let close = match c {
            '<' => Some('>'),
            '[' => Some(']'),
            _ => None,
        };
        if let Some(end) = close.and_then(|close| rest.find(close)) {
            let piece = &rest[..=end];
            if let Some(id) = lookup(piece) {
                if !literal.is_empty() {
                    parts.push(serde_json::to_string(&literal).expect("string"));
                    literal.clear();
                }
                parts.push(format!("<[{id}]>"));
                rest = &rest[end + 1..];
                continue;
            }
        }
        literal.push(c);
        rest = &rest[c.len_utf8()..];
    }
    if !literal.is_empty() {
        parts.push(serde_json::to_string(&literal).expect("string"));
    }
    parts.join(" ")
}

/// The top of a grammar whose rule `body` is the answer: `start: body`, or
/// with reasoning, an optional free reasoning block before it.
pub fn grammar_head(reasoning: Option<&ReasoningPrefix>) -> String {
    match reasoning {
        None => "start: body\n".to_string(),
        Some(r) => {
            let (start, end) = (regex_escape(&r.start), regex_escape(&r.end));
            let block = if r.open {
                format!("/(.|\\n)*{end}\\s*/")
            } else {
                format!("/\\s*{start}(.|\\n)*{end}\\s*/")
            };
            // `lazy`: the block ends at the first end marker.
            format!("start: think? body\nthink[lazy]: {block}\n")
        }
    }
}

/// The Lark grammar that forces a call. `functions` are all the request's
/// tools; `choice` must force a call. `lookup` finds single-token markers.
pub fn call_grammar(
    format: ToolFormat,
    functions: &[Function],
    choice: &ToolChoice,
    parallel: bool,
    reasoning: Option<&ReasoningPrefix>,
    lookup: &dyn Fn(&str) -> Option<u32>,
) -> Result<String> {
    let allowed: Vec<&Function> = match choice {
        ToolChoice::Function(name) => match functions.iter().find(|f| &f.name == name) {
            Some(f) => vec![f],
            None => bail!("tool_choice names the function {name:?}, which is not among the tools"),
        },
        ToolChoice::Required => functions.iter().collect(),
        ToolChoice::Auto | ToolChoice::None => bail!("this tool_choice does not force a call"),
    };
    if allowed.is_empty() {
        bail!("tool_choice \"required\" needs at least one tool");
    }
    // A named function gets exactly one call.
    let many = parallel && matches!(choice, ToolChoice::Required);
    let sp = |t: &str| spell(t, lookup);
    let body = match format {
        ToolFormat::JsonTools => {
            let schema = call_schema(&allowed, "arguments");
            let one = format!("{} %json {schema} {}", sp("<tool_call>\n"), sp("\n</tool_call>"));
            if many {
                format!("call: {one}\nbody: call ({} call)*\n", sp("\n"))
            } else {
                format!("body: {one}\n")
            }
        }
        ToolFormat::Llama3 => {
            let schema = call_schema(&allowed, "parameters");
            if many {
                format!("call: %json {schema}\nbody: call ({} call)*\n", sp("; "))
            } else {
                format!("body: %json {schema}\n")
            }
        }
        ToolFormat::Mistral | ToolFormat::Phi => {
            let mut items = call_schema(&allowed, "arguments");
            items.as_object_mut().expect("object").remove("x-guidance");
            let mut list = json!({"type": "array", "items": items, "minItems": 1});
            if !many {
                list["maxItems"] = json!(1);
            }
            let list = with_guidance(list);
            if format == ToolFormat::Mistral {
                format!("body: {} %json {list}\n", sp("[TOOL_CALLS]"))
            } else {
                format!("body: {} %json {list} {}\n", sp("<|tool_call|>"), sp("<|/tool_call|>"))
            }
        }
        ToolFormat::Harmony => {
            let alternatives: Vec<String> = allowed
                .iter()
                .map(|f| {
                    format!(
                        "{} %json {} {}",
                        sp(&format!(
                            "<|channel|>commentary to=functions.{} <|constrain|>json<|message|>",
                            f.name
                        )),
                        with_guidance(parameters_schema(f)),
                        sp("<|call|>")
                    )
                })
                .collect();
            format!("body: {}\n", alternatives.join(" | "))
        }
        ToolFormat::FunctionGemma => bail!(
            "tool_choice \"required\" or a named function cannot be enforced for the function_gemma format (its arguments are not JSON); use \"auto\""
        ),
        ToolFormat::KimiK2 => {
            let calls: Vec<String> = allowed
                .iter()
                .map(|f| {
                    format!(
                        "{} {} /[0-9]{{1,3}}/ {} %json {} {}",
                        sp("<|tool_call_begin|>"),
                        serde_json::to_string(&format!("functions.{}:", f.name)).expect("string"),
                        sp("<|tool_call_argument_begin|>"),
                        with_guidance(parameters_schema(f)),
                        sp("<|tool_call_end|>")
                    )
                })
                .collect();
            let repeat = if many { "+" } else { "" };
            format!(
                "call: {}\nbody: {} (call){repeat} {}\n",
                calls.join(" | "),
                sp("<|tool_calls_section_begin|>"),
                sp("<|tool_calls_section_end|>")
            )
        }
        ToolFormat::Qwen3Coder => {
            let mut rules = String::new();
            let calls: Vec<String> = allowed
                .iter()
                .enumerate()
                .map(|(i, f)| qwen3_coder_call(i, f, &sp, &mut rules))
                .collect();
            let one = calls.join(" | ");
            if many {
                format!("{rules}call: {one}\nbody: call ({} call)*\n", sp("\n"))
            } else {
                format!("{rules}body: {one}\n")
            }
        }
        ToolFormat::Gemma4
        | ToolFormat::Glm47
        | ToolFormat::Laguna
        | ToolFormat::KimiK3
        | ToolFormat::Longcat
        | ToolFormat::MiniCpm5
        | ToolFormat::MinimaxM2
        | ToolFormat::MuseSpark
        | ToolFormat::Pythonic => bail!(
            "forcing a call is not supported for the {} format yet; use tool_choice \"auto\"",
            format.name()
        ),
    };
    Ok(format!("{}{body}", forced_head(reasoning, lookup)))
}

/// One Qwen3-Coder call to `f`: `<tool_call>\n<function=NAME>\n`, then a
/// `<parameter=KEY>\nVALUE\n</parameter>\n` block per property (the
/// required ones always, the others optionally, in the schema's order), then
/// `</function>\n</tool_call>`. String values are free text that opens no
/// tag; other values are JSON of their schema, as the parser reads them.
/// Rules the call needs are appended to `rules`.
fn qwen3_coder_call(
    index: usize,
    f: &Function,
    sp: &dyn Fn(&str) -> String,
    rules: &mut String,
) -> String {
    let schema = parameters_schema(f);
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut parts = vec![sp(&format!("<tool_call>\n<function={}>\n", f.name))];
    let properties = schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (j, (key, value_schema)) in properties.iter().enumerate() {
        let open = format!("<parameter={key}>\n");
        let rule = format!("p{index}_{j}");
        let is_text = value_schema["type"] == "string" && value_schema.get("enum").is_none();
        if is_text {
            // Free text that opens no tag, so the block's closing tag is the
            // only way on (a bare `<` or `<=` stays possible), within the
            // schema's `maxLength`.
            let repeat = match value_schema["maxLength"].as_u64() {
                Some(n) => format!("{{0,{n}}}"),
                None => "*".to_string(),
            };
            rules.push_str(&format!(
                "{rule}: {} /([^<]|<[^A-Za-z\\/!?<]){repeat}/ {}\n",
                serde_json::to_string(&open).expect("string"),
                serde_json::to_string("\n</parameter>\n").expect("string")
            ));
        } else {
            let mut value = value_schema.clone();
            if let Some(values) = value
                .get("enum")
                .filter(|_| value_schema["type"] == "string")
            {
                let alternatives: Vec<String> = values
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(|v| serde_json::to_string(v).expect("string"))
                    .collect();
                rules.push_str(&format!(
                    "{rule}: {} ({}) {}\n",
                    serde_json::to_string(&open).expect("string"),
                    alternatives.join(" | "),
                    serde_json::to_string("\n</parameter>\n").expect("string")
                ));
            } else {
                close_objects(&mut value);
                rules.push_str(&format!(
                    "{rule}: {} %json {} {}\n",
                    serde_json::to_string(&open).expect("string"),
                    with_guidance(value),
                    serde_json::to_string("\n</parameter>\n").expect("string")
                ));
            }
        }
        let optional = if required.contains(&key.as_str()) {
            ""
        } else {
            "?"
        };
        parts.push(format!("{rule}{optional}"));
    }
    parts.push(sp("</function>\n</tool_call>"));
    format!("({})", parts.join(" "))
}

/// The top of a forced call's grammar: the call comes first, after the end
/// marker when the prompt left a reasoning block open.
fn forced_head(
    reasoning: Option<&ReasoningPrefix>,
    lookup: &dyn Fn(&str) -> Option<u32>,
) -> String {
    match reasoning {
        Some(r) if r.open => format!("start: {} body\n", spell(&format!("{}\n\n", r.end), lookup)),
        _ => "start: body\n".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Vec<Function> {
        vec![
            Function {
                name: "get_weather".into(),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
            },
            Function {
                name: "get_time".into(),
                parameters: json!({}),
            },
        ]
    }

    #[test]
    fn named_function_grammar() {
        let no_tokens = |_: &str| None;
        let g = call_grammar(
            ToolFormat::JsonTools,
            &weather(),
            &ToolChoice::Function("get_weather".into()),
            true,
            None,
            &no_tokens,
        )
        .unwrap();
        assert!(
            g.starts_with("start: body\nbody: \"<tool_call>\\n\" %json {"),
            "{g}"
        );
        assert!(g.contains("\"const\":\"get_weather\""), "{g}");
        assert!(!g.contains("get_time"), "{g}");
        let err = call_grammar(
            ToolFormat::JsonTools,
            &weather(),
            &ToolChoice::Function("nope".into()),
            true,
            None,
            &no_tokens,
        )
        .unwrap_err();
        assert!(err.to_string().contains("\"nope\""));
    }

    #[test]
    fn markers_that_are_tokens_become_token_references() {
        let lookup = |t: &str| (t == "[TOOL_CALLS]").then_some(5);
        assert_eq!(spell("[TOOL_CALLS]", &lookup), "<[5]>");
        let lookup = |t: &str| (t == "<|message|>").then_some(7);
        assert_eq!(
            spell("a <b> <|message|>c", &lookup),
            "\"a <b> \" <[7]> \"c\""
        );
        let g = call_grammar(
            ToolFormat::Mistral,
            &weather(),
            &ToolChoice::Required,
            false,
            Some(&ReasoningPrefix {
                start: "<think>".into(),
                end: "</think>".into(),
                open: false,
            }),
            &|t| (t == "[TOOL_CALLS]").then_some(9),
        )
        .unwrap();
        assert!(g.starts_with("start: body\n"), "{g}");
        assert!(g.contains("body: <[9]> %json"), "{g}");
        assert!(g.contains("\"maxItems\":1"), "{g}");
    }

    #[test]
    fn arguments_admit_only_named_properties_unless_the_schema_says() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
                "stops": {"type": "array", "items": {"properties": {"name": {"type": "string"}}}},
                "extra": {"type": "object"},
                "either": {"anyOf": [{"properties": {"a": {}}}, {"type": "string"}]},
                "open": {"properties": {"b": {}}, "additionalProperties": true}
            },
            "$defs": {"d": {"properties": {"c": {}}}}
        });
        close_objects(&mut schema);
        let closed = |v: &Value| v["additionalProperties"] == json!(false);
        assert!(closed(&schema));
        assert!(closed(&schema["properties"]["where"]));
        assert!(closed(&schema["properties"]["stops"]["items"]));
        assert!(closed(&schema["properties"]["either"]["anyOf"][0]));
        assert!(closed(&schema["$defs"]["d"]));
        assert!(schema["properties"]["extra"]
            .get("additionalProperties")
            .is_none());
        assert_eq!(
            schema["properties"]["open"]["additionalProperties"],
            json!(true)
        );
    }

    #[test]
    fn a_forced_call_closes_an_open_reasoning_block_first() {
        let think = |open| ReasoningPrefix {
            start: "<think>".into(),
            end: "</think>".into(),
            open,
        };
        let lookup = |t: &str| (t == "</think>").then_some(4);
        let g = call_grammar(
            ToolFormat::JsonTools,
            &weather(),
            &ToolChoice::Required,
            true,
            Some(&think(true)),
            &lookup,
        )
        .unwrap();
        assert!(g.starts_with("start: <[4]> \"\\n\\n\" body\n"), "{g}");
        assert!(!g.contains("think"), "{g}");
        let g = call_grammar(
            ToolFormat::JsonTools,
            &weather(),
            &ToolChoice::Required,
            true,
            Some(&think(false)),
            &lookup,
        )
        .unwrap();
        assert!(g.starts_with("start: body\n"), "{g}");
    }
}
