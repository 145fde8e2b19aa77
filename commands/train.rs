//! `mlx-bun train`: LoRA fine-tuning (SFT), ORPO preference training and
//! DWQ (`--method dwq`); `mlx-bun train fuse` merges an adapter into the
//! base weights.

mod dwq;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use mlx_bun::evaldb::{EvalDb, StepRow};
use mlx_bun::runtime::{Runtime, RuntimeSpec};
use mlx_bun::tokenizer::Tokenizer;
use mlx_bun::train::config::{LrScheduleConfig, Method, TrainConfig};
use mlx_bun::train::data::{load_splits, RowKind};
use mlx_bun::train::trainer::{train, Event};
use serde_yaml::{Mapping, Value};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    action: Option<Action>,
    #[command(flatten)]
    train: TrainArgs,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Merge an adapter into the base weights and write a new model directory.
    Fuse(FuseArgs),
}

#[derive(clap::Args)]
struct FuseArgs {
    /// Base model directory or Hugging Face repo id (default: the embedded model).
    #[arg(long, short)]
    model: Option<String>,
    /// Adapter directory (adapters.safetensors + adapter_config.json).
    #[arg(long, default_value = "adapters")]
    adapter_path: PathBuf,
    /// Where to write the fused model.
    #[arg(
        long,
        short = 'o',
        visible_alias = "save-path",
        default_value = "fused_model"
    )]
    output: PathBuf,
    /// Write dense weights (dequantize every quantized layer).
    #[arg(long)]
    dequantize: bool,
    /// Upload the fused model to this Hub repo (user/name).
    #[arg(long)]
    upload_repo: Option<String>,
}

/// Training flags. Each one left out falls back to the config file, then to
/// the default.
#[derive(clap::Args)]
struct TrainArgs {
    /// YAML file with training options (mlx-lm's `lora` config keys).
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Model directory or Hugging Face repo id (default: the embedded model).
    #[arg(long, short)]
    model: Option<String>,
    #[command(flatten)]
    compute: crate::model_arg::ComputeArgs,
    /// Directory with train.jsonl, valid.jsonl and optionally test.jsonl.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Training objective: sft (LoRA fine-tuning), orpo (preference pairs) or
    /// dwq (distill the quantization scales and biases of a quantized student
    /// from the full-precision --model).
    #[arg(long, value_parser = ["sft", "lora", "orpo", "dwq"])]
    method: Option<String>,
    /// Where adapters.safetensors and adapter_config.json are written
    /// (dwq: the student model folder).
    #[arg(long, visible_alias = "mlx-path")]
    adapter_path: Option<PathBuf>,
    /// Start from these adapter weights.
    #[arg(long)]
    resume_adapter_file: Option<PathBuf>,
    /// Adapt the last N blocks (-1: all). Default 16.
    #[arg(long, allow_negative_numbers = true)]
    num_layers: Option<i64>,
    /// LoRA rank. Default 8.
    #[arg(long)]
    lora_rank: Option<usize>,
    /// LoRA scale (the update is scale·x·A·B). Default 20.
    #[arg(long, conflicts_with = "lora_alpha")]
    lora_scale: Option<f32>,
    /// LoRA alpha; sets scale = alpha / rank.
    #[arg(long)]
    lora_alpha: Option<f32>,
    /// Dropout on the adapter input.
    #[arg(long)]
    lora_dropout: Option<f32>,
    /// Layers to adapt, comma-separated, by mlx-lm's names (e.g.
    /// self_attn.q_proj,self_attn.v_proj; Phi-3: self_attn.qkv_proj; MoE
    /// experts: mlp.switch_mlp.gate_proj). Default: every linear layer of the
    /// block and every expert projection, as mlx-lm.
    #[arg(long, value_delimiter = ',')]
    lora_keys: Option<Vec<String>>,
    #[arg(long)]
    batch_size: Option<usize>,
    /// Training iterations.
    #[arg(long)]
    iters: Option<usize>,
    #[arg(long)]
    learning_rate: Option<f64>,
    /// adam, adamw or sgd.
    #[arg(long, value_parser = ["adam", "adamw", "sgd"])]
    optimizer: Option<String>,
    /// Weight decay of adamw / sgd.
    #[arg(long)]
    weight_decay: Option<f32>,
    /// Learning-rate schedule after warmup: constant, cosine or linear (decays to --min-lr over the run).
    #[arg(long, value_parser = ["constant", "cosine", "linear"])]
    lr_schedule: Option<String>,
    /// Linear warmup steps.
    #[arg(long)]
    warmup: Option<usize>,
    /// Learning rate at the start of the warmup.
    #[arg(long, value_parser = crate::validate::non_negative_f64)]
    warmup_init: Option<f64>,
    /// Final learning rate of a cosine or linear schedule.
    #[arg(long, value_parser = crate::validate::non_negative_f64)]
    min_lr: Option<f64>,
    /// Accumulate gradients over this many batches per update.
    #[arg(long)]
    grad_accumulation_steps: Option<usize>,
    /// Clip the global gradient norm to this value.
    #[arg(long)]
    grad_clip: Option<f32>,
    /// Recompute each adapted layer's activations in the backward pass.
    #[arg(long)]
    grad_checkpoint: bool,
    #[arg(long)]
    seed: Option<u64>,
    /// SFT: supervise only the completion (the last message).
    #[arg(long)]
    mask_prompt: bool,
    #[arg(long)]
    max_seq_length: Option<usize>,
    /// Validate every N steps.
    #[arg(long)]
    steps_per_eval: Option<usize>,
    /// Validation batches per evaluation (-1: the whole set).
    #[arg(long, allow_negative_numbers = true)]
    val_batches: Option<i64>,
    /// Save a checkpoint every N steps.
    #[arg(long)]
    save_every: Option<usize>,
    /// Evaluate on test.jsonl after training.
    #[arg(long)]
    test: bool,
    #[arg(long, allow_negative_numbers = true)]
    test_batches: Option<i64>,
    /// ORPO: weight λ of the odds-ratio term. Default 0.1.
    #[arg(long)]
    orpo_lambda: Option<f64>,
    /// ORPO: NLL over prompt+chosen (full, default) or the chosen response only.
    #[arg(long, value_parser = ["full", "response"])]
    sft_scope: Option<String>,
    /// Token rows per output-head chunk in the loss.
    #[arg(long)]
    loss_chunk_tokens: Option<usize>,
    /// Eval database (default: $MLX_BUN_EVAL_DB, else <XDG data dir>/mlx-bun/evals.db).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Do not record the run in the eval database.
    #[arg(long)]
    no_db: bool,
    /// Print one JSON object per step (and per evaluation) on stdout.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    dwq: dwq::DwqArgs,
}

