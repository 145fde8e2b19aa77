//! The model card (`README.md`) of a converted model, as mlx-lm writes it:
//! the source card's metadata (when the model came from the Hub) with
//! `library_name: mlx`, `pipeline_tag`, the `mlx` tag and `base_model`, and
//! an empty body; `upload` fills the body in.

use std::path::Path;

use anyhow::{Context, Result};
use serde_yaml::{Mapping, Value};

/// Splits a card into its YAML metadata and its body.
pub fn split(card: &str) -> (Option<&str>, &str) {
    let Some(rest) = card.strip_prefix("---\n") else {
        return (None, card);
    };
    match rest.find("\n---") {
        Some(end) => {
            let body = &rest[end + 4..];
            (
                Some(&rest[..end + 1]),
                body.strip_prefix('\n').unwrap_or(body),
            )
        }
        None => (None, card),
    }
}

/// Parses the metadata of a card (empty when it has none).
pub fn metadata(card: &str) -> Result<Mapping> {
    match split(card).0 {
        Some(yaml) => {
            match serde_yaml::from_str::<Value>(yaml).context("parsing the model card metadata")? {
                Value::Mapping(m) => Ok(m),
                _ => Ok(Mapping::new()),
            }
        }
        None => Ok(Mapping::new()),
    }
}

/// Joins metadata and body into a card.
pub fn render(meta: &Mapping, body: &str) -> Result<String> {
    let yaml = serde_yaml::to_string(meta)?;
    Ok(format!("---\n{yaml}---\n{body}"))
}

/// The card of a model converted from `source` (a Hub repo id in `base_model`).
pub(crate) fn model_card(source: &Path, base_model: Option<&str>) -> Result<String> {
    let mut meta = match base_model {
        Some(_) => match std::fs::read_to_string(source.join("README.md")) {
            Ok(text) => metadata(&text).unwrap_or_default(),
            Err(_) => Mapping::new(),
        },
        None => {
            let mut m = Mapping::new();
            m.insert("language".into(), "en".into());
            m
        }
    };
    meta.insert("library_name".into(), "mlx".into());
    meta.insert("pipeline_tag".into(), "text-generation".into());
    let tags = meta
        .entry("tags".into())
        .or_insert_with(|| Value::Sequence(Vec::new()));
    if let Value::Sequence(list) = tags {
        if !list.iter().any(|t| t.as_str() == Some("mlx")) {
            list.push("mlx".into());
        }
    } else {
        *tags = Value::Sequence(vec!["mlx".into()]);
    }
    if let Some(repo) = base_model {
        meta.insert("base_model".into(), repo.into());
    }
    render(&meta, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_render_round_trip() {
        let card = "---\nlicense: apache-2.0\ntags:\n- text\n---\n# Title\nbody\n";
        let (meta, body) = split(card);
        assert_eq!(meta, Some("license: apache-2.0\ntags:\n- text\n"));
        assert_eq!(body, "# Title\nbody\n");
        let m = metadata(card).unwrap();
        assert_eq!(m["license"].as_str(), Some("apache-2.0"));
        let again = render(&m, body).unwrap();
        assert_eq!(metadata(&again).unwrap(), m);
        assert_eq!(split("no metadata").0, None);
    }
}
