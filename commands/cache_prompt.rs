//! `mlx-bun cache-prompt`: prefill a prompt and save the KV cache to a file
//! that `generate --prompt-cache-file` (ours or mlx-lm's) continues from.

use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use mlx_bun::cache::KvSettings;
use mlx_bun::chat_template::Message;
use mlx_bun::generate::DEFAULT_PREFILL_STEP;
use mlx_bun::model::Model;
use mlx_bun::prefix::file as kv_file;
use mlx_bun::runtime::{Runtime, RuntimeSpec};
use mlx_bun::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// Model directory or Hugging Face repo id (default: the embedded SmolLM2-135M-Instruct).
    #[arg(long, short)]
    model: Option<String>,
    #[command(flatten)]
    compute: crate::model_arg::ComputeArgs,
    /// The text to cache; `-` reads standard input.
    #[arg(long, short, conflicts_with_all = ["prompt_file", "messages_file"])]
    prompt: Option<String>,
    /// Read the text to cache from a file.
    #[arg(long, conflicts_with = "messages_file")]
    prompt_file: Option<PathBuf>,
    /// A JSON array of chat messages; the last one is left open.
    #[arg(long)]
    messages_file: Option<PathBuf>,
    /// Where to save the cache (`.safetensors` is appended when missing).
    #[arg(long)]
    prompt_cache_file: PathBuf,
    /// Bound the cache to this many positions (the first 4 are kept).
    #[arg(long)]
    max_kv_size: Option<usize>,
    #[command(flatten)]
    kv: crate::kv_args::KvArgs,
    #[arg(long, default_value_t = DEFAULT_PREFILL_STEP)]
    prefill_step_size: usize,
}

fn messages(args: &Args) -> Result<Vec<Message>> {
    if let Some(path) = &args.messages_file {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let messages: Vec<Message> = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JSON array of messages", path.display()))?;
        if messages.is_empty() {
            bail!("{} holds no messages", path.display());
        }
        return Ok(messages);
    }
    let text = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) if p == "-" => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            s
        }
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        }
        (None, None) => bail!("give the text to cache: --prompt TEXT, --prompt-file F, --messages-file F or --prompt -"),
    };
    if text.is_empty() {
        bail!("the prompt is empty");
    }
    Ok(vec![Message::new("user", &text)])
}

pub fn run(args: Args) -> Result<()> {
    let messages = messages(&args)?;
    let dir = crate::model_arg::resolve(args.model.as_deref())?;
    let tokenizer = Tokenizer::load(&dir)?;
    let spec = RuntimeSpec {
        kv: args.kv.settings(args.max_kv_size),
        materialize: false,
        ..RuntimeSpec::new(dir.clone(), args.compute.dtype)
    };
    let runtime = Runtime::assemble(&spec, tokenizer)?;
    let (model, tokenizer) = (&runtime.model, &*runtime.tokenizer);
    let text = kv_file::cache_prompt_text(tokenizer, &messages)?;
    let tokens = tokenizer.encode(&text)?;
    if tokens.is_empty() {
        bail!("the prompt is empty");
    }
    let mut caches = runtime.make_caches()?;

    let bar = crate::progress::bar(
        "Processed {pos}/{len} tokens [{bar:30}] {per_sec} {msg}",
        tokens.len() as u64,
        true,
    );
    let start = Instant::now();
    mlx_bun::mlx_ext::reset_peak_memory();
    kv_file::fill(
        model,
        &mut caches,
        &tokens,
        args.prefill_step_size,
        &mut |done, _| bar.set_position(done as u64),
    )?;
    bar.finish();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "Prompt: {} tokens, {:.3} tokens-per-sec",
        tokens.len(),
        tokens.len() as f64 / secs.max(1e-9)
    );
    eprintln!(
        "Peak memory: {:.3} GB",
        mlx_bun::mlx_ext::peak_memory_bytes() as f64 / 1e9
    );
    let model_name = args
        .model
        .clone()
        .unwrap_or_else(|| dir.display().to_string());
    let metadata = kv_file::file_metadata(&model_name, model, &tokens)?;
    let written = kv_file::save(&args.prompt_cache_file, &caches, &metadata)?;
    eprintln!("Saved {} positions to {}", tokens.len(), written.display());
    Ok(())
}

/// Loads `--prompt-cache-file` when given.
pub fn open_file(path: Option<&std::path::Path>) -> Result<Option<kv_file::CacheFile>> {
    path.map(kv_file::load).transpose()
}

/// The model to load: `--model`, else the one the cache file names (as
/// mlx-lm does), else the default.
pub fn model_arg(model: Option<&str>, file: Option<&kv_file::CacheFile>) -> Option<String> {
    model
        .map(str::to_string)
        .or_else(|| file.and_then(|f| f.metadata.get("model").cloned()))
}

/// Prompt tokens and the caches they continue.
pub type Continuation = (Vec<u32>, Vec<Box<dyn mlx_bun::cache::KvCache>>);

/// Checks a loaded cache file against the model and flags, and returns the
/// prompt tokens that follow the cached text with the caches to continue.
pub fn continue_from(
    mut file: kv_file::CacheFile,
    path: &std::path::Path,
    model: &Model,
    tokenizer: &Tokenizer,
    input: &mlx_bun::prompt::PromptInput,
    kv: KvSettings,
) -> Result<Continuation> {
    use mlx_bun::prompt::PromptInput;
    let (max_kv_size, kv) = (kv.max_kv_size, kv.quantization);
    kv_file::check_compatible(&file, model, path)?;
    let p = path.display();
    if let Some((bits, group)) = kv_file::kv_quantization(&file) {
        if let Some(q) = kv.filter(|q| q.bits != bits) {
            bail!(
                "--kv-bits {} does not match {p}, quantized to {bits} bits",
                q.bits
            );
        }
        let wanted = kv.map_or(64, |q| q.group_size);
        if wanted != group {
            bail!("--kv-group-size {wanted} does not match {p}, quantized with group size {group}");
        }
    }
    if let Some(n) = max_kv_size {
        let attention = file.caches.iter().filter(|c| c.kind() != "ArraysCache");
        if attention.into_iter().any(|c| c.max_size() != Some(n)) {
            bail!("--max-kv-size {n} does not match the cache in {p}");
        }
    }
    kv_file::cast_to(&mut file.caches, model.dtype)?;
    if let Some(q) = kv {
        // A dense cache turns quantized once it reaches the start, as in mlx-lm.
        for c in file.caches.iter_mut() {
            if c.kind() == "KVCache" {
                if let Some((k, v)) = c.state() {
                    let mut qc = mlx_bun::cache::QuantizedCache::new(q);
                    mlx_bun::cache::KvCache::set_state(&mut qc, k, v, c.offset())?;
                    *c = Box::new(qc);
                }
            }
        }
    }
    let PromptInput::Text {
        text,
        system,
        use_chat_template,
    } = input
    else {
        bail!("--prompt-cache-file takes a text prompt");
    };
    let suffix =
        kv_file::prompt_after_cache(tokenizer, text, system.as_deref(), *use_chat_template)?;
    let tokens = tokenizer.encode(&suffix)?;
    if tokens.is_empty() {
        bail!("the prompt is empty: give the text that follows the cached prompt");
    }
    Ok((tokens, file.caches))
}
