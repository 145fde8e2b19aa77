//! LoRA adapters in mlx-lm's format (`adapters.safetensors` + `adapter_config.json`).

use std::path::Path;

use anyhow::{bail, Result};

use crate::model::Model;

/// Attaches the adapter in `dir` to `model`.
pub fn apply(_model: &mut Model, dir: &Path) -> Result<()> {
    bail!(
        "cannot load adapters from {}: not available yet",
        dir.display()
    )
}
