//! `mlx-bun bench`: micro-benchmarks of the engine on a real model, and the
//! serving feature matrix (`feature_matrix`).

mod attention;
mod feature_matrix;
mod generate;
mod plot;
mod qmv;

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Result};
use mlx_bun::evaldb::{EvalDb, Metric, RunMeta};
use mlx_bun::model::Model;
use mlx_bun::quant::QuantSpec;
use mlx_rs::transforms::eval;
use mlx_rs::Array;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
#[allow(clippy::large_enum_variant)]
enum What {
    /// Every serving feature combination against the real `mlx-bun serve`.
    FeatureMatrix(feature_matrix::Args),
    /// Prompt and generation speed on a random prompt, as `mlx_lm.benchmark`.
    Generate(generate::Args),
    /// mlx-bun's CUDA quantized matrix-vector kernel against MLX's, on random
    /// weights (GPU).
    Qmv(qmv::Args),
    /// mlx-bun's CUDA decode attention kernel (RoPE, cache write and
    /// attention in one launch) against MLX's nodes for the step (GPU).
    Attention(attention::Args),
    /// Time one forward pass over L new tokens after a fixed context.
    Forward {
        #[arg(long, short)]
        model: Option<String>,
        #[command(flatten)]
        compute: crate::model_arg::ComputeArgs,
        /// Random weights of a known shape instead of a model folder:
        /// llama-8b, llama-1b or smollm2-135m.
        #[arg(long, conflicts_with = "model")]
        synthetic: Option<String>,
        /// Bits of the synthetic model's quantized weights (0: unquantized).
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(0..=8))]
        q_bits: i32,
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(i32).range(32..=128))]
        q_group_size: i32,
        /// The synthetic model's dtype: bfloat16, float16 or float32.
        #[arg(long = "dtype", value_name = "DTYPE", default_value = "bfloat16")]
        synthetic_dtype: String,
        /// Time every length with mlx-bun's CUDA kernel on and off (GPU).
        #[arg(long)]
        compare_kernel: bool,
        /// Comma-separated numbers of new tokens per forward pass.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8", value_parser = crate::validate::at_least_one)]
        lengths: Vec<usize>,
        /// Context already in the cache.
        #[arg(long, default_value_t = 64, value_parser = crate::validate::count)]
        context: usize,
        #[arg(long, default_value_t = 5, value_parser = crate::validate::at_least_one)]
        runs: usize,
        /// Also decode this many tokens greedily, one step queued ahead as
        /// `generate` does, and report tokens per second and the host time
        /// per step (building the graph, handing it to MLX).
        #[arg(long, default_value_t = 0)]
        decode: usize,
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
        /// Do not record the run in the eval database.
        #[arg(long)]
        no_db: bool,
    },
}

pub fn run(args: Args) -> Result<()> {
    match args.what {
        What::FeatureMatrix(args) => feature_matrix::run(args),
        What::Generate(args) => generate::run(args),
        What::Qmv(args) => qmv::run(args),
        What::Attention(args) => attention::run(args),
        What::Forward {
            model,
            synthetic,
            q_bits,
            q_group_size,
            synthetic_dtype,
            compare_kernel,
            lengths,
            context,
            runs,
            decode,
            json,
            no_db,
            compute,
        } => {
            let source = match synthetic {
                Some(shape) => {
                    let dtype = mlx_bun::mlx_ext::parse_dtype(&synthetic_dtype)
                        .ok_or_else(|| anyhow::anyhow!("unknown --dtype {synthetic_dtype:?}"))?;
                    let quant = (q_bits > 0).then_some(QuantSpec::affine(q_group_size, q_bits));
                    Source::Synthetic {
                        shape,
                        quant,
                        dtype,
                    }
                }
                None => Source::Folder(model),
            };
            let plan = Plan {
                lengths: &lengths,
                context,
                runs,
                decode,
                json,
                no_db,
                compare_kernel,
                compute: compute.dtype,
            };
            forward(source, &plan)
        }
    }
}

enum Source {
    Folder(Option<String>),
    Synthetic {
        shape: String,
        quant: Option<QuantSpec>,
        dtype: mlx_rs::Dtype,
    },
}

struct Plan<'a> {
    lengths: &'a [usize],
    context: usize,
    runs: usize,
    decode: usize,
    json: bool,
    no_db: bool,
    compare_kernel: bool,
    compute: mlx_bun::model::ComputeDtype,
}

