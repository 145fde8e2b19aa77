//! Argument values of the formats that write them as text (XML-like tags,
//! key/value pairs): turning the text into JSON the way mlx-lm's parsers do,
//! by the type the tool's schema declares when there is one.

use serde_json::{Map, Number, Value};

use super::{pylit, Function};

/// The declared properties of `function`'s parameters.
pub(crate) fn properties<'a>(
    functions: &'a [Function],
    function: &str,
) -> Option<&'a Map<String, Value>> {
    functions
        .iter()
        .find(|f| f.name == function)?
        .parameters
        .get("properties")?
        .as_object()
}

/// Whether `function`'s parameter `name` is declared `"type": "string"`.
pub(crate) fn is_string(functions: &[Function], function: &str, name: &str) -> bool {
    properties(functions, function)
        .and_then(|p| p.get(name))
        .and_then(|s| s.get("type"))
        .and_then(Value::as_str)
        == Some("string")
}

/// JSON, else a Python literal, else the text itself.
pub(crate) fn deserialize(text: &str) -> Value {
    serde_json::from_str(text)
        .ok()
        .or_else(|| pylit::literal(text))
        .unwrap_or_else(|| Value::String(text.to_string()))
}

/// The quotes around a name go (`"fn"` or `'fn'`).
pub(crate) fn unquote(name: &str) -> &str {
    let n = name.trim();
    for q in ['"', '\''] {
        if n.len() >= 2 && n.starts_with(q) && n.ends_with(q) {
            return &n[1..n.len() - 1];
        }
    }
    n
}

/// Every type a schema allows (`type`, its list form, the types of `enum`
/// values, and those of `anyOf`/`oneOf`/`allOf`); `string` when none.
pub(crate) fn schema_types(schema: Option<&Value>) -> Vec<String> {
    fn collect(schema: &Value, out: &mut Vec<String>) {
        let Some(o) = schema.as_object() else { return };
        match o.get("type") {
            Some(Value::String(t)) => out.push(t.clone()),
            Some(Value::Array(ts)) => {
                out.extend(ts.iter().filter_map(Value::as_str).map(String::from))
            }
            _ => {}
        }
        if let Some(Value::Array(values)) = o.get("enum") {
            for v in values {
                out.push(
                    match v {
                        Value::Null => "null",
                        Value::Bool(_) => "boolean",
                        Value::Number(n) if n.is_f64() => "number",
                        Value::Number(_) => "integer",
                        Value::String(_) => "string",
                        Value::Array(_) => "array",
                        Value::Object(_) => "object",
                    }
                    .into(),
                );
            }
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(Value::Array(choices)) = o.get(key) {
                choices.iter().for_each(|c| collect(c, out));
            }
        }
    }
    let mut out = Vec::new();
    if let Some(s) = schema {
        collect(s, &mut out);
    }
    if out.is_empty() {
        out.push("string".into());
    }
    out
}

/// A float as Python's `val if val != int(val) else int(val)` leaves it.
fn float_or_int(f: f64) -> Option<Value> {
    if f.fract() == 0.0 && f.abs() < 9.0e15 {
        Some(Value::Number((f as i64).into()))
    } else {
        Number::from_f64(f).map(Value::Number)
    }
}

/// Python's `int(text)`: an optional sign and digits, spaces around.
fn python_int(text: &str) -> Option<Value> {
    let t = text.trim().replace('_', "");
    let digits = t.strip_prefix(['-', '+']).unwrap_or(&t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse::<i64>()
        .map(|n| Value::Number(n.into()))
        .or_else(|_| {
            t.trim_start_matches('+')
                .parse::<u64>()
                .map(|n| Value::Number(n.into()))
        })
        .ok()
}

fn python_float(text: &str) -> Option<f64> {
    text.trim().replace('_', "").parse::<f64>().ok()
}

/// MiniMax-M2's (and MiniCPM5's) conversion: the value as the most
/// specific of the declared types it fits, else JSON, else the text.
pub(crate) fn convert_with_types(value: &str, types: &[String]) -> Value {
    let lower = value.to_lowercase();
    if lower == "null" {
        return Value::Null;
    }
    let types: Vec<String> = types.iter().map(|t| t.to_lowercase()).collect();
    let has = |t: &str| types.iter().any(|x| x == t);
    if has("null") && ["null", "none", "nil"].contains(&lower.as_str()) {
        return Value::Null;
    }
    const PRIORITY: [&str; 11] = [
        "integer", "int", "number", "float", "boolean", "bool", "object", "array", "string", "str",
        "text",
    ];
    for t in PRIORITY.into_iter().filter(|t| has(t)) {
        let converted = match t {
            "string" | "str" | "text" => return Value::String(value.to_string()),
            "integer" | "int" => python_int(value),
            "number" | "float" => python_float(value).and_then(float_or_int),
            "boolean" | "bool" => match lower.trim() {
                "true" | "1" | "yes" | "on" => Some(Value::Bool(true)),
                "false" | "0" | "no" | "off" => Some(Value::Bool(false)),
                _ => None,
            },
            _ => serde_json::from_str(value)
                .ok()
                .or_else(|| pylit::literal(value)),
        };
        if let Some(v) = converted {
            return v;
        }
    }
    serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()))
}

/// Qwen3-Coder's conversion by the parameter's declared `type`; an error
/// where mlx-lm's raises (a number that is not one).
pub(crate) fn convert_qwen(value: &str, schema: Option<&Value>) -> anyhow::Result<Value> {
    if value.to_lowercase() == "null" {
        return Ok(Value::Null);
    }
    let Some(schema) = schema.filter(|s| s.as_object().is_some_and(|o| !o.is_empty())) else {
        return Ok(Value::String(value.to_string()));
    };
    let Some(kind) = schema.get("type") else {
        return Ok(match serde_json::from_str::<Value>(value) {
            Ok(v @ (Value::Object(_) | Value::Array(_))) => v,
            _ => Value::String(value.to_string()),
        });
    };
    let kind = match kind {
        Value::String(s) => s.trim().to_lowercase(),
        other => other.to_string().to_lowercase(),
    };
    let number = || python_float(value).ok_or_else(|| anyhow::anyhow!("{value:?} is not a number"));
    Ok(match kind.as_str() {
        "string" | "str" | "text" | "varchar" | "char" | "enum" => Value::String(value.to_string()),
        k if ["int", "uint", "long", "short", "unsigned"]
            .iter()
            .any(|p| k.starts_with(p)) =>
        {
            let f = number()?;
            if f.fract() != 0.0 {
                anyhow::bail!("invalid integer literal {value:?}");
            }
            Value::Number((f as i64).into())
        }
        k if k.starts_with("num") || k.starts_with("float") => {
            float_or_int(number()?).unwrap_or(Value::Null)
        }
        "boolean" | "bool" | "binary" => Value::Bool(value.to_lowercase() == "true"),
        k => {
            let structured = ["object", "array", "arr"].contains(&k)
                || k.starts_with("dict")
                || k.starts_with("list");
            structured
                .then(|| serde_json::from_str(value).ok())
                .flatten()
                .or_else(|| pylit::literal(value))
                .unwrap_or_else(|| Value::String(value.to_string()))
        }
    })
}
