//! `mlx-bun serve`: the OpenAI-compatible HTTP server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use mlx_bun::gateway::{GatewayConfig, Sharding, ShardingSlot, Warmup};
use mlx_bun::reasoning::ReasoningMarkers;
use mlx_bun::runtime::{DraftSpec, Runtime, RuntimeSpec};
use mlx_bun::server::agent::AgentConfig;
use mlx_bun::server::models::{Allowed, ModelPool, PoolConfig};
use mlx_bun::server::{AppState, ServerConfig};
use mlx_bun::tool_calls::ToolFormat;

#[derive(clap::Args)]
pub struct Args {
    /// Model directory or Hugging Face repo id (default: the embedded SmolLM2-135M-Instruct).
    #[arg(long, short)]
    model: Option<String>,
    #[command(flatten)]
    compute: crate::model_arg::ComputeArgs,
    /// Under `mlx-bun launch` with several ranks: split the layers across
    /// ranks (pipeline parallel) instead of the heads and MLP columns.
    #[arg(long)]
    pipeline: bool,
    /// Address to listen on; anything but loopback exposes the server to the network.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on; 0 picks a free one (the ready line shows it).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer <KEY>` on every route but /health.
    #[arg(long, env = "MLX_BUN_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// max_tokens for requests that give none (cut to fit the context).
    #[arg(long, default_value_t = 512)]
    max_tokens_default: usize,
    /// RAM prompt cache size in GiB; 0 disables it.
    #[arg(long, default_value_t = 2.0)]
    prompt_cache: f64,
    /// Requests that may wait while one runs; more get 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Largest accepted request body in bytes; larger ones get 413.
    #[arg(long, default_value_t = 10_000_000)]
    max_body_bytes: usize,
    /// Log level: error, warn, info, debug or trace.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// LoRA adapter directory to apply to the model.
    #[arg(long)]
    adapter_path: Option<PathBuf>,
    /// Draft model for speculative decoding (a directory, a repo id, or
    /// `ngram` for prompt-lookup drafting without a model).
    #[arg(long)]
    draft_model: Option<String>,
    /// Tokens the drafter proposes per step.
    #[arg(long, default_value_t = 3)]
    num_draft_tokens: usize,
    /// Rows decoded together in one batch (continuous batching); 1 turns
    /// batching off. Drafting rows verify inside the batch.
    #[arg(long, default_value_t = 8)]
    decode_concurrency: usize,
    /// Prompts prefilled at once while the batch keeps decoding.
    #[arg(long, default_value_t = 4)]
    prompt_concurrency: usize,
    /// Prefill prompts in chunks of exactly this many tokens, as
    /// mlx_lm.server (default: chunks sized to take about half a second, so
    /// running rows keep streaming while a long prompt comes in).
    #[arg(long, value_parser = crate::validate::at_least_one)]
    prefill_step_size: Option<usize>,
    /// KV cache budget in GiB for admitted requests (default: half the memory
    /// available after loading). Requests wait while the batch would exceed
    /// it; one that can never fit gets a 400.
    #[arg(long)]
    kv_budget: Option<f64>,
    /// What runs before /health reports ready: auto (full on a GPU, where
    /// MLX compiles kernels on first use; basic on the CPU), basic (one
    /// forward pass), full (every prefill size class, batch size and
    /// sampling path) or off.
    #[arg(long, env = "MLX_BUN_WARMUP", default_value = "auto", value_parser = clap::value_parser!(Warmup))]
    warmup: Warmup,
    /// No warm-up: ready as soon as the model is loaded (same as --warmup off).
    #[arg(long)]
    no_warmup: bool,
    /// Sampling for requests that give none (mlx-lm's server flags).
    #[command(flatten)]
    sampling: crate::sampling_args::SamplingArgs,
    /// Browser origins that may call the API: `loopback` (localhost,
    /// 127.0.0.1, [::1], any port), `*`, or a comma-separated list.
    #[arg(long, default_value = "loopback")]
    allowed_origins: String,
    /// Tool-call format to parse (json_tools, llama3, mistral, function_gemma,
    /// phi, harmony, gemma4, glm47, laguna, kimi_k2, kimi_k3, longcat,
    /// minicpm5, minimax_m2, muse_spark, pythonic, qwen3_coder); by default
    /// the one the chat template implies.
    #[arg(long)]
    tool_call_parser: Option<String>,
    /// Reasoning markers to split off (think, longcat, gemma4, or none); by
    /// default the ones the vocabulary or the chat template has.
    #[arg(long)]
    reasoning_parser: Option<String>,
    /// A Jinja chat template file to use instead of the model's.
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// Template variables for every request, as a JSON object, e.g.
    /// '{"enable_thinking": false}'; a request's chat_template_kwargs win.
    #[arg(long)]
    chat_template_args: Option<String>,
    /// Other models requests may name in `model`: a folder (each subfolder
    /// with a config.json, by folder name) or a glob of model folders (by
    /// path). Repeatable.
    #[arg(long, value_name = "DIR|GLOB")]
    allowed_models: Vec<String>,
    /// Requests may name any local model folder or cached Hub repo id.
    #[arg(long)]
    allow_any_model: bool,
    /// GiB of weights the loaded models may hold together; the least
    /// recently used idle model is unloaded past it (default: half the
    /// memory available at start).
    #[arg(long, value_name = "GIB")]
    model_memory: Option<f64>,
    /// Seconds to let running requests finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30)]
    shutdown_grace: u64,
    /// Bound each request's KV cache to this many positions (the first 4
    /// are kept). Requests then run one at a time (no batching).
    #[arg(long)]
    max_kv_size: Option<usize>,
    /// KV quantization; requests then run one at a time (no batching).
    #[command(flatten)]
    kv: crate::kv_args::KvArgs,
    /// Folder of the prompt cache's tier on disk: finished requests' KV
    /// caches are written there and restored after a restart.
    #[arg(long)]
    ssd_cache: Option<PathBuf>,
    /// Size cap of --ssd-cache in GiB (least recently used entries go first).
    #[arg(long, default_value_t = 32.0)]
    ssd_cache_max: f64,
}

