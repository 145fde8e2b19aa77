//! `mlx-bun train`.

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<()> {
    bail!("`mlx-bun train` is not available yet")
}
