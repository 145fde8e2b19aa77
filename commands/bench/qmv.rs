//! `mlx-bun bench qmv`: mlx-bun's CUDA quantized matrix-vector kernel against
//! MLX's `quantized_matmul`, on random weights of a model's layer shapes, in
//! one process. Reports the largest difference, the time per product and the
//! bandwidth reached as a share of the GPU's limit.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use mlx_bun::kernels::cuda;
use mlx_bun::quant::QuantSpec;
use mlx_rs::ops::{quantize, quantized_matmul, sigmoid};
use mlx_rs::transforms::eval;
use mlx_rs::Array;

#[derive(clap::Args)]
pub struct Args {
    /// Layer shapes as OUTxIN (Llama 3 8B's q/o, k/v, gate/up and down by default).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "4096x4096,1024x4096,14336x4096,4096x14336"
    )]
    shapes: Vec<String>,
    /// Rows of activations (1 = single-sequence decode).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    rows: Vec<usize>,
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(4..=8))]
    bits: i32,
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(i32).range(32..=128))]
    group_size: i32,
    /// Activation dtype: bfloat16 or float16 (float32 stays with MLX's kernel).
    #[arg(long, default_value = "bfloat16")]
    dtype: String,
    /// Products per timed graph (one evaluation launches them all).
    #[arg(long, default_value_t = 200, value_parser = crate::validate::at_least_one)]
    batch: usize,
    #[arg(long, default_value_t = 5, value_parser = crate::validate::at_least_one)]
    runs: usize,
    /// The GPU's memory bandwidth in GB/s (H200: 4800).
    #[arg(long, default_value_t = 4800.0)]
    peak_gbps: f64,
    #[arg(long)]
    json: bool,
    /// Time the gated MLP's first half, `silu(x @ gate.T) * (x @ up.T)` with
    /// gate and up of each shape: one fused kernel against MLX's two
    /// products and three elementwise ops.
    #[arg(long)]
    glu: bool,
    /// Exit with an error when the kernel's output differs from MLX's by more
    /// than float tolerance (relative to the largest output).
    #[arg(long)]
    check: bool,
}

