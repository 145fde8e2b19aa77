//! The `mlx-bun` command line: one module per subcommand, each a thin layer
//! over the engine library.

mod batch_file;
mod bench;
mod cache_prompt;
mod chat;
mod completions;
mod convert;
mod generate;
mod model_arg;
mod serve;
mod train;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "mlx-bun",
    version,
    about = "Run, serve, constrain, speculate, convert and fine-tune local language models on MLX"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Generate text from a prompt or a chat.
    Generate(generate::Args),
    /// Prefill a prompt and save its KV cache to a file (as mlx_lm.cache_prompt).
    CachePrompt(cache_prompt::Args),
    /// Chat interactively, keeping the KV cache across turns (as mlx_lm.chat).
    Chat(chat::Args),
    /// Serve an OpenAI-compatible HTTP API.
    Serve(serve::Args),
    /// Convert a GGUF file into an mlx-lm model directory.
    Convert(convert::Args),
    /// Fine-tune with LoRA (SFT) or ORPO preference training.
    Train(train::Args),
    /// Micro-benchmarks of the engine.
    Bench(bench::Args),
    /// Print shell completions.
    Completions(completions::Args),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MLX_BUN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::CachePrompt(args) => cache_prompt::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Train(args) => train::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Completions(args) => completions::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
