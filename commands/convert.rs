//! `mlx-bun convert`: a GGUF file into an mlx-lm model directory, or an
//! mlx-lm directory into a quantized or re-typed copy.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use mlx_bun::convert::{self, output::Commit, ConvertOptions};
use mlx_bun::mlx_ext::parse_dtype;
use mlx_bun::model::layers::QuantSpec;

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("source").required(true))]
pub struct Args {
    /// A GGUF file to convert (LLaMA architecture; Q4_0, Q4_1, Q8_0, F16, F32 tensors).
    #[arg(long, group = "source")]
    gguf: Option<PathBuf>,
    /// An mlx-lm model directory to quantize (-q) or cast (--dtype).
    #[arg(long, short, group = "source")]
    model: Option<PathBuf>,
    /// The directory to create; it must not exist yet.
    #[arg(long, short, visible_alias = "mlx-path")]
    output: PathBuf,
    /// Dtype of norms, scales, biases and dense weights: float32, bfloat16 or float16.
    #[arg(long, default_value = "float32")]
    dtype: String,
    /// Store every quantized layer as a dense weight in --dtype.
    #[arg(long, short, conflicts_with = "quantize")]
    dequantize: bool,
    /// Quantize every linear layer and the embedding (quantized ones are dequantized first).
    #[arg(long, short = 'q')]
    quantize: bool,
    /// Bits per weight for -q.
    #[arg(long, default_value_t = 4)]
    q_bits: i32,
    /// Weights per quantization group for -q.
    #[arg(long, default_value_t = 64)]
    q_group_size: i32,
}

pub fn run(args: Args) -> Result<()> {
    let dtype = parse_dtype(&args.dtype).with_context(|| {
        format!(
            "unknown --dtype {:?} (choose float32, bfloat16 or float16)",
            args.dtype
        )
    })?;
    convert::output::require_absent(&args.output)?;
    let opts = ConvertOptions {
        output: args.output.clone(),
        dtype,
        dequantize: args.dequantize,
        quantize: args.quantize.then_some(QuantSpec {
            group_size: args.q_group_size,
            bits: args.q_bits,
        }),
        progress: true,
    };
    let summary = match (&args.gguf, &args.model) {
        (Some(gguf), _) => convert::from_gguf(gguf, &opts)?,
        (None, Some(model)) => convert::from_model_dir(model, &opts)?,
        (None, None) => bail!("give --gguf FILE or --model DIR"),
    };
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
        args.dtype,
        quantization
    );
    Ok(())
}
