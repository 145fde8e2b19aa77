//! `mlx-bun generate`: one completion, streamed to stdout or printed as JSON.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use mlx_bun::chat_template::Message;
use mlx_bun::decode::{self, generate, ConstraintSlot, Row};
use mlx_bun::generate::{GenerateOptions, DEFAULT_PREFILL_STEP};
use mlx_bun::grammar::{ConstraintSpec, GrammarEngine};
use mlx_bun::prompt::{build_prompt, PromptInput};
use mlx_bun::runtime::{Draft, DraftSpec, FitCheck, Runtime, RuntimeSpec};
use mlx_bun::sampling::SamplingParams;
use mlx_bun::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// Model directory or Hugging Face repo id (default: the embedded SmolLM2-135M-Instruct).
    #[arg(long, short)]
    model: Option<String>,
    /// Prompt text; `-` reads standard input.
    #[arg(long, short, conflicts_with_all = ["prompt_file", "messages_file"])]
    prompt: Option<String>,
    /// Run every line of a JSONL file (a prompt string, a messages array, or
    /// an object with "prompt"/"messages" and per-line "max_tokens",
    /// "temperature", "seed", "stop", "json_schema"…) as one continuous batch;
    /// results print in input order (one JSON object per line with --json).
    #[arg(long, conflicts_with_all = ["prompt", "prompt_file", "messages_file", "draft_model"])]
    batch_file: Option<PathBuf>,
    /// With --batch-file: rows decoded together.
    #[arg(long, default_value_t = 8)]
    decode_concurrency: usize,
    /// With --batch-file: prompts prefilled at once.
    #[arg(long, default_value_t = 4)]
    prompt_concurrency: usize,
    /// Read the prompt text from a file.
    #[arg(long, conflicts_with = "messages_file")]
    prompt_file: Option<PathBuf>,
    /// An OpenAI-style JSON array of chat messages.
    #[arg(long)]
    messages_file: Option<PathBuf>,
    /// System message put before the prompt.
    #[arg(long)]
    system: Option<String>,
    /// Use the prompt as is, without the chat template.
    #[arg(long)]
    ignore_chat_template: bool,
    /// Maximum number of tokens to generate.
    #[arg(long, short = 'n', default_value_t = 256, value_parser = crate::validate::at_least_one)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: crate::sampling_args::SamplingArgs,
    #[command(flatten)]
    compute: crate::model_arg::ComputeArgs,
    #[arg(long, value_parser = crate::validate::positive)]
    repetition_penalty: Option<f32>,
    #[arg(long, default_value_t = 20, value_parser = crate::validate::at_least_one)]
    repetition_context_size: usize,
    /// Logit bias as JSON, e.g. '{"1234": -100}'.
    #[arg(long)]
    logit_bias: Option<String>,
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when this text appears (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Print one JSON object with the text and statistics instead of streaming.
    #[arg(long)]
    json: bool,
    /// Print prompt/decode speed and peak memory to stderr.
    #[arg(long, short)]
    verbose: bool,
    #[arg(long, default_value_t = DEFAULT_PREFILL_STEP, value_parser = crate::validate::at_least_one)]
    prefill_step_size: usize,
    /// Draft model for speculative decoding (a directory, a repo id, or `ngram`
    /// for prompt-lookup drafting without a model).
    #[arg(long)]
    draft_model: Option<String>,
    /// Tokens the draft proposes per verification step.
    #[arg(long, default_value_t = mlx_bun::speculative::DEFAULT_NUM_DRAFT_TOKENS, value_parser = crate::validate::at_least_one)]
    num_draft_tokens: usize,
    /// LoRA adapter directory (adapters.safetensors + adapter_config.json).
    #[arg(long)]
    adapter_path: Option<PathBuf>,
    #[command(flatten)]
    constraint: ConstraintArgs,
    /// Continue from a KV cache saved by `cache-prompt` (or mlx_lm.cache_prompt);
    /// the prompt is what follows the cached text.
    #[arg(long, conflicts_with_all = ["batch_file", "messages_file"])]
    prompt_cache_file: Option<PathBuf>,
    /// Bound the KV cache to this many positions (the first 4 are kept).
    #[arg(long, conflicts_with = "batch_file")]
    max_kv_size: Option<usize>,
    #[command(flatten)]
    kv: crate::kv_args::KvArgs,
    /// Under `mlx-bun launch` with several ranks: split the layers across
    /// ranks (pipeline parallel) instead of the heads and MLP columns.
    #[arg(long)]
    pipeline: bool,
}

