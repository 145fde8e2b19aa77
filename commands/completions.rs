//! `mlx-bun completions SHELL`: shell completion scripts.

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
    clap_complete::generate(args.shell, &mut cmd, "mlx-bun", &mut std::io::stdout());
    Ok(())
}