impl Args {
    /// The `--log-level` filter (the process's logger is set up from it).
    pub(crate) fn log_level(&self) -> &str {
        &self.log_level
    }
}

fn check(args: &Args) -> Result<()> {
    if args.max_queue == 0 {
        bail!("--max-queue must be at least 1");
    }
    if args.max_tokens_default == 0 {
        bail!("--max-tokens-default must be at least 1");
    }
    if !(args.prompt_cache.is_finite() && args.prompt_cache >= 0.0) {
        bail!("--prompt-cache must be a size in GiB, 0 or more");
    }
    if args.max_body_bytes < 1024 {
        bail!("--max-body-bytes must be at least 1024");
    }
    if args.decode_concurrency == 0 {
        bail!("--decode-concurrency must be at least 1");
    }
    if args.prompt_concurrency == 0 {
        bail!("--prompt-concurrency must be at least 1");
    }
    if matches!(args.kv_budget, Some(b) if !(b.is_finite() && b > 0.0)) {
        bail!("--kv-budget must be a size in GiB above 0");
    }
    if args.num_draft_tokens == 0 {
        bail!("--num-draft-tokens must be at least 1");
    }
    if !(args.ssd_cache_max.is_finite() && args.ssd_cache_max > 0.0) {
        bail!("--ssd-cache-max must be a size in GiB above 0");
    }
    if matches!(args.model_memory, Some(b) if !(b.is_finite() && b >= 0.0)) {
        bail!("--model-memory must be a size in GiB, 0 or more");
    }
    if matches!(&args.api_key, Some(k) if k.trim().is_empty()) {
        bail!("--api-key must not be empty");
    }
    Ok(())
}

fn agent_config(args: &Args) -> Result<AgentConfig> {
    let tool_call_parser = match &args.tool_call_parser {
        Some(name) => Some(ToolFormat::from_name(name).context("--tool-call-parser")?),
        None => None,
    };
    let reasoning_parser = match &args.reasoning_parser {
        Some(name) => Some(ReasoningMarkers::from_name(name).context("--reasoning-parser")?),
        None => None,
    };
    let chat_template_args = match &args.chat_template_args {
        None => Default::default(),
        Some(text) => match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(_) => bail!("--chat-template-args must be a JSON object"),
            Err(e) => bail!("--chat-template-args is not valid JSON: {e}"),
        },
    };
    Ok(AgentConfig {
        tool_call_parser,
        reasoning_parser,
        chat_template_args,
    })
}

fn model_id(args: &Args, dir: &std::path::Path) -> String {
    match &args.model {
        Some(spec) => spec.trim_end_matches('/').to_string(),
        None => dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| mlx_bun::default_model::NAME.to_string()),
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {},
        _ = terminate => {},
    }
}

