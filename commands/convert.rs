//! `mlx-bun convert`.

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<()> {
    bail!("`mlx-bun convert` is not available yet")
}
