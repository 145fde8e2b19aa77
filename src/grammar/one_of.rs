//! `oneOf` support. The grammar can only say "at least one branch matches"
//! (`anyOf`); that equals "exactly one" when no value can match two branches.
//! This module proves that for every `oneOf` in a schema, or refuses it.

use std::collections::BTreeSet;

use anyhow::{bail, Result};
use serde_json::{Map, Value};

/// Keywords whose values are data, not subschemas.
const DATA_KEYWORDS: [&str; 4] = ["enum", "const", "default", "examples"];

/// How deep `$ref` chains are followed before giving up.
const MAX_REF_DEPTH: usize = 16;

/// Refuses any `oneOf` whose branches are not provably mutually exclusive.
pub(crate) fn check_one_of(root: &Value) -> Result<()> {
    walk(root, root, "#")
}

fn walk(root: &Value, node: &Value, path: &str) -> Result<()> {
    match node {
        Value::Object(map) => {
            if let Some(Value::Array(branches)) = map.get("oneOf") {
                check_branches(root, branches, path)?;
            }
            for (k, v) in map {
                if !DATA_KEYWORDS.contains(&k.as_str()) {
                    walk(root, v, &format!("{path}/{k}"))?;
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                walk(root, v, &format!("{path}/{i}"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn check_branches(root: &Value, branches: &[Value], path: &str) -> Result<()> {
    for i in 0..branches.len() {
        for j in i + 1..branches.len() {
            let a = resolve(root, &branches[i]);
            let b = resolve(root, &branches[j]);
            if !disjoint(root, a, b) {
                bail!(
                    "oneOf at {path}/oneOf: branches {i} and {j} could both match the same value, \
                     so exactly-one cannot be enforced; give the branches different types, \
                     different const/enum values, or a required property with different \
                     const values (or use anyOf)"
                );
            }
        }
    }
    Ok(())
}

/// Follows local `$ref`s (`#/...` JSON pointers) to the schema they name.
fn resolve<'a>(root: &'a Value, mut schema: &'a Value) -> &'a Value {
    for _ in 0..MAX_REF_DEPTH {
        let Some(target) = schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix('#'))
            .and_then(|pointer| root.pointer(pointer))
        else {
            break;
        };
        schema = target;
    }
    schema
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The JSON types a schema admits, when it says.
fn types(schema: &Value) -> Option<BTreeSet<&str>> {
    if let Some(vals) = values(schema) {
        return Some(vals.iter().map(type_of).collect());
    }
    match schema.get("type")? {
        Value::String(t) => Some([t.as_str()].into()),
        Value::Array(ts) => ts.iter().map(Value::as_str).collect(),
        _ => None,
    }
}

/// The exact values a schema admits, when it lists them (`const`/`enum`).
fn values(schema: &Value) -> Option<Vec<Value>> {
    if let Some(c) = schema.get("const") {
        return Some(vec![c.clone()]);
    }
    schema.get("enum")?.as_array().cloned()
}

fn types_disjoint(a: &BTreeSet<&str>, b: &BTreeSet<&str>) -> bool {
    let overlaps = |x: &str, y: &str| {
        x == y || matches!((x, y), ("integer", "number") | ("number", "integer"))
    };
    a.iter().all(|x| b.iter().all(|y| !overlaps(x, y)))
}

fn values_disjoint(a: &[Value], b: &[Value]) -> bool {
    a.iter().all(|x| !b.contains(x))
}

fn only_objects(schema: &Value) -> bool {
    types(schema).is_some_and(|t| t.iter().all(|&x| x == "object"))
}

fn properties(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("properties")?.as_object()
}

fn required(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// `schema` is a closed object: no key outside `properties`.
fn is_closed(schema: &Value) -> bool {
    schema.get("additionalProperties") == Some(&Value::Bool(false))
        && schema.get("patternProperties").is_none()
}

/// Some property required by `a` takes values that `b` cannot give it,
/// or `b` cannot have it at all.
fn excluded_by_property(root: &Value, a: &Value, b: &Value) -> bool {
    let (Some(pa), pb) = (properties(a), properties(b)) else {
        return false;
    };
    required(a).into_iter().any(|key| {
        let in_b = pb.and_then(|p| p.get(key));
        match in_b {
            None => is_closed(b),
            Some(sb) => {
                let sa = pa.get(key).map(|s| resolve(root, s));
                let sb = resolve(root, sb);
                match (sa.and_then(values), values(sb)) {
                    (Some(va), Some(vb)) => values_disjoint(&va, &vb),
                    _ => false,
                }
            }
        }
    })
}

fn disjoint(root: &Value, a: &Value, b: &Value) -> bool {
    if let (Some(ta), Some(tb)) = (types(a), types(b)) {
        if types_disjoint(&ta, &tb) {
            return true;
        }
    }
    if let (Some(va), Some(vb)) = (values(a), values(b)) {
        return values_disjoint(&va, &vb);
    }
    // Object-level arguments hold only when non-objects match neither branch.
    if !(only_objects(a) || only_objects(b)) {
        return false;
    }
    excluded_by_property(root, a, b) || excluded_by_property(root, b, a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn distinct_types_are_exclusive() {
        let s = json!({"oneOf": [{"type": "string"}, {"type": "null"}]});
        assert!(check_one_of(&s).is_ok());
    }

    #[test]
    fn integer_and_number_overlap() {
        let s = json!({"oneOf": [{"type": "integer"}, {"type": "number"}]});
        assert!(check_one_of(&s).is_err());
    }

    #[test]
    fn const_discriminator_through_refs() {
        let s = json!({
            "$defs": {
                "cat": {"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"]},
                "dog": {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"]}
            },
            "properties": {"pet": {"oneOf": [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}]}}
        });
        assert!(check_one_of(&s).is_ok());
    }

    #[test]
    fn closed_object_without_required_key_is_exclusive() {
        let s = json!({"oneOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false},
            {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"], "additionalProperties": false}
        ]});
        assert!(check_one_of(&s).is_ok());
    }

    #[test]
    fn open_objects_overlap() {
        let s = json!({"oneOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}
        ]});
        assert!(check_one_of(&s).is_err());
    }
}
