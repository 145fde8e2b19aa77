//! `mlx-bun serve`.

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<()> {
    bail!("`mlx-bun serve` is not available yet")
}
