//! `mlx-bun completions SHELL`: shell completion scripts.

use std::io::Write;

use anyhow::Result;
use clap::CommandFactory;
use clap_complete::Shell;

#[derive(clap::Args)]
pub struct Args {
    /// bash, zsh, fish, elvish or powershell.
    shell: Shell,
}

pub fn run(args: Args) -> Result<()> {
    let mut cmd = crate::Cli::command();
    // Rendered into memory first: clap_complete panics on a failed write.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "mlx-bun", &mut script);
    std::io::stdout().write_all(&script)?;
    Ok(())
}