pub fn run(args: Args) -> Result<()> {
    match args.action {
        Some(Action::Fuse(f)) => fuse(f),
        None if args.train.method.as_deref() == Some("dwq") => dwq::run(args.train),
        None => run_training(args.train),
    }
}

fn fuse(args: FuseArgs) -> Result<()> {
    let model_dir = crate::model_arg::resolve(args.model.as_deref())?;
    let report = mlx_bun::train::fuse::fuse(
        &model_dir,
        &args.adapter_path,
        &args.output,
        args.dequantize,
    )?;
    eprintln!(
        "fused {} adapted layers into {}{}",
        report.fused_layers,
        report.output.display(),
        if report.dequantized {
            " (dequantized)"
        } else {
            ""
        }
    );
    if let Some(repo) = &args.upload_repo {
        crate::upload::upload_with_progress(&report.output, repo, false)?;
    }
    Ok(())
}

/// The flags that were given, as config keys.
fn overrides(a: &TrainArgs) -> Mapping {
    let mut m = Mapping::new();
    let mut set = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            m.insert(k.into(), v);
        }
    };
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| Value::from(p.display().to_string()));
    set("model", a.model.clone().map(Value::from));
    set("data", path(&a.data));
    set("method", a.method.clone().map(Value::from));
    set("adapter_path", path(&a.adapter_path));
    set("resume_adapter_file", path(&a.resume_adapter_file));
    set("num_layers", a.num_layers.map(Value::from));
    set("batch_size", a.batch_size.map(|v| Value::from(v as u64)));
    set("iters", a.iters.map(|v| Value::from(v as u64)));
    set("learning_rate", a.learning_rate.map(Value::from));
    set("optimizer", a.optimizer.clone().map(Value::from));
    set(
        "grad_accumulation_steps",
        a.grad_accumulation_steps.map(|v| Value::from(v as u64)),
    );
    set("grad_clip", a.grad_clip.map(|v| Value::from(v as f64)));
    set(
        "grad_checkpoint",
        a.grad_checkpoint.then_some(Value::from(true)),
    );
    set("seed", a.seed.map(Value::from));
    set("mask_prompt", a.mask_prompt.then_some(Value::from(true)));
    set(
        "max_seq_length",
        a.max_seq_length.map(|v| Value::from(v as u64)),
    );
    set(
        "steps_per_eval",
        a.steps_per_eval.map(|v| Value::from(v as u64)),
    );
    set("val_batches", a.val_batches.map(Value::from));
    set("save_every", a.save_every.map(|v| Value::from(v as u64)));
    set("test", a.test.then_some(Value::from(true)));
    set("test_batches", a.test_batches.map(Value::from));
    set("orpo_lambda", a.orpo_lambda.map(Value::from));
    set("sft_scope", a.sft_scope.clone().map(Value::from));
    set(
        "loss_chunk_tokens",
        a.loss_chunk_tokens.map(|v| Value::from(v as u64)),
    );
    set("db", path(&a.db));

    let mut lora = Mapping::new();
    if let Some(r) = a.lora_rank {
        lora.insert("rank".into(), Value::from(r as u64));
    }
    if let Some(s) = a.lora_scale {
        lora.insert("scale".into(), Value::from(s as f64));
    }
    if let Some(d) = a.lora_dropout {
        lora.insert("dropout".into(), Value::from(d as f64));
    }
    if let Some(keys) = &a.lora_keys {
        let keys: Vec<Value> = keys.iter().map(|k| Value::from(k.trim())).collect();
        lora.insert("keys".into(), Value::Sequence(keys));
    }
    if !lora.is_empty() {
        m.insert("lora_parameters".into(), Value::Mapping(lora));
    }
    if let Some(wd) = a.weight_decay {
        let name = a.optimizer.clone().unwrap_or_else(|| "adamw".into());
        let mut settings = Mapping::new();
        settings.insert("weight_decay".into(), Value::from(wd as f64));
        let mut by_name = Mapping::new();
        by_name.insert(name.into(), Value::Mapping(settings));
        m.insert("optimizer_config".into(), Value::Mapping(by_name));
    }
    m
}

