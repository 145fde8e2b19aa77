//! Structured output: JSON schema, JSON object, regex, choice and Lark
//! grammars compiled (by llguidance) to per-token masks.
//!
//! `GrammarEngine::new` builds the tokenizer's token environment once per
//! process; `GrammarEngine::constraint` compiles a spec (or takes it from the
//! compiled-grammar cache) and returns a fresh per-sequence matcher. Invalid
//! or unenforceable specs are errors: nothing is ever generated unconstrained.

mod compile;
mod matcher;
mod one_of;
mod request;
mod token_env;

use std::sync::Arc;

use anyhow::Result;

pub use compile::{clear_cache, CompileInfo};
pub use matcher::GrammarConstraint;
pub use request::constraint_from_request;

use crate::constraint::TokenConstraint;
use crate::tokenizer::Tokenizer;
use token_env::{token_environment, TokenEnvironment};

/// What the output must conform to.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// A JSON schema the output must match (`response_format: json_schema`,
    /// `guided_json`).
    JsonSchema(serde_json::Value),
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// A regular expression the whole output must match (`guided_regex`).
    Regex(String),
    /// Exactly one of these strings (`guided_choice`).
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax (`guided_grammar`).
    Lark(String),
}

/// Builds constraints for one model's tokenizer. Cheap to clone; engines for
/// the same tokenizer share one token environment and one grammar cache.
#[derive(Clone)]
pub struct GrammarEngine {
    env: Arc<TokenEnvironment>,
}

impl GrammarEngine {
    /// An engine for `tokenizer`'s vocabulary; its token environment is built once
    /// per tokenizer and shared.
    pub fn new(tokenizer: &Tokenizer) -> Result<Self> {
        Ok(Self {
            env: token_environment(tokenizer)?,
        })
    }

    /// A fresh matcher for `spec`, at the start of the output.
    pub fn matcher(&self, spec: &ConstraintSpec) -> Result<GrammarConstraint> {
        let (matcher, info) = compile::matcher_for(&self.env, spec)?;
        Ok(GrammarConstraint::new(matcher, self.env.clone(), info))
    }

    /// The same, behind the decode loop's constraint interface.
    pub fn constraint(&self, spec: &ConstraintSpec) -> Result<Box<dyn TokenConstraint>> {
        Ok(Box::new(self.matcher(spec)?))
    }
}
