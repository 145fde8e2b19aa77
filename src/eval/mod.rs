//! Evaluation of a model: perplexity on text (as `mlx_lm.perplexity`) and
//! lm-evaluation-harness tasks of its three request types (multiple-choice
//! log-likelihood, rolling log-likelihood, generation until a stop string)
//! as `mlx_lm.evaluate` runs them, all over local data files.

pub mod data;
pub mod generate_until;
pub mod perplexity;
pub mod pyrandom;
pub mod rolling;
pub mod tasks;
