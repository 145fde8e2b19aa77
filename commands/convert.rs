//! `mlx-bun convert`: a Hugging Face checkpoint (local folder or Hub repo id)
//! or an mlx-lm folder into an mlx-lm model folder (as `mlx_lm.convert`),
//! or a GGUF file into one.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use mlx_bun::convert::hf::{self, HfOptions, MixedRecipe, QuantRecipe};
use mlx_bun::convert::output::Commit;
use mlx_bun::convert::{self, ConvertOptions};
use mlx_bun::mlx_ext::parse_dtype;
use mlx_bun::quant::{QuantMode, QuantSpec};

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("source").required(true))]
pub struct Args {
    /// A Hugging Face model: a local folder (Hugging Face or mlx-lm layout) or a Hub repo id.
    #[arg(long, short = 'm', visible_alias = "model", group = "source")]
    hf_path: Option<String>,
    /// A GGUF file to convert (LLaMA architecture; Q4_0, Q4_1, Q8_0, F16, F32 tensors).
    #[arg(long, group = "source")]
    gguf: Option<PathBuf>,
    /// The directory to create; it must not exist yet.
    #[arg(
        long,
        short = 'o',
        visible_alias = "output",
        default_value = "mlx_model"
    )]
    mlx_path: PathBuf,
    /// Dtype of the floating tensors: float32, bfloat16 or float16 (default: config.json's
    /// torch_dtype; float32 for GGUF).
    #[arg(long)]
    dtype: Option<String>,
    /// Store every quantized layer as a dense weight.
    #[arg(long, short, conflicts_with = "quantize")]
    dequantize: bool,
    /// Quantize every linear layer and the embedding.
    #[arg(long, short = 'q')]
    quantize: bool,
    /// Bits per weight for -q (default: 4; 8 for mxfp8).
    #[arg(long)]
    q_bits: Option<i32>,
    /// Weights per quantization group for -q (default: 64 affine, 32 mxfp4/mxfp8, 16 nvfp4).
    #[arg(long)]
    q_group_size: Option<i32>,
    /// Quantization mode for -q.
    #[arg(long, default_value = "affine", value_parser = ["affine", "mxfp4", "nvfp4", "mxfp8"])]
    q_mode: String,
    /// Mixed-bit recipe for -q (more bits for some v_proj/down_proj layers and lm_head).
    #[arg(long, value_parser = ["mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6"])]
    quant_predicate: Option<String>,
    /// Upload the result to this Hub repo (user/name) once converted.
    #[arg(long)]
    upload_repo: Option<String>,
    #[command(flatten)]
    dynamic: DynamicArgs,
}

/// Dynamic quantization (as `mlx_lm.dynamic_quant`): per-layer bit widths
/// chosen from sensitivities on calibration text to meet --target-bpw.
#[derive(clap::Args)]
struct DynamicArgs {
    /// Quantize each layer to --low-bits or --high-bits, by its sensitivity on
    /// calibration text, so that the model averages at most this many bits per weight.
    #[arg(long, conflicts_with_all = ["quantize", "dequantize", "gguf", "quant_predicate", "q_bits", "q_group_size"])]
    target_bpw: Option<f64>,
    /// Bits of the less sensitive layers (--target-bpw).
    #[arg(long, default_value_t = 4, requires = "target_bpw")]
    low_bits: i32,
    /// Group size of the less sensitive layers (--target-bpw).
    #[arg(long, default_value_t = 64, requires = "target_bpw")]
    low_group_size: i32,
    /// Bits of the more sensitive layers (--target-bpw).
    #[arg(long, default_value_t = 5, requires = "target_bpw")]
    high_bits: i32,
    /// Group size of the more sensitive layers (--target-bpw).
    #[arg(long, default_value_t = 64, requires = "target_bpw")]
    high_group_size: i32,
    /// Calibration text for --target-bpw: a text or JSONL file, or a folder of them
    /// (default: mlx-lm's ~/.cache/mlx-lm/calibration_v5.txt when present).
    #[arg(long, requires = "target_bpw")]
    data: Option<String>,
    /// Read pre-computed sensitivities (mlx-lm's JSON list) instead of estimating them.
    #[arg(long, requires = "target_bpw")]
    sensitivities: Option<PathBuf>,
    /// Where estimated sensitivities are saved (default: <model>_sensitivities.json
    /// in the current folder, as mlx-lm names it).
    #[arg(long, requires = "target_bpw", conflicts_with = "sensitivities")]
    save_sensitivities: Option<PathBuf>,
    /// Seed of the calibration rows' shuffle.
    #[arg(long, default_value_t = 123, requires = "target_bpw")]
    seed: u64,
    /// Tokens per calibration row.
    #[arg(long, default_value_t = 512, requires = "target_bpw")]
    sequence_length: usize,
    /// Calibration rows to use (default: all of the text).
    #[arg(long, requires = "target_bpw")]
    num_samples: Option<usize>,
    /// Calibration rows per gradient batch.
    #[arg(long, default_value_t = 4, requires = "target_bpw")]
    batch_size: usize,
    /// Dtype the sensitivity gradients are summed in.
    #[arg(long, default_value = "float32", value_parser = ["float32", "bfloat16"], requires = "target_bpw")]
    accumulation_dtype: String,
}

