//! The `mlx-bun` command line: one module per subcommand, each a thin layer
//! over the engine library.

mod batch_file;
mod bench;
mod cache_prompt;
mod chat;
mod completions;
mod convert;
mod evals;
mod evaluate;
mod fit;
mod generate;
mod kv_args;
mod launch;
mod manage;
mod model_arg;
mod perplexity;
mod progress;
mod sampling_args;
mod serve;
mod train;
mod upload;
mod validate;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

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
    /// Convert a Hugging Face checkpoint or a GGUF file into an mlx-lm model directory.
    Convert(convert::Args),
    /// Upload a model folder to a Hugging Face Hub repo (as mlx_lm.upload).
    Upload(upload::Args),
    /// List or delete models in the Hugging Face Hub cache (as mlx_lm.manage).
    Manage(manage::Args),
    /// Fine-tune with LoRA (SFT) or ORPO preference training.
    Train(train::Args),
    /// Micro-benchmarks of the engine.
    Bench(bench::Args),
    /// List, show and compare recorded runs (bench, train, ...).
    Evals(evals::Args),
    /// Predict memory use and the largest context and batch that fit.
    Fit(fit::Args),
    /// Score lm-evaluation-harness tasks (multiple choice, wikitext, gsm8k) as mlx_lm.evaluate.
    Evaluate(evaluate::Args),
    /// Perplexity of a model on text (as mlx_lm.perplexity).
    Perplexity(perplexity::Args),
    /// Print shell completions.
    Completions(completions::Args),
    /// Run a subcommand on several ranks (MLX distributed: ring, nccl, mpi).
    Launch(launch::Args),
}

/// MLX's CUDA backend keeps the kernels it compiles in `MLX_PTX_CACHE_DIR`:
/// by default under mlx-bun's cache, so a second start does not compile
/// them again. Set before MLX starts and before any thread does.
fn default_kernel_cache() {
    if std::env::var_os("MLX_PTX_CACHE_DIR").is_none() {
        let dir = mlx_bun::hub::cache_dir().join("ptx-cache");
        if std::fs::create_dir_all(&dir).is_ok() {
            std::env::set_var("MLX_PTX_CACHE_DIR", dir);
        }
    }
}

/// The process's one logger, on standard error: `serve --log-level`, else
/// `MLX_BUN_LOG`, else warnings.
fn init_logging(command: &Command) -> anyhow::Result<()> {
    use anyhow::Context;
    use tracing_subscriber::EnvFilter;
    let filter = match command {
        Command::Serve(args) => EnvFilter::try_new(args.log_level())
            .with_context(|| format!("invalid --log-level {:?}", args.log_level()))?,
        _ => EnvFilter::try_from_env("MLX_BUN_LOG").unwrap_or_else(|_| EnvFilter::new("warn")),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    Ok(())
}

/// Fixes the engine's settings from the environment (docs/settings.md),
/// with the defaults that depend on the command: a server uses the CUDA
/// kernel unless told otherwise (its warm-up compiles it before it reports
/// ready; elsewhere the first requests would pay for compiling it).
fn install_settings(command: &Command) -> anyhow::Result<()> {
    use mlx_bun::settings::{CudaKernel, Settings};
    let mut settings = Settings::from_env()?;
    if matches!(command, Command::Serve(_)) && settings.cuda_kernel == CudaKernel::Unset {
        settings.cuda_kernel = CudaKernel::On;
    }
    mlx_bun::settings::install(settings)
}

fn main() -> ExitCode {
    let cli = parse_args();
    if let Err(e) = init_logging(&cli.command).and_then(|()| install_settings(&cli.command)) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    default_kernel_cache();
    let result = match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::CachePrompt(args) => cache_prompt::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Upload(args) => upload::run(args),
        Command::Manage(args) => manage::run(args),
        Command::Train(args) => train::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Evals(args) => evals::run(args),
        Command::Fit(args) => fit::run(args),
        Command::Evaluate(args) => evaluate::run(args),
        Command::Perplexity(args) => perplexity::run(args),
        Command::Completions(args) => completions::run(args),
        Command::Launch(args) => launch::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`mlx-bun generate | head`): that
        // ends the command, it is not a failure (as ripgrep does).
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the command line. Every subcommand accepts negative numbers as
/// values (`--temp -1` reaches the range check and gets a clear error rather
/// than being read as an unknown flag).
fn parse_args() -> Cli {
    fn allow_negative_numbers(cmd: clap::Command) -> clap::Command {
        let names: Vec<String> = cmd
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        let mut cmd = cmd.allow_negative_numbers(true);
        for name in names {
            cmd = cmd.mut_subcommand(name, allow_negative_numbers);
        }
        cmd
    }
    let matches = allow_negative_numbers(Cli::command()).get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Whether `err` comes from writing to a closed pipe.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    /// Clap's own consistency checks over every subcommand.
    #[test]
    fn command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }

    /// A flattened argument group sharing an id with a command's own
    /// argument makes every invocation fail, which `debug_assert` misses.
    #[test]
    fn bench_forward_parses_with_and_without_its_dtype_flags() {
        for args in [
            &["bench", "forward", "--synthetic", "smollm2-135m"][..],
            &[
                "bench",
                "forward",
                "-m",
                "some/model",
                "--compute-dtype",
                "model",
            ],
            &[
                "bench",
                "forward",
                "--synthetic",
                "llama-1b",
                "--dtype",
                "float16",
            ],
        ] {
            let argv = std::iter::once("mlx-bun").chain(args.iter().copied());
            if let Err(e) = super::Cli::try_parse_from(argv) {
                panic!("{args:?}: {e}");
            }
        }
    }
}
