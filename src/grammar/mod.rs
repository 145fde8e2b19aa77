//! Structured output: JSON schema, JSON object, regex, choice and Lark
//! grammars compiled to token masks.

use anyhow::{bail, Result};

use crate::constraint::TokenConstraint;
use crate::tokenizer::Tokenizer;

/// What the output must conform to.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    JsonSchema(serde_json::Value),
    JsonObject,
    Regex(String),
    Choice(Vec<String>),
    Lark(String),
}

/// Builds constraints for one model's tokenizer.
pub struct GrammarEngine {}

impl GrammarEngine {
    pub fn new(_tokenizer: &Tokenizer) -> Result<Self> {
        Ok(Self {})
    }

    pub fn constraint(&self, _spec: &ConstraintSpec) -> Result<Box<dyn TokenConstraint>> {
        bail!("structured output is not available yet")
    }
}

/// Reads the structured-output fields of an OpenAI-style request body
/// (`response_format`, `guided_json`, `guided_regex`, `guided_choice`,
/// `guided_grammar`). `Err` carries a message fit for a 400 answer.
pub fn constraint_from_request(_body: &serde_json::Value) -> Result<Option<ConstraintSpec>> {
    Ok(None)
}