fn parse_dtype_flag(name: &str) -> Result<mlx_rs::Dtype> {
    parse_dtype(name)
        .filter(|d| mlx_bun::mlx_ext::is_float(*d) && *d != mlx_rs::Dtype::Float64)
        .with_context(|| format!("unknown --dtype {name:?} (choose float32, bfloat16 or float16)"))
}

pub fn run(args: Args) -> Result<()> {
    let dtype = args.dtype.as_deref().map(parse_dtype_flag).transpose()?;
    if let Some(repo) = &args.upload_repo {
        mlx_bun::upload::validate_repo_id(repo)?;
    }
    let output = match (&args.gguf, &args.hf_path) {
        (None, Some(spec)) if args.dynamic.target_bpw.is_some() => run_dynamic(&args, spec, dtype)?,
        (Some(gguf), _) => run_gguf(&args, gguf, dtype)?,
        (None, Some(spec)) => run_hf(&args, spec, dtype)?,
        (None, None) => bail!("give --hf-path MODEL or --gguf FILE"),
    };
    if let Some(repo) = &args.upload_repo {
        crate::upload::upload_with_progress(&output, repo, false)?;
    }
    Ok(())
}

fn run_gguf(args: &Args, gguf: &std::path::Path, dtype: Option<mlx_rs::Dtype>) -> Result<PathBuf> {
    if args.q_mode != "affine" || args.quant_predicate.is_some() {
        bail!("--q-mode and --quant-predicate apply to Hugging Face checkpoints; convert the GGUF first, then quantize the result");
    }
    convert::output::require_absent(&args.mlx_path)?;
    let dtype = dtype.unwrap_or(mlx_rs::Dtype::Float32);
    let opts = ConvertOptions {
        output: args.mlx_path.clone(),
        dtype,
        dequantize: args.dequantize,
        quantize: args.quantize.then_some(QuantSpec::affine(
            args.q_group_size.unwrap_or(64),
            args.q_bits.unwrap_or(4),
        )),
    };
    let bar = crate::progress::tensor_bar("converting");
    let summary = convert::from_gguf(gguf, &opts, &mut |e| crate::progress::advance(&bar, e))?;
    bar.finish_and_clear();
    if summary.commit == Commit::AlreadyThere {
        bail!(
            "{} appeared while converting; the new copy was discarded",
            summary.output.display()
        );
    }
    let quantization = match &summary.quantization {
        Some(q) => format!(
            "quantized ({} bits, group {} by default)",
            q["bits"], q["group_size"]
        ),
        None => "not quantized".to_string(),
    };
    eprintln!(
        "wrote {}: {} tensors, {:.1} MB, {}, {}",
        summary.output.display(),
        summary.tensors,
        summary.bytes as f64 / 1e6,
        mlx_bun::mlx_ext::dtype_name(dtype),
        quantization
    );
    Ok(summary.output)
}

fn run_hf(args: &Args, spec: &str, dtype: Option<mlx_rs::Dtype>) -> Result<PathBuf> {
    let quantize = if args.quantize {
        Some(QuantRecipe {
            mode: QuantMode::parse(&args.q_mode)?,
            group_size: args.q_group_size,
            bits: args.q_bits,
            mixed: args
                .quant_predicate
                .as_deref()
                .map(MixedRecipe::parse)
                .transpose()?,
        })
    } else {
        if args.quant_predicate.is_some() || args.q_bits.is_some() || args.q_group_size.is_some() {
            bail!("--q-bits, --q-group-size and --quant-predicate need -q");
        }
        None
    };
    if let Some(q) = &quantize {
        q.validate()?;
    }
    convert::output::require_absent(&args.mlx_path)?;
    let (dir, base_model) = mlx_bun::hub::resolve_source(spec)?;
    let opts = HfOptions {
        output: args.mlx_path.clone(),
        dtype,
        quantize,
        dequantize: args.dequantize,
        base_model,
    };
    let bar = crate::progress::tensor_bar("converting");
    let summary = hf::convert(&dir, &opts, &mut |e| crate::progress::advance(&bar, e))?;
    bar.finish_and_clear();
    if summary.commit == Commit::AlreadyThere {
        bail!(
            "{} appeared while converting; the new copy was discarded",
            summary.output.display()
        );
    }
    let quantization = match &summary.quantization {
        Some(q) => format!(
            "quantized ({} bits, group {}, {} by default), {:.3} bits per weight",
            q["bits"],
            q["group_size"],
            q.get("mode").and_then(|m| m.as_str()).unwrap_or("affine"),
            summary.bits_per_weight
        ),
        None => "not quantized".to_string(),
    };
    eprintln!(
        "wrote {}: {} tensors in {} file(s), {:.1} MB, {} parameters, {}",
        summary.output.display(),
        summary.tensors,
        summary.shards,
        summary.bytes as f64 / 1e6,
        summary.parameters,
        quantization
    );
    Ok(summary.output)
}

