//! Resolving `--model` for every subcommand, including the embedded default.

use std::path::PathBuf;

use anyhow::Result;
use mlx_bun::default_model::Progress;

/// The model directory for `--model`, or the default model when absent
/// (prepared on first use, with a progress bar).
pub fn resolve(model: Option<&str>) -> Result<PathBuf> {
    match model {
        Some(spec) => mlx_bun::hub::resolve_model(spec),
        None => {
            let bar = crate::progress::tensor_bar("converting");
            let dir = mlx_bun::default_model::ensure_with(&mut |p| {
                match p {
                Progress::Preparing { name, dir } => eprintln!(
                    "preparing the default model {name} (one-time download and conversion into {}) …",
                    dir.display()
                ),
                Progress::Convert(e) => crate::progress::advance(&bar, e),
            }
            });
            bar.finish_and_clear();
            dir
        }
    }
}
