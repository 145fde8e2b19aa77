//! `mlx-bun fit`: will this model fit in memory, and up to which context and
//! batch? The arithmetic is `mlx_bun::fit`; this prints it.

use anyhow::{bail, Result};
use mlx_bun::fit::{available_memory, compute_dtype_bytes, fit, FitReport, FitRequest, Footprint};
use mlx_bun::mlx_ext::ComputeDtype;

#[derive(clap::Args)]
pub struct Args {
    /// Model directory or Hugging Face repo id (default: the embedded SmolLM2-135M-Instruct).
    #[arg(long, short)]
    model: Option<String>,
    /// Draft model for speculative decoding.
    #[arg(long)]
    draft_model: Option<String>,
    /// Tokens the draft proposes per step.
    #[arg(long, default_value_t = mlx_bun::speculative::DEFAULT_NUM_DRAFT_TOKENS)]
    num_draft_tokens: usize,
    /// Tokens of context per sequence (default: the model's maximum).
    #[arg(long)]
    context: Option<usize>,
    /// Sequences decoded at once.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Quantize the KV cache to this many bits (2, 3, 4, 5, 6 or 8).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["2", "3", "4", "5", "6", "8"]))]
    kv_bits: Option<String>,
    /// Memory to fit into, in GiB (default: MemAvailable of this machine).
    #[arg(long)]
    memory: Option<f64>,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = mlx_bun::generate::DEFAULT_PREFILL_STEP)]
    prefill_step_size: usize,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    compute: crate::model_arg::ComputeArgs,
}

fn footprint(spec: Option<&str>, compute: ComputeDtype) -> Result<Footprint> {
    let dir = crate::model_arg::resolve(spec)?;
    Footprint::read(&dir, compute_dtype_bytes(&dir, compute)?)
}

pub fn run(args: Args) -> Result<()> {
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    if args.prefill_step_size == 0 {
        bail!("--prefill-step-size must be at least 1");
    }
    let memory_bytes = match args.memory {
        Some(g) if g.is_finite() && g > 0.0 => (g * (1u64 << 30) as f64) as u64,
        Some(_) => bail!("--memory must be a positive size in GiB"),
        None => available_memory()?,
    };
    let model = footprint(args.model.as_deref(), args.compute.dtype)?;
    let draft = match &args.draft_model {
        Some(d) => Some(footprint(Some(d), args.compute.dtype)?),
        None => None,
    };
    let context = args.context.or(model.max_context).unwrap_or(4096);
    if context == 0 {
        bail!("--context must be at least 1");
    }
    let report = fit(
        model,
        draft,
        FitRequest {
            context,
            batch: args.batch,
            kv_bits: args
                .kv_bits
                .as_deref()
                .map(|b| b.parse().expect("a listed bit width")),
            prefill_step: args.prefill_step_size,
            num_draft_tokens: args.num_draft_tokens,
            memory_bytes,
            reserved_bytes: 0,
        },
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    if !report.fits {
        bail!("{}", report.refusal());
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:>10.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn print_table(r: &FitReport) {
    let q = &r.request;
    println!("model      {}", r.model.dir);
    if let Some(d) = &r.draft {
        println!("draft      {}", d.dir);
    }
    println!(
        "shape      context {} × batch {}, KV {}, prefill chunk {}",
        q.context,
        q.batch,
        q.kv_bits
            .map(|b| format!("{b}-bit"))
            .unwrap_or_else(|| format!("{}-byte floats", r.model.dtype_bytes)),
        q.prefill_step.min(q.context)
    );
    println!();
    println!("weights                   {}", mib(r.weight_bytes));
    println!(
        "KV cache                  {}   ({:.1} KiB per token)",
        mib(r.kv_bytes),
        r.kv_bytes_per_token / 1024.0
    );
    if r.draft.is_some() {
        println!("draft (weights + KV)      {}", mib(r.draft_bytes));
    }
    println!(
        "prefill chunk peak        {}   (scores {}, logits {})",
        mib(r.prefill.total_bytes),
        mib(r.prefill.attention_scores_bytes).trim(),
        mib(r.prefill.logits_bytes).trim()
    );
    println!(
        "decode step peak          {}   ({} rows)",
        mib(r.decode.total_bytes),
        r.decode.rows
    );
    println!(
        "peak                      {}   ({} of {} rows at {} positions)",
        mib(r.total_bytes),
        r.peak.phase,
        r.peak.activation.rows,
        r.peak.activation.end
    );
    println!("memory                    {}", mib(q.memory_bytes));
    println!();
    println!(
        "{}: largest context at batch {}: {} tokens; largest batch at {} tokens: {}",
        if r.fits { "fits" } else { "does NOT fit" },
        q.batch,
        r.max_context,
        q.context,
        r.max_batch
    );
}