pub fn run(args: Args) -> Result<()> {
    if !mlx_bun::mlx_ext::on_gpu() {
        bail!("bench qmv needs a GPU: mlx-bun's CUDA kernel runs only there");
    }
    let dtype = mlx_bun::mlx_ext::parse_dtype(&args.dtype)
        .with_context(|| format!("unknown --dtype {:?}", args.dtype))?;
    let spec = QuantSpec::affine(args.group_size, args.bits);
    cuda::set_everywhere();
    // The fused MLP rounds gate, sigmoid, silu and product to the activation
    // type as MLX does, so a last-bit difference in gate or up can grow to a
    // few units in the last place of the output.
    let tolerance = if args.glu { 2e-2 } else { 1e-2 };
    let mut failures = Vec::new();
    let mut out = std::io::stdout();
    if !args.json {
        writeln!(
            out,
            "{:>12} {:>4} {:>10} {:>10} {:>8} {:>9} {:>9} {:>10} {:>14}",
            "shape",
            "rows",
            "mlx us",
            "ours us",
            "speedup",
            "mlx %bw",
            "ours %bw",
            "max diff",
            "build us/node"
        )?;
    }
    for shape in &args.shapes {
        let (n, k) = parse_shape(shape)?;
        let w = mlx_rs::random::normal::<f32>(&[n, k][..], None, 0.02, None)?.as_dtype(dtype)?;
        let (wq, scales, biases) = quantize(&w, spec.group_size, spec.bits)?;
        eval([&wq, &scales, &biases])?;
        let weight_bytes = wq.nbytes() + scales.nbytes() + biases.nbytes();
        let copies = weight_copies(&wq, &scales, &biases, weight_bytes)?;
        let weight_bytes = if args.glu {
            2 * weight_bytes
        } else {
            weight_bytes
        };
        for &rows in &args.rows {
            let x = mlx_rs::random::normal::<f32>(&[rows as i32, k][..], None, None, None)?
                .as_dtype(dtype)?;
            eval([&x])?;
            if !cuda::applies(&x, &wq, &scales, &biases, spec) {
                bail!("the kernel does not take shape {shape} with {rows} rows");
            }
            // Plain product i reads copy i; fused product i reads copies 2i
            // (gate) and 2i + 1 (up), so no two products in a row share one.
            let gate_copy = |i: usize| (if args.glu { 2 * i } else { i }) % copies.len();
            let up_copy = |i: usize| (2 * i + 1) % copies.len();
            let mlx_product = |i: usize| -> Result<Array> {
                let (wq, scales, biases) = &copies[gate_copy(i)];
                let gate =
                    quantized_matmul(&x, wq, scales, biases, true, spec.group_size, spec.bits)?;
                if !args.glu {
                    return Ok(gate);
                }
                let (wu, su, bu) = &copies[up_copy(i)];
                let up = quantized_matmul(&x, wu, su, bu, true, spec.group_size, spec.bits)?;
                Ok(&(&gate * &sigmoid(&gate)?) * &up)
            };
            let our_product = |i: usize| -> Result<Array> {
                let (wq, scales, biases) = &copies[gate_copy(i)];
                if !args.glu {
                    return cuda::quantized_matvec(&x, wq, scales, biases, spec);
                }
                let (wu, su, bu) = &copies[up_copy(i)];
                cuda::quantized_silu_glu(&x, [wq, scales, biases], [wu, su, bu], spec, None)?
                    .context("the fused kernel does not apply")
            };
            let reference = mlx_product(0)?;
            let ours = our_product(0)?;
            eval([&reference, &ours])?;
            let diff = reference
                .as_dtype(mlx_rs::Dtype::Float32)?
                .subtract(&ours.as_dtype(mlx_rs::Dtype::Float32)?)?
                .abs()?
                .max(None)?
                .item_cast::<f32>();
            let scale = reference
                .as_dtype(mlx_rs::Dtype::Float32)?
                .abs()?
                .max(None)?
                .item_cast::<f32>();
            let mlx = time_products(args.batch, args.runs, mlx_product)?;
            let ours = time_products(args.batch, args.runs, our_product)?;
            let (mlx_us, ours_us) = (mlx.run_us, ours.run_us);
            let bytes = (weight_bytes + x.nbytes() + x.nbytes() / k as usize * n as usize) as f64;
            let pct = |us: f64| bytes / (us * 1e-6) / (args.peak_gbps * 1e9) * 100.0;
            let rel = diff / scale.max(f32::MIN_POSITIVE);
            if rel.is_nan() || rel > tolerance {
                failures.push(format!(
                    "{shape} with {rows} rows: relative difference {rel:.2e}"
                ));
            }
            if args.json {
                writeln!(
                    out,
                    "{}",
                    serde_json::json!({
                        "shape": shape, "rows": rows, "bits": spec.bits, "glu": args.glu,
                        "group_size": spec.group_size, "dtype": args.dtype,
                        "mlx_us": mlx_us, "ours_us": ours_us, "speedup": mlx_us / ours_us,
                        "mlx_pct_bw": pct(mlx_us), "ours_pct_bw": pct(ours_us),
                        "max_abs_diff": diff, "max_rel_diff": rel,
                        "weight_copies": copies.len(),
                        "mlx_build_us": mlx.build_us, "ours_build_us": ours.build_us,
                    })
                )?;
            } else {
                writeln!(
                    out,
                    "{shape:>12} {rows:>4} {mlx_us:>10.2} {ours_us:>10.2} {:>7.2}x {:>8.1}% {:>8.1}% {rel:>10.2e} {:>6.1} / {:<6.1}",
                    mlx_us / ours_us,
                    pct(mlx_us),
                    pct(ours_us),
                    mlx.build_us,
                    ours.build_us
                )?;
            }
        }
    }
    if args.check && !args.glu {
        failures.extend(check_one_launch_variants(
            dtype, spec, &args.rows, tolerance,
        )?);
    }
    if args.check && !failures.is_empty() {
        bail!(
            "the CUDA kernel differs from MLX's quantized_matmul beyond {tolerance:e}: {}",
            failures.join("; ")
        );
    }
    Ok(())
}

