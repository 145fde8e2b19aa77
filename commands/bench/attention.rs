//! `mlx-bun bench attention`: mlx-bun's CUDA decode attention kernel (RoPE,
//! the cache write and the attention of one new token in one launch)
//! against MLX's nodes for the same step (two RoPEs, two cache writes, the
//! attention), on random heads and caches. Reports the largest difference
//! and the time per layer.

use std::io::Write;

use anyhow::{bail, Context, Result};
use mlx_bun::kernels::cuda;
use mlx_bun::kernels::cuda_attention::{self, DecodeAttention};
use mlx_bun::kernels::RopeParams;
use mlx_rs::fast::{rope, scaled_dot_product_attention};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::eval;
use mlx_rs::{Array, Dtype};

use super::qmv::time_products;

#[derive(clap::Args)]
pub struct Args {
    /// Heads as QUERYxKEY/VALUE:HEAD_DIM (Llama 3 8B's by default).
    #[arg(long, value_delimiter = ',', default_value = "32x8:128")]
    heads: Vec<String>,
    /// Positions already in the cache.
    #[arg(long, value_delimiter = ',', default_value = "0,17,255,1000")]
    context: Vec<i32>,
    /// Activation dtype: bfloat16 or float16.
    #[arg(long, default_value = "bfloat16")]
    dtype: String,
    /// Layers per timed graph (one evaluation launches them all).
    #[arg(long, default_value_t = 200, value_parser = crate::validate::at_least_one)]
    batch: usize,
    #[arg(long, default_value_t = 5, value_parser = crate::validate::at_least_one)]
    runs: usize,
    #[arg(long)]
    json: bool,
    /// Also check adjacent-pair RoPE and per-pair frequencies, and exit with
    /// an error where the kernel's output or cache write differs from MLX's
    /// beyond the tolerance.
    #[arg(long)]
    check: bool,
}

/// One case: heads, RoPE style and the cache's length.
struct Case {
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    traditional: bool,
    freqs: bool,
    context: i32,
}

const BASE: f32 = 500000.0;

pub fn run(args: Args) -> Result<()> {
    if !mlx_bun::mlx_ext::on_gpu() {
        bail!("bench attention needs a GPU: mlx-bun's CUDA kernels run only there");
    }
    let dtype = mlx_bun::mlx_ext::parse_dtype(&args.dtype)
        .with_context(|| format!("unknown --dtype {:?}", args.dtype))?;
    cuda::set_everywhere();
    let mut cases = Vec::new();
    for spec in &args.heads {
        let (heads, kv_heads, head_dim) = parse_heads(spec)?;
        for &context in &args.context {
            let styles: &[(bool, bool)] = if args.check {
                &[(false, false), (true, false), (false, true)]
            } else {
                &[(false, false)]
            };
            for &(traditional, freqs) in styles {
                if traditional && head_dim < 128 {
                    continue;
                }
                cases.push(Case {
                    heads,
                    kv_heads,
                    head_dim,
                    traditional,
                    freqs,
                    context,
                });
            }
        }
    }
    let mut out = std::io::stdout();
    if !args.json {
        writeln!(
            out,
            "{:>10} {:>8} {:>7} {:>10} {:>10} {:>8} {:>10} {:>10}",
            "heads", "context", "rope", "mlx us", "ours us", "speedup", "out diff", "cache diff"
        )?;
    }
    let mut failures = Vec::new();
    for case in &cases {
        let result = run_case(case, dtype, &args)?;
        let style = match (case.traditional, case.freqs) {
            (true, _) => "pairs",
            (_, true) => "freqs",
            _ => "halves",
        };
        let name = format!("{}x{}:{}", case.heads, case.kv_heads, case.head_dim);
        // Outputs are rounded to the activation type; the kernel sums in
        // another order than MLX's attention.
        if result.out_diff.is_nan() || result.out_diff > 2e-2 || result.cache_diff > 1e-2 {
            failures.push(format!(
                "{name} context {} {style}: output {:.2e}, cache {:.2e}",
                case.context, result.out_diff, result.cache_diff
            ));
        }
        if args.json {
            writeln!(
                out,
                "{}",
                serde_json::json!({
                    "heads": name, "context": case.context, "rope": style,
                    "dtype": args.dtype, "mlx_us": result.mlx_us, "ours_us": result.ours_us,
                    "speedup": result.mlx_us / result.ours_us,
                    "max_rel_diff": result.out_diff, "cache_rel_diff": result.cache_diff,
                    "mlx_build_us": result.mlx_build_us, "ours_build_us": result.ours_build_us,
                })
            )?;
        } else {
            writeln!(
                out,
                "{name:>10} {:>8} {style:>7} {:>10.2} {:>10.2} {:>7.2}x {:>10.2e} {:>10.2e}",
                case.context,
                result.mlx_us,
                result.ours_us,
                result.mlx_us / result.ours_us,
                result.out_diff,
                result.cache_diff
            )?;
        }
    }
    if args.check && !failures.is_empty() {
        bail!(
            "the decode attention kernel differs from MLX's: {}",
            failures.join("; ")
        );
    }
    Ok(())
}