/// Applies the flags that depend on other resolved options.
fn finish_config(cfg: &mut TrainConfig, a: &TrainArgs) -> Result<()> {
    if let Some(alpha) = a.lora_alpha {
        cfg.lora_parameters.scale = alpha / cfg.lora_parameters.rank as f32;
    }
    if a.lr_schedule.is_some() || a.warmup.is_some() {
        let warmup = a.warmup.unwrap_or(0);
        let end = a.min_lr.unwrap_or(0.0);
        let lr = cfg.learning_rate;
        let decay_steps = cfg.iters.saturating_sub(warmup).max(1) as f64;
        let (name, arguments) = match a.lr_schedule.as_deref().unwrap_or("constant") {
            "cosine" => ("cosine_decay", vec![lr, decay_steps, end]),
            "linear" => ("linear_schedule", vec![lr, end, decay_steps]),
            _ => ("constant", vec![lr]),
        };
        cfg.lr_schedule = Some(LrScheduleConfig {
            name: name.into(),
            arguments,
            warmup,
            warmup_init: a.warmup_init.unwrap_or(0.0),
        });
    }
    cfg.validate()
}

fn run_training(a: TrainArgs) -> Result<()> {
    let mut cfg = TrainConfig::layered(a.config.as_deref(), overrides(&a))?;
    finish_config(&mut cfg, &a)?;
    let data = cfg
        .data
        .clone()
        .context("--data is required (a directory with train.jsonl and valid.jsonl)")?;
    let model_dir = crate::model_arg::resolve(cfg.model.as_deref())?;
    let tok = Tokenizer::load(&model_dir)?;
    let kind = match cfg.method {
        Method::Sft => RowKind::Sft {
            mask_prompt: cfg.mask_prompt,
        },
        Method::Orpo => RowKind::Preference,
    };
    let splits = load_splits(&data, &tok, kind)?;
    if !a.json {
        eprintln!("loading {}", model_dir.display());
    }
    let runtime = Runtime::assemble(&RuntimeSpec::new(model_dir.clone(), a.compute.dtype), tok)?;
    let model = runtime.model;
    if splits.valid.is_none() && !a.json {
        eprintln!("warning: no valid.jsonl: training without validation");
    }

    let db = if a.no_db {
        None
    } else {
        let path = cfg.db.clone().unwrap_or_else(mlx_bun::evaldb::default_path);
        Some(EvalDb::open(&path)?)
    };
    let method_name = match cfg.method {
        Method::Sft => "sft",
        Method::Orpo => "orpo",
    };
    let config_json = serde_json::to_value(&cfg)?;
    let run_id = match &db {
        Some(db) => {
            Some(db.start_run(method_name, &model_dir.display().to_string(), &config_json)?)
        }
        None => None,
    };

    let bar = crate::progress::bar(
        "{prefix} [{bar:30}] {pos}/{len} {msg}",
        cfg.iters as u64,
        !a.json,
    );
    bar.set_prefix(method_name);
    let mut stdout = std::io::stdout();
    let mut on_event = |event: Event| -> Result<()> {
        match event {
            Event::Start {
                trainable_params,
                adapted_layers,
                train_examples,
            } => {
                if !a.json {
                    bar.println(format!(
                        "trainable parameters: {:.3}M in {adapted_layers} layers; {train_examples} training examples",
                        trainable_params as f64 / 1e6
                    ));
                }
            }
            Event::Step(r) => {
                let mut line = serde_json::to_value(r)?;
                line["event"] = "step".into();
                if let (Some(db), Some(run)) = (&db, run_id) {
                    db.record_step(
                        run,
                        &StepRow {
                            iter: r.iter as i64,
                            loss: r.loss as f64,
                            tokens: r.tokens as i64,
                            seconds: r.step_seconds,
                            tokens_per_sec: r.tokens_per_sec,
                            learning_rate: r.learning_rate,
                            peak_memory_bytes: r.peak_memory_bytes as i64,
                            metrics: line.clone(),
                        },
                    )?;
                }
                if a.json {
                    writeln!(stdout, "{line}")?;
                    stdout.flush()?;
                }
                let extra = match &r.orpo {
                    Some(o) => format!(
                        " nll {:.3} or {:.3} log-odds {:+.3}",
                        o.nll, o.or, o.log_odds
                    ),
                    None => String::new(),
                };
                bar.set_message(format!(
                    "loss {:.3}{extra} | {:.1} tok/s | peak {:.2} GB",
                    r.loss,
                    r.tokens_per_sec,
                    r.peak_memory_bytes as f64 / 1e9
                ));
                bar.inc(1);
            }
            Event::Eval(r) => {
                let mut line = serde_json::to_value(r)?;
                line["event"] = "eval".into();
                if let (Some(db), Some(run)) = (&db, run_id) {
                    db.record_eval(run, r.iter as i64, r.split, r.loss as f64, r.seconds, &line)?;
                }
                if a.json {
                    writeln!(stdout, "{line}")?;
                    stdout.flush()?;
                } else {
                    let extra = match &r.orpo {
                        Some(o) => format!(
                            " (chosen logp {:.3}, rejected logp {:.3}, log-odds {:+.3})",
                            o.chosen_logp, o.rejected_logp, o.log_odds
                        ),
                        None => String::new(),
                    };
                    bar.println(format!(
                        "iter {}: {} loss {:.3}{extra}, {:.1}s",
                        r.iter, r.split, r.loss, r.seconds
                    ));
                }
            }
            Event::Saved(path) => {
                if !a.json {
                    bar.println(format!("saved {}", path.display()));
                }
            }
        }
        Ok(())
    };
    let result = train(model, &splits, &cfg, &mut on_event);
    bar.finish_and_clear();
    match result {
        Ok((_, summary)) => {
            let summary_json = serde_json::to_value(&summary)?;
            if let (Some(db), Some(run)) = (&db, run_id) {
                db.finish_run(run, "done", &summary_json)?;
            }
            if a.json {
                let mut line = summary_json;
                line["event"] = "done".into();
                if let Some(run) = run_id {
                    line["run_id"] = run.into();
                }
                writeln!(std::io::stdout(), "{line}")?;
            } else {
                eprintln!(
                    "done: {} iterations, {} tokens in {:.1}s, peak memory {:.2} GB; adapters in {}",
                    summary.iters,
                    summary.tokens,
                    summary.seconds,
                    summary.peak_memory_bytes as f64 / 1e9,
                    cfg.adapter_path.display()
                );
            }
            Ok(())
        }
        Err(e) => {
            if let (Some(db), Some(run)) = (&db, run_id) {
                let _ = db.finish_run(
                    run,
                    "failed",
                    &serde_json::json!({"error": format!("{e:#}")}),
                );
            }
            Err(e)
        }
    }
}