/// The one-launch variants against MLX on Llama-8B's attention shapes:
/// q, k and v (4096, 1024 and 1024 x 4096) by one launch against three of
/// MLX's products, and a product plus a residual against the kernel's own
/// product and MLX's add (the same bits: the add rounds as MLX's does).
fn check_one_launch_variants(
    dtype: mlx_rs::Dtype,
    spec: QuantSpec,
    rows: &[usize],
    tolerance: f32,
) -> Result<Vec<String>> {
    let k = 4096;
    let layer = |n: i32| -> Result<(Array, Array, Array)> {
        let w = mlx_rs::random::normal::<f32>(&[n, k][..], None, 0.02, None)?.as_dtype(dtype)?;
        let (wq, s, b) = quantize(&w, spec.group_size, spec.bits)?;
        eval([&wq, &s, &b])?;
        Ok((wq, s, b))
    };
    let (q, kk, v) = (layer(4096)?, layer(1024)?, layer(1024)?);
    let relative = |a: &Array, b: &Array| -> Result<f32> {
        let a = a.as_dtype(mlx_rs::Dtype::Float32)?;
        let b = b.as_dtype(mlx_rs::Dtype::Float32)?;
        let diff = a.subtract(&b)?.abs()?.max(None)?.item_cast::<f32>();
        let scale = a.abs()?.max(None)?.item_cast::<f32>();
        Ok(diff / scale.max(f32::MIN_POSITIVE))
    };
    let mut failures = Vec::new();
    let mut out = std::io::stdout();
    for &r in rows {
        let x =
            mlx_rs::random::normal::<f32>(&[r as i32, k][..], None, None, None)?.as_dtype(dtype)?;
        let residual = mlx_rs::random::normal::<f32>(&[r as i32, 4096][..], None, None, None)?
            .as_dtype(dtype)?;
        let [yq, yk, yv] = cuda::quantized_qkv(
            &x,
            [
                [&q.0, &q.1, &q.2],
                [&kk.0, &kk.1, &kk.2],
                [&v.0, &v.1, &v.2],
            ],
            spec,
            None,
        )?
        .context("the one-launch q, k, v kernel does not apply")?;
        let mut worst: f32 = 0.0;
        for (ours, (w, s, b)) in [(&yq, &q), (&yk, &kk), (&yv, &v)] {
            let theirs = quantized_matmul(&x, w, s, b, true, spec.group_size, spec.bits)?;
            worst = worst.max(relative(&theirs, ours)?);
        }
        let plus = cuda::quantized_matvec_plus(&x, [&q.0, &q.1, &q.2], &residual, spec)?
            .context("the product-plus-residual kernel does not apply")?;
        let separate = &cuda::quantized_matvec(&x, &q.0, &q.1, &q.2, spec)? + &residual;
        let mlx_plus =
            &quantized_matmul(&x, &q.0, &q.1, &q.2, true, spec.group_size, spec.bits)? + &residual;
        let exact = relative(&separate, &plus)?;
        let vs_mlx = relative(&mlx_plus, &plus)?;
        writeln!(
            out,
            "one launch, {r} rows: q/k/v max relative difference {worst:.2e}; \
             plus residual {vs_mlx:.2e} from MLX, {exact:.1e} from the kernel's product + add"
        )?;
        if worst.is_nan() || worst > tolerance {
            failures.push(format!("q/k/v in one launch with {r} rows: {worst:.2e}"));
        }
        if exact != 0.0 || vs_mlx.is_nan() || vs_mlx > tolerance {
            failures.push(format!(
                "product plus residual with {r} rows: {exact:.1e} from product + add, {vs_mlx:.2e} from MLX"
            ));
        }
        let (qkv_norm, glu_norm) = check_norm_in_launch(&x, [&q, &kk, &v], spec, relative)?;
        writeln!(
            out,
            "norm in the launch, {r} rows: q/k/v {qkv_norm:.1e}, MLP {glu_norm:.1e} \
             from MLX's rms_norm before the kernel"
        )?;
        for (what, diff) in [("q/k/v", qkv_norm), ("MLP", glu_norm)] {
            if diff.is_nan() || diff > tolerance {
                failures.push(format!(
                    "{what} with the norm in the launch, {r} rows: {diff:.2e}"
                ));
            }
        }
    }
    Ok(failures)
}

type Quantized = (Array, Array, Array);

