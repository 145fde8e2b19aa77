//! Resolving `--model` for every subcommand, including the embedded default.

use std::path::PathBuf;

use anyhow::Result;

/// The model directory for `--model`, or the default model when absent.
pub fn resolve(model: Option<&str>) -> Result<PathBuf> {
    match model {
        Some(spec) => mlx_bun::hub::resolve_model(spec),
        None => mlx_bun::default_model::ensure(),
    }
}