fn parse_heads(spec: &str) -> Result<(i32, i32, i32)> {
    let parsed = (|| {
        let (heads, dim) = spec.split_once(':')?;
        let (q, kv) = heads.split_once('x')?;
        Some((q.parse().ok()?, kv.parse().ok()?, dim.parse().ok()?))
    })();
    match parsed {
        Some((q, kv, d)) if q > 0 && kv > 0 && q % kv == 0 && d > 0 => Ok((q, kv, d)),
        _ => bail!("--heads {spec:?}: expected QUERYxKEY/VALUE:HEAD_DIM, query heads a multiple of key heads"),
    }
}

struct CaseResult {
    mlx_us: f64,
    ours_us: f64,
    mlx_build_us: f64,
    ours_build_us: f64,
    /// Largest difference of the outputs, relative to the largest output.
    out_diff: f32,
    /// Largest difference of the written key and value rows, relative.
    cache_diff: f32,
}

fn random(shape: &[i32], dtype: Dtype) -> Result<Array> {
    Ok(mlx_rs::random::normal::<f32>(shape, None, None, None)?.as_dtype(dtype)?)
}

fn relative_diff(a: &Array, b: &Array) -> Result<f32> {
    let (a, b) = (a.as_dtype(Dtype::Float32)?, b.as_dtype(Dtype::Float32)?);
    let diff = a.subtract(&b)?.abs()?.max(None)?.item_cast::<f32>();
    let scale = b.abs()?.max(None)?.item_cast::<f32>();
    Ok(diff / scale.max(f32::MIN_POSITIVE))
}

fn run_case(case: &Case, dtype: Dtype, args: &Args) -> Result<CaseResult> {
    let (h, kvh, d, pos) = (case.heads, case.kv_heads, case.head_dim, case.context);
    let capacity = (pos + 256) / 256 * 256;
    let q = random(&[1, h, 1, d], dtype)?;
    let k = random(&[1, kvh, 1, d], dtype)?;
    let v = random(&[1, kvh, 1, d], dtype)?;
    let keys = random(&[1, kvh, capacity, d], dtype)?;
    let values = random(&[1, kvh, capacity, d], dtype)?;
    // Llama 3's frequencies are the base's, scaled; any positive ones do.
    let freqs = Array::from_iter(
        (0..d / 2).map(|i| BASE.powf(2.0 * i as f32 / d as f32) * (1.0 + (i % 3) as f32)),
        &[d / 2],
    );
    eval([&q, &k, &v, &keys, &values, &freqs])?;
    let params = RopeParams {
        dims: d,
        traditional: case.traditional,
        base: (!case.freqs).then_some(BASE),
        scale: 1.0,
        freqs: case.freqs.then_some(&freqs),
    };
    let scale = (d as f32).powf(-0.5);
    let layout = DecodeAttention {
        heads: h,
        kv_heads: kvh,
        head_dim: d,
        scale,
        rope: params,
    };
    if !cuda_attention::applies(&q, &layout) {
        bail!("the decode attention kernel does not take {h}x{kvh}:{d}");
    }
    let rotated = |x: &Array| -> Result<Array> {
        Ok(rope(
            x,
            d,
            case.traditional,
            params.base,
            1.0,
            pos,
            params.freqs,
        )?)
    };
    let mlx_step = |keys: &Array, values: &Array| -> Result<(Array, Array, Array)> {
        let (qr, kr) = (rotated(&q)?, rotated(&k)?);
        let keys = mlx_bun::mlx_ext::slice_update(keys, &kr, &[0, 0, pos, 0])?;
        let values = mlx_bun::mlx_ext::slice_update(values, &v, &[0, 0, pos, 0])?;
        let live = |a: &Array| a.index((.., .., ..pos + 1, ..));
        let out = scaled_dot_product_attention(&qr, live(&keys), live(&values), scale, None, None)?;
        let out = out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[1, 1, h * d])?;
        Ok((out, keys, values))
    };
    let (reference, ref_keys, ref_values) = mlx_step(&keys, &values)?;
    // The kernel writes into its own copy of the buffers (of their dtype: a
    // float32 one would promote them).
    let one = Array::from_f32(1.0).as_dtype(dtype)?;
    let (our_keys, our_values) = (keys.multiply(&one)?, values.multiply(&one)?);
    eval([&reference, &ref_keys, &ref_values, &our_keys, &our_values])?;
    let ours =
        cuda_attention::decode_attention([&q, &k, &v], [&our_keys, &our_values], pos, &layout)?;
    eval([&ours])?;
    let out_diff = relative_diff(&ours, &reference)?;
    let cache_diff =
        relative_diff(&our_keys, &ref_keys)?.max(relative_diff(&our_values, &ref_values)?);

    // Each step writes into the buffers the step before it returned, as a
    // cache does (MLX donates them instead of copying).
    let chain = std::cell::RefCell::new((keys.clone(), values.clone()));
    let mlx = time_products(args.batch, args.runs, |_| {
        let (keys, values) = chain.borrow().clone();
        let (out, keys, values) = mlx_step(&keys, &values)?;
        *chain.borrow_mut() = (keys, values);
        Ok(out)
    })?;
    drop(chain);
    let ours_timing = time_products(args.batch, args.runs, |_| {
        cuda_attention::decode_attention([&q, &k, &v], [&our_keys, &our_values], pos, &layout)
    })?;
    Ok(CaseResult {
        mlx_us: mlx.run_us,
        ours_us: ours_timing.run_us,
        mlx_build_us: mlx.build_us,
        ours_build_us: ours_timing.build_us,
        out_diff,
        cache_diff,
    })
}