/// Structured-output flags: at most one of them.
#[derive(clap::Args)]
#[group(multiple = false)]
pub struct ConstraintArgs {
    /// Constrain the output to a JSON schema (a file or inline JSON).
    #[arg(long)]
    pub json_schema: Option<String>,
    /// Constrain the output to any JSON object.
    #[arg(long)]
    pub json_object: bool,
    /// Constrain the output to a regular expression.
    #[arg(long)]
    pub regex: Option<String>,
    /// Constrain the output to one of these comma-separated choices.
    #[arg(long, value_delimiter = ',')]
    pub choice: Option<Vec<String>>,
    /// Constrain the output to a Lark grammar file.
    #[arg(long)]
    pub grammar: Option<PathBuf>,
}

impl ConstraintArgs {
    pub fn spec(&self) -> Result<Option<ConstraintSpec>> {
        if let Some(s) = &self.json_schema {
            let text = if std::path::Path::new(s).is_file() {
                std::fs::read_to_string(s).with_context(|| format!("reading {s}"))?
            } else {
                s.clone()
            };
            let schema: serde_json::Value = serde_json::from_str(&text)
                .context("--json-schema is neither a readable file nor valid JSON")?;
            return Ok(Some(ConstraintSpec::JsonSchema(schema)));
        }
        if self.json_object {
            return Ok(Some(ConstraintSpec::JsonObject));
        }
        if let Some(r) = &self.regex {
            return Ok(Some(ConstraintSpec::Regex(r.clone())));
        }
        if let Some(c) = &self.choice {
            if c.is_empty() || c.iter().any(|x| x.is_empty()) {
                bail!("--choice needs non-empty, comma-separated choices");
            }
            return Ok(Some(ConstraintSpec::Choice(c.clone())));
        }
        if let Some(path) = &self.grammar {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading grammar {}", path.display()))?;
            return Ok(Some(ConstraintSpec::Lark(text)));
        }
        Ok(None)
    }
}

fn read_source(path: &std::path::Path) -> Result<String> {
    if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        return Ok(s);
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn prompt_input(args: &Args) -> Result<PromptInput> {
    if let Some(path) = &args.messages_file {
        let text = read_source(path)?;
        let messages: Vec<Message> = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JSON array of messages", path.display()))?;
        return Ok(PromptInput::Messages(messages));
    }
    let text = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) if p == "-" => read_source(std::path::Path::new("-"))?,
        (Some(p), _) => p.clone(),
        (None, Some(f)) => read_source(f)?,
        (None, None) => {
            bail!("give a prompt: --prompt TEXT, --prompt-file F, --messages-file F or --prompt -")
        }
    };
    Ok(PromptInput::Text {
        text,
        system: args.system.clone(),
        use_chat_template: !args.ignore_chat_template,
    })
}

fn sampling(args: &Args) -> Result<SamplingParams> {
    let logit_bias: HashMap<u32, f32> = match &args.logit_bias {
        Some(s) => {
            let raw: HashMap<String, f32> = serde_json::from_str(s)
                .context("--logit-bias must be a JSON object of token id to bias")?;
            raw.into_iter()
                .map(|(k, v)| {
                    Ok((
                        k.parse::<u32>()
                            .with_context(|| format!("bad token id {k:?}"))?,
                        v,
                    ))
                })
                .collect::<Result<_>>()?
        }
        None => HashMap::new(),
    };
    Ok(SamplingParams {
        repetition_penalty: args.repetition_penalty,
        repetition_context_size: args.repetition_context_size,
        logit_bias,
        seed: args.seed,
        ..args.sampling.params()
    })
}

