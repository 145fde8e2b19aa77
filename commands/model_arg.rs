//! Resolving `--model` for every subcommand, including the embedded default.

use std::path::PathBuf;

use anyhow::Result;
use mlx_bun::default_model::Progress;
use mlx_bun::model::ComputeDtype;

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

/// Whether the memory check before loading a model runs (`generate`,
/// `serve`): the settings' `skip_fit_check` (`MLX_BUN_SKIP_FIT_CHECK=1`)
/// turns it off (docs/fit.md).
pub fn fit_check_enabled() -> bool {
    !mlx_bun::settings::get().skip_fit_check
}

/// `--compute-dtype`, shared by every command that runs a model.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct ComputeArgs {
    /// The dtype the model computes in: auto (float32 on the CPU, where
    /// MLX is fast only in float32; the model's own dtype on a GPU), model
    /// (the dtype its weights are stored in, on every device, as mlx-lm
    /// computes) or float32.
    #[arg(long = "compute-dtype", default_value = "auto", value_parser = clap::value_parser!(ComputeDtype))]
    pub dtype: ComputeDtype,
}
