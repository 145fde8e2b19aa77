//! Gradient checkpointing: runs a function so that autodiff keeps only its
//! inputs and recomputes its intermediates during the backward pass
//! (`mlx::core::checkpoint`, which mlx-rs does not wrap).

use anyhow::{anyhow, Result};
use mlx_rs::Array;

use crate::mlx_closure::Closure;

/// Applies `body` to `inputs` under a checkpoint. `body` owns what it
/// captures: it runs again when the gradient is evaluated.
pub(crate) fn checkpointed<F>(body: F, inputs: &[Array]) -> Result<Vec<Array>>
where
    F: FnMut(&[Array]) -> Result<Vec<Array>> + 'static,
{
    // SAFETY: `mlx_checkpoint` fills the fresh handle from a live closure.
    let wrapped = Closure::new(body).transformed("checkpoint", |res, fun| unsafe {
        mlx_sys::mlx_checkpoint(res, fun)
    })?;
    let inputs: Vec<&Array> = inputs.iter().collect();
    wrapped
        .apply(&inputs)
        .map_err(|e| anyhow!("checkpointed function failed: {e:#}"))
}