/// Under `mlx-bun launch`: refuses what a sharded server cannot run, and
/// gives the sharding its gateway splits the model by, and this rank.
fn join_ranks(args: &Args) -> Result<Option<(Sharding, usize)>> {
    let Some(group) = crate::launch::join_group()? else {
        return Ok(None);
    };
    crate::launch::refuse_sharded(&[
        ("--draft-model", args.draft_model.is_some()),
        ("--adapter-path", args.adapter_path.is_some()),
        ("--kv-bits", args.kv.kv_bits.is_some()),
        ("--max-kv-size", args.max_kv_size.is_some()),
        ("--ssd-cache", args.ssd_cache.is_some()),
        ("--allowed-models", !args.allowed_models.is_empty()),
        ("--allow-any-model", args.allow_any_model),
        ("--decode-concurrency 1", args.decode_concurrency == 1),
    ])?;
    let rank = group.rank();
    let parallelism = if args.pipeline {
        mlx_bun::distributed::Parallelism::Pipeline
    } else {
        mlx_bun::distributed::Parallelism::Tensor
    };
    Ok(Some((Sharding { group, parallelism }, rank)))
}

/// A rank other than 0 of a sharded server: no HTTP; its gateway runs every
/// batch step rank 0 runs, in the same order, and ends when rank 0 shuts down.
fn follow(args: &Args, rank: usize, sharding: ShardingSlot) -> Result<()> {
    // The launcher passes SIGINT/SIGTERM to every rank: this one stops when
    // rank 0 broadcasts its shutdown (or is killed when rank 0 is gone).
    // SAFETY: installs the default "ignore" disposition; no handler runs.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
    let dir = crate::model_arg::resolve(args.model.as_deref())?;
    let tokenizer = Arc::new(mlx_bun::tokenizer::Tokenizer::load(&dir)?);
    // The gateway splits the model across the ranks once it is loaded.
    let spec = RuntimeSpec {
        materialize: false,
        ..RuntimeSpec::new(dir, args.compute.dtype)
    };
    let load = move || Runtime::assemble(&spec, tokenizer);
    let gateway = mlx_bun::gateway::Gateway::start(load, gateway_config(args, None, sharding))?;
    gateway.wait_ready()?;
    tracing::info!("rank {rank}: following rank 0");
    gateway.wait_stopped();
    Ok(())
}

fn gateway_config(
    args: &Args,
    ssd: Option<mlx_bun::gateway::SsdConfig>,
    sharding: ShardingSlot,
) -> GatewayConfig {
    let gib = |g: f64| (g * (1u64 << 30) as f64) as usize;
    GatewayConfig {
        max_queue: args.max_queue,
        prompt_cache_bytes: gib(args.prompt_cache),
        decode_concurrency: args.decode_concurrency,
        prompt_concurrency: args.prompt_concurrency,
        kv_budget_bytes: args.kv_budget.map(gib),
        ssd,
        warmup: if args.no_warmup {
            Warmup::Off
        } else {
            args.warmup
        },
        sharding,
        fixed_prefill_step: args.prefill_step_size,
    }
}