fn run_dynamic(args: &Args, spec: &str, dtype: Option<mlx_rs::Dtype>) -> Result<PathBuf> {
    use mlx_bun::convert::dynamic::{self, DynamicOptions, Event};
    let d = &args.dynamic;
    convert::output::require_absent(&args.mlx_path)?;
    let (dir, base_model) = mlx_bun::hub::resolve_source(spec)?;
    let save_sensitivities = match (&d.sensitivities, &d.save_sensitivities) {
        (Some(_), _) => None,
        (None, Some(p)) => Some(p.clone()),
        (None, None) => Some(PathBuf::from(format!(
            "{}_sensitivities.json",
            spec.replace('/', "_")
        ))),
    };
    let opts = DynamicOptions {
        output: args.mlx_path.clone(),
        target_bpw: d.target_bpw.expect("checked by the caller"),
        low: QuantSpec::affine(d.low_group_size, d.low_bits),
        high: QuantSpec::affine(d.high_group_size, d.high_bits),
        data: d.data.clone(),
        sequence_length: d.sequence_length,
        num_samples: d.num_samples,
        batch_size: d.batch_size,
        seed: d.seed,
        sensitivities: d.sensitivities.clone(),
        save_sensitivities: save_sensitivities.clone(),
        accumulation_dtype: parse_dtype_flag(&d.accumulation_dtype)?,
        dtype,
        base_model,
    };
    opts.validate()?;
    let mut phase: Option<indicatif::ProgressBar> = None;
    let tensors = crate::progress::tensor_bar("writing");
    let summary = dynamic::run(&dir, &opts, &mut |e| {
        match e {
            Event::Phase { name, total } => {
                if tensors.length().unwrap_or(0) > 0 && !tensors.is_finished() {
                    tensors.finish_and_clear();
                }
                if let Some(old) = phase.replace(phase_bar(name, total)) {
                    old.finish_and_clear();
                }
            }
            Event::Progress { done } => {
                if let Some(bar) = &phase {
                    bar.set_position(done as u64);
                }
            }
            Event::Convert(e) => {
                if let Some(old) = phase.take() {
                    old.finish_and_clear();
                }
                crate::progress::advance(&tensors, e);
            }
        }
        Ok(())
    });
    if let Some(bar) = phase {
        bar.finish_and_clear();
    }
    tensors.finish_and_clear();
    let summary = summary?;
    if let (None, Some(p)) = (&d.sensitivities, &save_sensitivities) {
        eprintln!(
            "sensitivities of {} rows x {} tokens saved to {} ({:.1} s)",
            summary.rows,
            summary.sequence_length,
            p.display(),
            summary.sensitivity_seconds
        );
    }
    if summary.threshold_raised {
        eprintln!(
            "note: mlx-lm's threshold would exceed the target; raised to the next layer's sensitivity"
        );
    }
    eprintln!(
        "threshold {:.6}: {} layers at {} bits (group {}), {} at {} bits (group {})",
        summary.threshold,
        summary.high_layers.len(),
        d.high_bits,
        d.high_group_size,
        summary.low_layers,
        d.low_bits,
        d.low_group_size
    );
    eprintln!(
        "bits per weight: {:.4} (target {})",
        summary.bits_per_weight, summary.target_bpw
    );
    let predicted = summary
        .predicted_perplexity
        .map_or("n/a (sensitivities from a file)".to_string(), |p| {
            format!("{p:.3}")
        });
    eprintln!(
        "perplexity on the calibration rows: original {:.3}, predicted {predicted}, quantized {:.3}",
        summary.original_perplexity, summary.quantized_perplexity
    );
    eprintln!(
        "wrote {}: {} tensors in {} file(s), {:.1} MB ({:.1} s)",
        summary.output.display(),
        summary.convert.tensors,
        summary.convert.shards,
        summary.convert.bytes as f64 / 1e6,
        summary.seconds
    );
    Ok(summary.output)
}

/// A counting bar for one phase of dynamic quantization.
fn phase_bar(name: &str, total: usize) -> indicatif::ProgressBar {
    let bar = crate::progress::bar(
        "{prefix} [{bar:30}] {pos}/{len} ({elapsed})",
        total as u64,
        true,
    );
    bar.set_prefix(name.to_string());
    bar
}
