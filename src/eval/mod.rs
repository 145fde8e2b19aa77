//! Evaluation of a model: perplexity on text (as `mlx_lm.perplexity`) and
//! log-likelihood tasks (as lm-evaluation-harness scores them through
//! `mlx_lm.evaluate`), both over local data files.

pub mod data;
pub mod perplexity;
pub mod pyrandom;
pub mod tasks;