pub fn run(args: Args) -> Result<()> {
    check(&args)?;
    let sharding = match join_ranks(&args)? {
        Some((sharding, rank)) if rank != 0 => {
            return follow(&args, rank, ShardingSlot::new(sharding))
        }
        Some((sharding, _)) => ShardingSlot::new(sharding),
        None => ShardingSlot::default(),
    };

    let dir = crate::model_arg::resolve(args.model.as_deref())?;
    // An unreadable or unsupported config is refused before anything starts.
    mlx_bun::model::read_config(&dir)?;
    let chat_template = match &args.chat_template {
        Some(path) => {
            let source = std::fs::read_to_string(path)
                .with_context(|| format!("reading --chat-template {}", path.display()))?;
            mlx_bun::chat_template::ChatTemplate::new(source.clone(), None, None)
                .with_context(|| format!("--chat-template {}", path.display()))?;
            Some(source)
        }
        None => None,
    };
    let agent = agent_config(&args)?;
    let draft = match args.draft_model.as_deref() {
        None => None,
        Some("ngram") => Some(DraftSpec::Ngram),
        Some(spec) => Some(DraftSpec::Model(mlx_bun::hub::resolve_model(spec)?)),
    };
    let allowed = args
        .allowed_models
        .iter()
        .map(|spec| Allowed::parse(spec))
        .collect::<Result<Vec<_>>>()?;
    let gib = |g: f64| (g * (1u64 << 30) as f64) as u64;
    let memory_budget_bytes = match args.model_memory {
        Some(g) => gib(g),
        None => mlx_bun::fit::available_memory().unwrap_or(u64::MAX) / 2,
    };
    let config = ServerConfig {
        api_key: args.api_key.clone(),
        max_body_bytes: args.max_body_bytes,
        max_tokens_default: args.max_tokens_default,
        fingerprint: format!("fp_mlx-bun-{}", mlx_bun::version()),
        default_sampling: args.sampling.params(),
        cors: mlx_bun::server::cors::AllowedOrigins::parse(&args.allowed_origins),
        agent,
    };
    let kv = args.kv.settings(args.max_kv_size);
    let ssd = match &args.ssd_cache {
        Some(folder) => Some(mlx_bun::gateway::SsdConfig {
            write_delay: mlx_bun::settings::get().ssd_write_delay,
            ..mlx_bun::gateway::SsdConfig::for_model(
                folder.clone(),
                (args.ssd_cache_max * (1u64 << 30) as f64) as u64,
                &dir,
                args.adapter_path.as_deref(),
                &kv,
            )?
        }),
        None => None,
    };
    let models = ModelPool::new(PoolConfig {
        default_id: model_id(&args, &dir),
        default_dir: dir.clone(),
        default_adapter: args.adapter_path.clone(),
        default_draft: draft,
        num_draft_tokens: args.num_draft_tokens,
        default_kv: kv,
        allowed,
        allow_any: args.allow_any_model,
        memory_budget_bytes,
        // Refuse a model that cannot hold a default-length exchange in memory.
        min_context: args.max_tokens_default + 512,
        chat_template,
        compute: args.compute.dtype,
        fit_check: crate::model_arg::fit_check_enabled(),
        gateway: gateway_config(&args, ssd, sharding),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let grace = Duration::from_secs(args.shutdown_grace);
    runtime.block_on(async move {
        let addr: SocketAddr = format!("{}:{}", args.host, args.port)
            .parse()
            .or_else(|_| {
                std::net::ToSocketAddrs::to_socket_addrs(&(args.host.as_str(), args.port))
                    .ok()
                    .and_then(|mut a| a.next())
                    .context("no address")
            })
            .with_context(|| format!("invalid --host {:?}", args.host))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        if !local.ip().is_loopback() {
            tracing::warn!("listening on {local}: reachable from other machines");
        }
        let state = Arc::new(AppState {
            config,
            models: models.clone(),
            metrics: Default::default(),
        });
        // Unload idle models past the budget once their requests end.
        let sweeping = models.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let pool = sweeping.clone();
                let _ = tokio::task::spawn_blocking(move || pool.evict_over_budget()).await;
            }
        });
        let stopping = models.clone();
        let shutdown = async move {
            shutdown_signal().await;
            eprintln!(
                "mlx-bun serve: shutting down (up to {}s for running requests)",
                grace.as_secs()
            );
            stopping.stop_accepting();
            // Past the grace period, end what still runs with a clean error.
            let late = stopping.clone();
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                late.abort();
            });
        };
        let server = tokio::spawn(mlx_bun::server::serve(listener, state, shutdown));
        let model_name = dir.display();
        // The port is open while the default model loads and warms up
        // (`/health` answers 503 until then); a model that cannot serve
        // ends the command with its reason.
        eprintln!("mlx-bun serve: listening on http://{local}; loading {model_name}");
        if let Err(e) = models.start_default().await {
            tracing::error!("model {model_name} cannot serve: {}", e.message);
            models.stop_accepting();
            server.abort();
            let done = models.clone();
            tokio::task::spawn_blocking(move || done.shutdown(Duration::ZERO)).await?;
            bail!("{}", e.message);
        }
        // A closed stdout must not stop the server: the line is informational.
        use std::io::Write;
        let mut stdout = std::io::stdout();
        let _ = writeln!(
            stdout,
            "mlx-bun serve: ready at http://{local} (model {model_name})"
        )
        .and_then(|()| stdout.flush());

        server.await.context("the HTTP server stopped")??;
        let done = models.clone();
        tokio::task::spawn_blocking(move || done.shutdown(Duration::ZERO)).await?;
        eprintln!("mlx-bun serve: stopped");
        anyhow::Ok(())
    })
}