/// `--draft-model`: `ngram`, else a model directory or repo id.
pub(crate) fn draft_spec(draft_model: Option<&str>) -> Result<Option<DraftSpec>> {
    Ok(match draft_model {
        None => None,
        Some("ngram") => Some(DraftSpec::Ngram),
        Some(spec) => Some(DraftSpec::Model(crate::model_arg::resolve(Some(spec))?)),
    })
}

pub fn run(args: Args) -> Result<()> {
    if args.batch_file.is_some() {
        return run_batch_file(args);
    }
    let group = crate::launch::join_group()?;
    if group.is_some() {
        crate::launch::refuse_sharded(&[
            ("--adapter-path", args.adapter_path.is_some()),
            ("--prompt-cache-file", args.prompt_cache_file.is_some()),
        ])?;
    }
    // Only rank 0 writes the output; the other ranks compute alongside it.
    let rank0 = group.as_ref().is_none_or(|g| g.rank() == 0);
    let input = prompt_input(&args)?;
    let mut sampling = sampling(&args)?;
    let constraint_spec = args.constraint.spec()?;
    let cache_file = crate::cache_prompt::open_file(args.prompt_cache_file.as_deref())?;
    let model_arg = crate::cache_prompt::model_arg(args.model.as_deref(), cache_file.as_ref());
    let dir = crate::model_arg::resolve(model_arg.as_deref())?;
    let tokenizer = Tokenizer::load(&dir)?;
    // Without a cache file the prompt is known before the model loads:
    // refuse at once what cannot fit in memory.
    let plain_prompt = match &cache_file {
        Some(_) => None,
        None => Some(build_prompt(&tokenizer, &input)?.1),
    };
    let spec = RuntimeSpec {
        model_dir: dir,
        compute: args.compute.dtype,
        adapter: args.adapter_path.clone(),
        draft: draft_spec(args.draft_model.as_deref())?,
        num_draft_tokens: args.num_draft_tokens,
        kv: args.kv.settings(args.max_kv_size),
        // A sharded model need not fit one device.
        fit: match &plain_prompt {
            Some(prompt) if group.is_none() && crate::model_arg::fit_check_enabled() => {
                Some(FitCheck {
                    context: prompt.len() + args.max_tokens,
                    reserved_bytes: 0,
                })
            }
            _ => None,
        },
        // A model split across ranks runs forward passes with the others.
        materialize: group.is_none(),
    };
    let mut runtime = Runtime::assemble(&spec, tokenizer)?;
    if let Some(group) = &group {
        crate::launch::shard(&mut runtime.model, group, args.pipeline)?;
    }
    let (model, tokenizer) = (&runtime.model, &*runtime.tokenizer);
    if let Some(id) = sampling
        .logit_bias
        .keys()
        .find(|&&id| id as usize >= model.vocab_size())
    {
        bail!(
            "--logit-bias names token {id}, beyond the vocabulary of {} tokens",
            model.vocab_size()
        );
    }
    let (prompt, mut caches) = match cache_file {
        Some(file) => crate::cache_prompt::continue_from(
            file,
            args.prompt_cache_file.as_deref().unwrap(),
            model,
            tokenizer,
            &input,
            runtime.kv,
        )?,
        None => (plain_prompt.unwrap_or_default(), runtime.make_caches()?),
    };
    let mut constraint = match &constraint_spec {
        Some(spec) => Some(GrammarEngine::new(tokenizer)?.constraint(spec)?),
        None => None,
    };
    // Ranks sample alike only from the same seed: they agree on rank 0's.
    if let Some(group) = &group {
        sampling.seed = Some(group.agree_seed(args.seed)?);
    }
    // mlx_lm.generate seeds before it builds the model, whose random
    // initialisation draws from the same stream first.
    sampling.seed_skip = model.init_draws;
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling,
        stop: args.stop.clone(),
        logprobs: None,
        prefill_step: args.prefill_step_size,
    };
    let stream = !args.json && rank0;
    let mut stdout = std::io::stdout();
    // A failed write (the reader went away) stops generating; the error is
    // returned after the loop (main ends quietly on a broken pipe).
    let mut write_error = None;
    let mut on_token = |ev: &mlx_bun::generate::TokenEvent| {
        if stream && !ev.text.is_empty() {
            if let Err(e) = stdout
                .write_all(ev.text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                write_error = Some(e);
                return false;
            }
        }
        true
    };
    if let Some(Draft::Model {
        warning: Some(warning),
        ..
    }) = &runtime.draft
    {
        eprintln!("warning: {warning}");
    }
    let result = match runtime.drafter(&opts.sampling)? {
        None => generate(
            model,
            tokenizer,
            &mut caches,
            &prompt,
            &opts,
            constraint.as_deref_mut(),
            &mut on_token,
        )?,
        Some(mut drafter) => {
            let row = Row::new(
                model,
                tokenizer,
                prompt.clone(),
                0,
                &opts,
                constraint.as_deref_mut().map(ConstraintSlot::Borrowed),
                Box::new(&mut on_token),
            )?
            .with_drafter(Box::new(drafter.as_mut()), runtime.num_draft_tokens);
            decode::run(model, &mut caches, row, opts.prefill_step)?
        }
    };
    if let Some(e) = write_error {
        return Err(anyhow::Error::new(e).context("writing to standard output"));
    }
    if !rank0 {
        return Ok(());
    }
    let mut stdout = std::io::stdout();
    if args.json {
        writeln!(stdout, "{}", serde_json::to_string(&result)?)?;
    } else {
        writeln!(stdout)?;
    }
    if args.verbose {
        eprintln!("==========");
        eprintln!(
            "Prompt: {} tokens, {:.3} tokens-per-sec",
            result.prompt_tokens, result.prompt_tps
        );
        eprintln!(
            "Generation: {} tokens, {:.3} tokens-per-sec",
            result.generation_tokens, result.generation_tps
        );
        eprintln!(
            "Peak memory: {:.3} GB",
            result.peak_memory_bytes as f64 / 1e9
        );
    }
    Ok(())
}