/// The q/k/v and MLP launches that normalize `x` themselves against the
/// same launches on MLX's `rms_norm(x)`: the largest relative differences.
fn check_norm_in_launch(
    x: &Array,
    [q, k, v]: [&Quantized; 3],
    spec: QuantSpec,
    relative: impl Fn(&Array, &Array) -> Result<f32>,
) -> Result<(f32, f32)> {
    let eps = 1e-5;
    let dims = x.shape()[x.ndim() - 1];
    let weight = mlx_rs::random::normal::<f32>(&[dims][..], 1.0, 0.1, None)?.as_dtype(x.dtype())?;
    let scaled = &(x * &Array::from_f32(3.0).as_dtype(x.dtype())?);
    let normed = mlx_rs::fast::rms_norm(scaled, Some(&weight), eps)?;
    let norm = Some(cuda::RmsNormWeight {
        weight: &weight,
        eps,
    });
    let layers = [[&q.0, &q.1, &q.2], [&k.0, &k.1, &k.2], [&v.0, &v.1, &v.2]];
    let fused = cuda::quantized_qkv(scaled, layers, spec, norm)?
        .context("the q/k/v kernel does not take the norm")?;
    let separate = cuda::quantized_qkv(&normed, layers, spec, None)?
        .context("the q/k/v kernel does not apply")?;
    let mut qkv: f32 = 0.0;
    for (a, b) in fused.iter().zip(&separate) {
        qkv = qkv.max(relative(a, b)?);
    }
    let gate = [&q.0, &q.1, &q.2];
    let fused = cuda::quantized_silu_glu(scaled, gate, gate, spec, norm)?
        .context("the MLP kernel does not take the norm")?;
    let separate = cuda::quantized_silu_glu(&normed, gate, gate, spec, None)?
        .context("the MLP kernel does not apply")?;
    Ok((qkv, relative(&fused, &separate)?))
}

fn parse_shape(s: &str) -> Result<(i32, i32)> {
    let (n, k) = s
        .split_once('x')
        .with_context(|| format!("shape {s:?} is not OUTxIN"))?;
    let n: i32 = n.parse().with_context(|| format!("shape {s:?}"))?;
    let k: i32 = k.parse().with_context(|| format!("shape {s:?}"))?;
    if n < 1 || k < 1 {
        bail!("shape {s:?} must be positive");
    }
    Ok((n, k))
}

/// Copies of one layer's quantized weights in distinct buffers, enough that
/// the products of a timed graph read about 256 MB between two uses of a
/// copy: more than any GPU's L2 cache holds, as in a model's decode step.
fn weight_copies(
    wq: &Array,
    scales: &Array,
    biases: &Array,
    bytes: usize,
) -> Result<Vec<(Array, Array, Array)>> {
    let count = (256usize << 20).div_ceil(bytes.max(1)).clamp(1, 64);
    let mut copies = vec![(wq.clone(), scales.clone(), biases.clone())];
    for _ in 1..count {
        let copy = (
            wq.add(&Array::from_int(0).as_dtype(wq.dtype())?)?,
            scales.multiply(&Array::from_f32(1.0).as_dtype(scales.dtype())?)?,
            biases.multiply(&Array::from_f32(1.0).as_dtype(biases.dtype())?)?,
        );
        eval([&copy.0, &copy.1, &copy.2])?;
        copies.push(copy);
    }
    Ok(copies)
}

/// Median times of a batch of products: `run_us` per product when `batch`
/// of them are built into one graph and evaluated together, `build_us` per
/// product spent building that graph on the host.
pub(super) struct Timing {
    /// Device time per product, median of the runs.
    pub(super) run_us: f64,
    /// Host time building one product's node, median of the runs.
    pub(super) build_us: f64,
}

/// `runs` timed batches after a warm-up; product `i` of a batch is `f(i)`.
pub(super) fn time_products(
    batch: usize,
    runs: usize,
    f: impl Fn(usize) -> Result<Array>,
) -> Result<Timing> {
    let mut times = Vec::new();
    let mut builds = Vec::new();
    for run in 0..=runs {
        let t = Instant::now();
        let outs: Vec<Array> = (0..batch).map(&f).collect::<Result<_>>()?;
        let built = t.elapsed().as_secs_f64();
        let t = Instant::now();
        eval(outs.iter())?;
        if run > 0 {
            times.push(t.elapsed().as_secs_f64() * 1e6 / batch as f64);
            builds.push(built * 1e6 / batch as f64);
        }
    }
    times.sort_by(f64::total_cmp);
    builds.sort_by(f64::total_cmp);
    Ok(Timing {
        run_us: times[times.len() / 2],
        build_us: builds[builds.len() / 2],
    })
}
