//! The interface between decoding and anything that restricts which tokens
//! may come next (JSON schemas, regexes, grammars). One constraint follows one
//! sequence; it advances only on tokens that are actually emitted.

use anyhow::{bail, Result};
use mlx_rs::Array;

/// Restricts which tokens may come next in one sequence (e.g. a compiled grammar);
/// it advances only on emitted tokens.
pub trait TokenConstraint: Send {
    /// The allowed-token mask for the next position, as a `[vocab]` bool
    /// array; `None` when every token is allowed.
    fn mask(&mut self, vocab: usize) -> Result<Option<Array>>;
    /// Whether `token` may come next (cheap check for speculative verify).
    fn allows(&mut self, token: u32) -> Result<bool>;
    /// Advances past an emitted token.
    fn commit(&mut self, token: u32) -> Result<()>;
    /// True once the constrained value is complete and nothing may follow.
    fn is_finished(&self) -> bool;
    /// An independent copy at the current position (e.g. for a draft model).
    fn fork(&self) -> Result<Box<dyn TokenConstraint>> {
        bail!("this constraint cannot be forked")
    }
    /// Undoes the last `tokens` commits (e.g. rejected draft tokens).
    fn rollback(&mut self, tokens: usize) -> Result<()> {
        let _ = tokens;
        bail!("this constraint cannot roll back")
    }
}