fn forward(source: Source, plan: &Plan<'_>) -> Result<()> {
    if plan.runs == 0 || plan.lengths.contains(&0) {
        bail!("--runs and every --lengths entry must be at least 1");
    }
    if plan.compare_kernel && !mlx_bun::mlx_ext::on_gpu() {
        bail!("--compare-kernel needs a GPU (mlx-bun's CUDA kernel runs only there)");
    }
    let (model, label) = match &source {
        Source::Folder(model) => {
            let dir = crate::model_arg::resolve(model.as_deref())?;
            let tokenizer = mlx_bun::tokenizer::Tokenizer::load(&dir)?;
            let spec = mlx_bun::runtime::RuntimeSpec::new(dir.clone(), plan.compute);
            let runtime = mlx_bun::runtime::Runtime::assemble(&spec, tokenizer)?;
            (runtime.model, dir.display().to_string())
        }
        Source::Synthetic {
            shape,
            quant,
            dtype,
        } => {
            let config = mlx_bun::model::synthetic::shape_config(shape)?;
            eprintln!("building a random {shape} model...");
            let model = Model::synthetic(config, *quant, *dtype, plan.compute)?;
            let bits = quant.map_or("dense".to_string(), |q| {
                format!("q{}g{}", q.bits, q.group_size)
            });
            (model, format!("synthetic:{shape}:{bits}"))
        }
    };
    let db = if plan.no_db {
        None
    } else {
        let db = EvalDb::open(&mlx_bun::evaldb::default_path())?;
        let flags = serde_json::json!({
            "lengths": plan.lengths,
            "context": plan.context,
            "runs": plan.runs,
            "compare_kernel": plan.compare_kernel,
        });
        let meta = match &source {
            Source::Folder(_) => RunMeta::detect(Some(std::path::Path::new(&label))),
            Source::Synthetic { .. } => RunMeta::detect(None),
        };
        let id = db.start_run_with("bench", Some("forward"), &label, &flags, &meta)?;
        Some((db, id))
    };
    let ctx: Vec<u32> = (0..plan.context as u32).map(|i| 100 + i % 1000).collect();
    let mut out = std::io::stdout();
    let kernels: &[Option<bool>] = if plan.compare_kernel {
        &[Some(false), Some(true)]
    } else {
        &[None]
    };
    if !plan.json {
        writeln!(
            out,
            "{:>6} {:>8} {:>12} {:>14}",
            "tokens", "kernel", "ms/forward", "ms/token"
        )?;
    }
    for &len in plan.lengths {
        for &kernel in kernels {
            if let Some(on) = kernel {
                mlx_bun::kernels::cuda::set_enabled(on);
            }
            let times = time_forward(&model, &ctx, len, plan.runs)?;
            let tag = kernel_tag(kernel);
            if let Some((db, id)) = &db {
                let name = match kernel {
                    Some(_) => format!("ms_per_forward.{len}.{tag}"),
                    None => format!("ms_per_forward.{len}"),
                };
                for &t in &times {
                    db.record_metrics(
                        *id,
                        &[Metric {
                            name: &name,
                            value: t,
                            unit: "ms",
                            higher_is_better: Some(false),
                        }],
                    )?;
                }
            }
            let median = times[times.len() / 2];
            if plan.json {
                writeln!(
                    out,
                    "{}",
                    serde_json::json!({"tokens": len, "kernel": tag, "ms_per_forward": median, "ms_per_token": median / len as f64})
                )?;
            } else {
                writeln!(
                    out,
                    "{len:>6} {tag:>8} {median:>12.2} {:>14.2}",
                    median / len as f64
                )?;
            }
        }
    }
    if plan.decode > 0 {
        for &kernel in kernels {
            if let Some(on) = kernel {
                mlx_bun::kernels::cuda::set_enabled(on);
            }
            let tag = kernel_tag(kernel);
            for _ in 0..plan.runs.min(3) {
                let d = time_decode(&model, &ctx, plan.decode)?;
                if let Some((db, id)) = &db {
                    db.record_metrics(
                        *id,
                        &[Metric {
                            name: &format!("decode_tok_s.{tag}"),
                            value: d.tokens_per_second,
                            unit: "tok/s",
                            higher_is_better: Some(true),
                        }],
                    )?;
                }
                let line = serde_json::json!({
                    "decode_tokens": plan.decode,
                    "kernel": tag,
                    "tok_s": d.tokens_per_second,
                    "build_ms": d.build_ms,
                    "dispatch_ms": d.dispatch_ms,
                });
                if plan.json {
                    writeln!(out, "{line}")?;
                } else {
                    writeln!(
                        out,
                        "decode {} tokens, kernel {tag}: {:.1} tok/s; host per step: graph {:.2} ms, \
                         handing to MLX {:.2} ms",
                        plan.decode, d.tokens_per_second, d.build_ms, d.dispatch_ms
                    )?;
                }
            }
        }
    }
    if let Some((db, id)) = &db {
        db.finish_run(*id, "done", &serde_json::json!({}))?;
        if !plan.json {
            writeln!(out, "recorded as run {id} in {}", db.path().display())?;
        }
    }
    Ok(())
}

