//! `mlx-bun chat`: an interactive conversation that keeps its KV cache
//! across turns (as `mlx_lm.chat`). `q` quits, `r` resets, `h` helps;
//! Ctrl-C stops the current reply, not the session.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Result;
use mlx_bun::chat::ChatSession;
use mlx_bun::generate::{GenerateOptions, TokenEvent, DEFAULT_PREFILL_STEP};
use mlx_bun::runtime::{Runtime, RuntimeSpec};
use mlx_bun::sampling::SamplingParams;
use mlx_bun::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// Model directory or Hugging Face repo id (default: the embedded SmolLM2-135M-Instruct).
    #[arg(long, short)]
    model: Option<String>,
    #[command(flatten)]
    compute: crate::model_arg::ComputeArgs,
    /// System message for every turn.
    #[arg(long, alias = "system-prompt")]
    system: Option<String>,
    /// Maximum tokens per reply.
    #[arg(long, short = 'n', default_value_t = 256)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: crate::sampling_args::SamplingArgs,
    #[arg(long, value_parser = crate::validate::positive)]
    repetition_penalty: Option<f32>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Bound the KV cache to this many positions (the first 4 are kept).
    #[arg(long)]
    max_kv_size: Option<usize>,
    #[command(flatten)]
    kv: crate::kv_args::KvArgs,
    /// Start from a KV cache saved by `cache-prompt`: the first message
    /// completes the cached user turn.
    #[arg(long)]
    prompt_cache_file: Option<PathBuf>,
    #[arg(long, default_value_t = DEFAULT_PREFILL_STEP)]
    prefill_step_size: usize,
}

const HELP: &str = "q: quit   r: reset the conversation   h: help   (Ctrl-C stops a reply)";

/// Ctrl-C while a reply streams stops it; at the prompt it quits.
fn install_interrupt(generating: Arc<AtomicBool>, stop: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            loop {
                if tokio::signal::ctrl_c().await.is_err() {
                    return;
                }
                if generating.load(Ordering::SeqCst) {
                    stop.store(true, Ordering::SeqCst);
                } else {
                    eprintln!();
                    std::process::exit(130);
                }
            }
        });
    });
}

pub fn run(args: Args) -> Result<()> {
    let file = crate::cache_prompt::open_file(args.prompt_cache_file.as_deref())?;
    let model_arg = crate::cache_prompt::model_arg(args.model.as_deref(), file.as_ref());
    let dir = crate::model_arg::resolve(model_arg.as_deref())?;
    let spec = RuntimeSpec {
        kv: args.kv.settings(args.max_kv_size),
        ..RuntimeSpec::new(dir.clone(), args.compute.dtype)
    };
    let runtime = Runtime::assemble(&spec, Tokenizer::load(&dir)?)?;
    let (model, tokenizer) = (&runtime.model, &*runtime.tokenizer);
    mlx_rs::random::seed(args.seed)?;
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            repetition_penalty: args.repetition_penalty,
            ..args.sampling.params()
        },
        stop: Vec::new(),
        logprobs: None,
        prefill_step: args.prefill_step_size,
    };
    let rt = &runtime;
    let mut session = ChatSession::new(
        model,
        tokenizer,
        args.system.clone(),
        Box::new(move || rt.make_caches()),
    )?;
    if let (Some(file), Some(path)) = (file, args.prompt_cache_file.as_deref()) {
        let input = mlx_bun::prompt::PromptInput::Text {
            text: "-".into(),
            system: None,
            use_chat_template: true,
        };
        // Reuses generate's checks; the placeholder prompt is not used.
        let (_, caches) =
            crate::cache_prompt::continue_from(file, path, model, tokenizer, &input, runtime.kv)?;
        let file = mlx_bun::prefix::file::CacheFile {
            caches,
            metadata: Default::default(),
        };
        session.start_from(file);
    }

    let generating = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    install_interrupt(generating.clone(), stop.clone());
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("mlx-bun chat · {}\n{HELP}", dir.display());
    }
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    let mut line = String::new();
    loop {
        if interactive {
            print!("> ");
            stdout.flush()?;
        }
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let query = line.trim_end_matches(['\n', '\r']);
        match query.trim() {
            "q" => {
                eprintln!("bye");
                break;
            }
            "r" => {
                session.reset()?;
                eprintln!("[conversation reset]");
                continue;
            }
            "h" => {
                eprintln!("{HELP}");
                continue;
            }
            "" => continue,
            _ => {}
        }
        stop.store(false, Ordering::SeqCst);
        generating.store(true, Ordering::SeqCst);
        let mut on_token = |ev: &TokenEvent| {
            if !ev.text.is_empty() {
                let _ = stdout.write_all(ev.text.as_bytes());
                let _ = stdout.flush();
            }
            !stop.load(Ordering::SeqCst)
        };
        let result = session.turn(query, &opts, &mut on_token);
        generating.store(false, Ordering::SeqCst);
        let result = result?;
        println!();
        eprintln!(
            "[prompt: {} tokens processed, {} reused · reply: {} tokens, {:.1} tok/s{}]",
            result.prompt_tokens - result.cached_tokens,
            session.reused(),
            result.generation_tokens,
            result.generation_tps,
            if result.finish_reason == mlx_bun::generate::FinishReason::Cancelled {
                " · stopped"
            } else {
                ""
            }
        );
    }
    Ok(())
}
