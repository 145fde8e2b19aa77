//! Typed reads of request fields. Every failure names the field, so a
//! client learns exactly which parameter was wrong. `null` counts as absent.

use serde_json::{Map, Value};

use super::error::ApiError;

pub(crate) struct Fields<'a> {
    map: &'a Map<String, Value>,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<'a> Fields<'a> {
    pub fn of(body: &'a Value) -> Result<Self, ApiError> {
        match body {
            Value::Object(map) => Ok(Self { map }),
            other => Err(ApiError::bad_request(format!(
                "the request body must be a JSON object, not {}",
                type_name(other)
            ))),
        }
    }

    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    fn wrong(name: &str, expected: &str, v: &Value) -> ApiError {
        ApiError::invalid(
            name,
            format!("{name} must be {expected}, got {}", type_name(v)),
        )
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(Self::wrong(name, "a boolean", v)),
        }
    }

    pub fn string(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(Self::wrong(name, "a string", v)),
        }
    }

    /// A number within `[min, max]`.
    pub fn number(&self, name: &str, min: f64, max: f64) -> Result<Option<f64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let x = v.as_f64().ok_or_else(|| Self::wrong(name, "a number", v))?;
        if !(min..=max).contains(&x) {
            return Err(ApiError::invalid(
                name,
                format!("{name} must be between {min} and {max}, got {x}"),
            ));
        }
        Ok(Some(x))
    }

    /// An integer within `[min, max]` (`2.0` counts as an integer).
    pub fn integer(&self, name: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let x = match v {
            Value::Number(n) => n
                .as_i64()
                .or_else(|| {
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                        .map(|f| f as i64)
                })
                .or_else(|| n.as_u64().map(|_| i64::MAX)),
            _ => None,
        }
        .ok_or_else(|| Self::wrong(name, "an integer", v))?;
        if x < min || x > max {
            return Err(ApiError::invalid(
                name,
                format!("{name} must be between {min} and {max}, got {x}"),
            ));
        }
        Ok(Some(x))
    }

    /// A string or a list of strings.
    pub fn strings(&self, name: &str) -> Result<Vec<String>, ApiError> {
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.clone()]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(Self::wrong(name, "a string or a list of strings", other)),
                })
                .collect(),
            Some(v) => Err(Self::wrong(name, "a string or a list of strings", v)),
        }
    }

    pub fn object(&self, name: &str) -> Result<Option<Fields<'a>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Fields { map })),
            Some(v) => Err(Self::wrong(name, "an object", v)),
        }
    }

    pub fn entries(&self) -> impl Iterator<Item = (&'a String, &'a Value)> {
        self.map.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integers_and_ranges() {
        let body = json!({"a": 3, "b": 2.0, "c": 2.5, "d": "4", "e": -1, "f": null});
        let f = Fields::of(&body).unwrap();
        assert_eq!(f.integer("a", 0, 10).unwrap(), Some(3));
        assert_eq!(f.integer("b", 0, 10).unwrap(), Some(2));
        assert!(f.integer("c", 0, 10).is_err());
        let err = f.integer("d", 0, 10).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("d"));
        assert!(f.integer("e", 0, 10).is_err());
        assert_eq!(f.integer("f", 0, 10).unwrap(), None);
        assert_eq!(f.integer("missing", 0, 10).unwrap(), None);
    }

    #[test]
    fn strings_accept_one_or_many() {
        let body = json!({"s": "x", "l": ["a", "b"], "bad": [1]});
        let f = Fields::of(&body).unwrap();
        assert_eq!(f.strings("s").unwrap(), vec!["x"]);
        assert_eq!(f.strings("l").unwrap(), vec!["a", "b"]);
        assert!(f.strings("bad").is_err());
        assert!(Fields::of(&json!([1])).is_err());
    }
}