/// Sorted times (ms) of `runs` forward passes over `len` new tokens after
/// `ctx`, after one untimed warm-up pass. `MLX_BUN_BENCH_BUILD=1` also
/// prints the median time spent building the lazy graph (host side).
fn time_forward(model: &Model, ctx: &[u32], len: usize, runs: usize) -> Result<Vec<f64>> {
    let mut times = Vec::new();
    let mut builds = Vec::new();
    for run in 0..runs + 1 {
        let mut caches = model.make_caches();
        mlx_bun::generate::prefill(model, &mut caches, ctx, 2048)?;
        let ids: Vec<i32> = (0..len as i32).map(|i| 200 + i).collect();
        let input = Array::from_slice(&ids, &[1, len as i32]);
        let t = Instant::now();
        let logits = model.forward(&input, &mut caches)?;
        let built = t.elapsed().as_secs_f64() * 1e3;
        eval([&logits])?;
        if run > 0 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
            builds.push(built);
        }
    }
    times.sort_by(f64::total_cmp);
    builds.sort_by(f64::total_cmp);
    if std::env::var("MLX_BUN_BENCH_BUILD").is_ok_and(|v| v == "1") {
        eprintln!(
            "{len} tokens: graph built in {:.2} ms (median)",
            builds[builds.len() / 2]
        );
    }
    Ok(times)
}

/// How a row names the kernel it ran with: ours, MLX's, or the settings'.
fn kernel_tag(kernel: Option<bool>) -> &'static str {
    match kernel {
        Some(true) => "mlx-bun",
        Some(false) => "mlx",
        None => "default",
    }
}

struct DecodeTiming {
    tokens_per_second: f64,
    /// Median host time building one step's graph.
    build_ms: f64,
    /// Median host time of `async_eval` on it (MLX encoding the step).
    dispatch_ms: f64,
}

/// Greedy decoding of `n` tokens after `ctx`, each step's graph built and
/// queued before the previous token is read (as the serial decoder does).
fn time_decode(model: &Model, ctx: &[u32], n: usize) -> Result<DecodeTiming> {
    let mut caches = model.make_caches();
    mlx_bun::generate::prefill(model, &mut caches, ctx, 2048)?;
    let step = |token: &Array, caches: &mut [Box<dyn mlx_bun::cache::KvCache>]| -> Result<Array> {
        let logits = model.forward(&token.reshape(&[1, 1])?, caches)?;
        Ok(mlx_rs::ops::indexing::argmax_axis(&logits, -1, None)?)
    };
    let mut pending = step(&Array::from_slice(&[200i32], &[1, 1]), &mut caches)?;
    mlx_rs::transforms::async_eval([&pending])?;
    let (mut builds, mut dispatches) = (Vec::new(), Vec::new());
    let t0 = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let next = step(&pending, &mut caches)?;
        let built = t.elapsed();
        mlx_rs::transforms::async_eval([&next])?;
        builds.push(built.as_secs_f64() * 1e3);
        dispatches.push((t.elapsed() - built).as_secs_f64() * 1e3);
        let _ = pending.item_cast::<u32>();
        pending = next;
    }
    let _ = pending.item_cast::<u32>();
    let seconds = t0.elapsed().as_secs_f64();
    builds.sort_by(f64::total_cmp);
    dispatches.sort_by(f64::total_cmp);
    Ok(DecodeTiming {
        tokens_per_second: n as f64 / seconds,
        build_ms: builds[builds.len() / 2],
        dispatch_ms: dispatches[dispatches.len() / 2],
    })
}

/// Today's UTC date as YYYY-MM-DD (for report file names).
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (y, m, d) = civil_date(secs);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `(year, month, day)` in UTC of a Unix time (Howard Hinnant's algorithm).
pub fn civil_date(unix_secs: i64) -> (i64, i64, i64) {
    let z = unix_secs.div_euclid(86400) + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}