fn run_batch_file(args: Args) -> Result<()> {
    if mlx_bun::collective::launched() {
        bail!("--batch-file is not supported when the model is sharded across ranks (see docs/distributed.md)");
    }
    if args.decode_concurrency == 0 || args.prompt_concurrency == 0 {
        bail!("--decode-concurrency and --prompt-concurrency must be at least 1");
    }
    let path = args.batch_file.clone().unwrap();
    let sampling = sampling(&args)?;
    let constraint = args.constraint.spec()?;
    let dir = crate::model_arg::resolve(args.model.as_deref())?;
    let tokenizer = Tokenizer::load(&dir)?;
    let spec = RuntimeSpec {
        adapter: args.adapter_path.clone(),
        kv: args.kv.settings(args.max_kv_size),
        ..RuntimeSpec::new(dir.clone(), args.compute.dtype)
    };
    let runtime = Runtime::assemble(&spec, tokenizer)?;
    let model = &runtime.model;
    if !model.supports_batching() {
        bail!(
            "{} has layer caches that cannot batch; run its prompts one at a time",
            dir.display()
        );
    }
    let defaults = crate::batch_file::Defaults {
        options: GenerateOptions {
            max_tokens: args.max_tokens,
            sampling,
            stop: args.stop.clone(),
            logprobs: None,
            prefill_step: args.prefill_step_size,
        },
        system: args.system.clone(),
        use_chat_template: !args.ignore_chat_template,
        constraint,
        limits: mlx_bun::decode::BatchLimits {
            decode_concurrency: args.decode_concurrency,
            prompt_concurrency: args.prompt_concurrency,
            prefill_step: args.prefill_step_size,
            ..Default::default()
        },
        json: args.json,
    };
    crate::batch_file::run(&path, &runtime, defaults)
}
