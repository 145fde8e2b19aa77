//! The structured-output fields of an OpenAI-style request body: OpenAI's
//! `response_format` and vLLM's `guided_json`, `guided_regex`,
//! `guided_choice` and `guided_grammar`.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use super::ConstraintSpec;

pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A JSON schema given as an object (or boolean), or as a string holding one.
fn schema_value(v: &Value, field: &str) -> Result<Value> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        Value::String(s) => {
            let parsed: Value = serde_json::from_str(s)
                .with_context(|| format!("{field} is a string but not valid JSON"))?;
            match parsed {
                Value::Object(_) | Value::Bool(_) => Ok(parsed),
                other => bail!(
                    "{field} must be a JSON schema object, got {}",
                    kind_of(&other)
                ),
            }
        }
        other => bail!(
            "{field} must be a JSON schema object, got {}",
            kind_of(other)
        ),
    }
}

fn response_format(rf: &Value) -> Result<Option<ConstraintSpec>> {
    let obj = rf.as_object().ok_or_else(|| {
        anyhow!(
            "response_format must be an object such as {{\"type\": \"json_object\"}}, got {}",
            kind_of(rf)
        )
    })?;
    let kind = match obj.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(other) => bail!(
            "response_format.type must be a string, got {}",
            kind_of(other)
        ),
        None => bail!("response_format needs a \"type\" (text, json_object or json_schema)"),
    };
    match kind {
        "text" => Ok(None),
        "json_object" => match obj.get("schema").filter(|s| !s.is_null()) {
            // Some clients attach a schema to json_object; honour it.
            Some(schema) => Ok(Some(ConstraintSpec::JsonSchema(schema_value(
                schema,
                "response_format.schema",
            )?))),
            None => Ok(Some(ConstraintSpec::JsonObject)),
        },
        "json_schema" => {
            let js = obj
                .get("json_schema")
                .filter(|v| !v.is_null())
                .ok_or_else(|| {
                    anyhow!("response_format of type json_schema needs a \"json_schema\" object")
                })?;
            let js = js.as_object().ok_or_else(|| {
                anyhow!(
                    "response_format.json_schema must be an object, got {}",
                    kind_of(js)
                )
            })?;
            if let Some(strict) = js.get("strict") {
                if !strict.is_boolean() && !strict.is_null() {
                    bail!("response_format.json_schema.strict must be a boolean");
                }
            }
            let schema = js.get("schema").filter(|v| !v.is_null()).ok_or_else(|| {
                anyhow!("response_format.json_schema needs a \"schema\" (the JSON schema itself)")
            })?;
            Ok(Some(ConstraintSpec::JsonSchema(schema_value(
                schema,
                "response_format.json_schema.schema",
            )?)))
        }
        other => bail!(
            "unsupported response_format type {other:?}; expected \"text\", \"json_object\" or \"json_schema\""
        ),
    }
}

fn non_empty_string(v: &Value, field: &str) -> Result<String> {
    match v {
        Value::String(s) if !s.is_empty() => Ok(s.clone()),
        Value::String(_) => bail!("{field} must not be empty"),
        other => bail!("{field} must be a string, got {}", kind_of(other)),
    }
}

fn choices(v: &Value) -> Result<Vec<String>> {
    let list = v.as_array().ok_or_else(|| {
        anyhow!(
            "guided_choice must be an array of strings, got {}",
            kind_of(v)
        )
    })?;
    if list.is_empty() {
        bail!("guided_choice must list at least one choice");
    }
    list.iter()
        .enumerate()
        .map(|(i, c)| non_empty_string(c, &format!("guided_choice[{i}]")))
        .collect()
}

/// Reads the structured-output fields of a request body. `Ok(None)`: no
/// constraint. `Err` names the problem (a malformed field, an unknown
/// `response_format` type, or more than one constraint at once).
pub fn constraint_from_request(body: &Value) -> Result<Option<ConstraintSpec>> {
    let field = |name: &str| body.get(name).filter(|v| !v.is_null());
    let mut found: Vec<(&str, ConstraintSpec)> = Vec::new();
    if let Some(rf) = field("response_format") {
        if let Some(spec) = response_format(rf)? {
            found.push(("response_format", spec));
        }
    }
    if let Some(v) = field("guided_json") {
        found.push((
            "guided_json",
            ConstraintSpec::JsonSchema(schema_value(v, "guided_json")?),
        ));
    }
    if let Some(v) = field("guided_regex") {
        found.push((
            "guided_regex",
            ConstraintSpec::Regex(non_empty_string(v, "guided_regex")?),
        ));
    }
    if let Some(v) = field("guided_choice") {
        found.push(("guided_choice", ConstraintSpec::Choice(choices(v)?)));
    }
    if let Some(v) = field("guided_grammar") {
        found.push((
            "guided_grammar",
            ConstraintSpec::Lark(non_empty_string(v, "guided_grammar")?),
        ));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|(n, _)| *n).collect();
        bail!(
            "give at most one structured-output constraint per request, got {}",
            names.join(" and ")
        );
    }
    Ok(found.pop().map(|(_, spec)| spec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openai_json_schema() {
        let body = json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "strict": true, "schema": {"type": "object"}}}});
        assert_eq!(
            constraint_from_request(&body).unwrap(),
            Some(ConstraintSpec::JsonSchema(json!({"type": "object"})))
        );
    }

    #[test]
    fn text_is_no_constraint() {
        let body = json!({"response_format": {"type": "text"}, "guided_regex": "a+"});
        assert_eq!(
            constraint_from_request(&body).unwrap(),
            Some(ConstraintSpec::Regex("a+".into()))
        );
        assert_eq!(constraint_from_request(&json!({})).unwrap(), None);
    }

    #[test]
    fn guided_json_as_string() {
        let body = json!({"guided_json": "{\"type\": \"string\"}"});
        assert_eq!(
            constraint_from_request(&body).unwrap(),
            Some(ConstraintSpec::JsonSchema(json!({"type": "string"})))
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let err = |b: Value| constraint_from_request(&b).unwrap_err().to_string();
        assert!(err(json!({"response_format": {"type": "yaml"}}))
            .contains("unsupported response_format type"));
        assert!(err(json!({"guided_choice": []})).contains("at least one"));
        assert!(err(json!({"guided_json": "{nope"})).contains("not valid JSON"));
        assert!(err(json!({"guided_regex": "a", "guided_choice": ["b"]})).contains("at most one"));
        assert!(err(json!({"response_format": {"type": "json_schema"}})).contains("json_schema"));
    }
}
