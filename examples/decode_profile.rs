//! Where a CPU decode step's time goes: building the lazy graph, MLX's
//! evaluation of it, the quantized kernel inside that evaluation (the 4-bit
//! layers and the 8-bit output head of the default model), and greedy token
//! selection. One row at a time, after 64 tokens of context.
//!
//! `cargo run --release --example decode_profile -- [--model DIR] [--steps N] [--rows B] [--kv-bits N] [--dot FILE]`
//! (`--rows` decodes B tokens per step: B rows through every matmul;
//! `--kv-bits` quantizes the KV cache from the first position, group size
//! 64; `--dot` writes one step's graph in Graphviz form and counts its
//! operations).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mlx_bun::model::Model;
use mlx_rs::ops::indexing::argmax_axis;
use mlx_rs::transforms::eval;
use mlx_rs::Array;

fn main() -> Result<()> {
    let mut model_dir = None;
    let mut steps = 64usize;
    let mut rows = 1usize;
    let mut dot: Option<String> = None;
    let mut kv_bits: Option<i32> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--model" => model_dir = Some(value.into()),
            "--steps" => steps = value.parse().context("--steps")?,
            "--rows" => rows = value.parse().context("--rows")?,
            "--dot" => dot = Some(value),
            "--kv-bits" => kv_bits = Some(value.parse().context("--kv-bits")?),
            _ => bail!("unknown argument {arg}"),
        }
    }
    if steps == 0 || rows == 0 {
        bail!("--steps and --rows must be positive");
    }
    let dir = match model_dir {
        Some(dir) => dir,
        None => mlx_bun::default_model::ensure()?,
    };
    let model = Model::load(&dir)?;
    let kv = kv_bits.map(|bits| mlx_bun::cache::KvQuantization {
        bits,
        group_size: 64,
        start: 0,
    });
    let mut caches = model.decoder.make_caches_with(None, kv)?;
    let ctx: Vec<u32> = (0..64).map(|i| 100 + i).collect();
    mlx_bun::generate::prefill(&model, &mut caches, &ctx, 2048)?;

    let mut tokens: Vec<i32> = (0..rows as i32).map(|i| 200 + i).collect();
    let (mut build, mut evaluate, mut select) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let warmup = 4;
    let mut before = [(0, Duration::ZERO); 2];
    let started = Instant::now();
    let mut timed_from = started;
    for step in 0..warmup + steps {
        if step == warmup {
            before = [mlx_bun::kernels::stats(4), mlx_bun::kernels::stats(8)];
            (build, evaluate, select) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
            timed_from = Instant::now();
        }
        let t0 = Instant::now();
        let input = Array::from_slice(&tokens, &[1, rows as i32]);
        let logits = model.forward(&input, &mut caches)?;
        let t1 = Instant::now();
        if let Some(path) = dot.as_ref().filter(|_| step == 2) {
            let ops = write_dot(path, &logits)?;
            println!("one step's graph: {ops} operations, written to {path}");
        }
        eval([&logits])?;
        let t2 = Instant::now();
        let next = argmax_axis(&logits, -1, None)?;
        eval([&next])?;
        tokens = next.as_slice::<u32>().iter().map(|&t| t as i32).collect();
        let t3 = Instant::now();
        build += t1 - t0;
        evaluate += t2 - t1;
        select += t3 - t2;
    }
    let total = timed_from.elapsed();
    let after = [mlx_bun::kernels::stats(4), mlx_bun::kernels::stats(8)];
    let per_step = |d: Duration| d.as_secs_f64() * 1e3 / steps as f64;
    let kernel4 = after[0].1 - before[0].1;
    let kernel8 = after[1].1 - before[1].1;
    let calls = (after[0].0 - before[0].0) + (after[1].0 - before[1].0);
    println!(
        "model {}, {rows} row(s) per step, {steps} steps, kernel {} ({} threads, {})",
        dir.display(),
        if mlx_bun::kernels::enabled() {
            "on"
        } else {
            "off"
        },
        mlx_bun::kernels::threads(),
        mlx_bun::kernels::isa()
    );
    println!("| part | ms per step |");
    println!("|---|---|");
    println!("| whole step | {:.2} |", per_step(total));
    println!(
        "| build the graph (Rust + mlx-c) | {:.2} |",
        per_step(build)
    );
    println!("| evaluate it (MLX) | {:.2} |", per_step(evaluate));
    println!("| - kernel, 4-bit layers | {:.2} |", per_step(kernel4));
    println!("| - kernel, 8-bit output head | {:.2} |", per_step(kernel8));
    println!(
        "| - everything else in the evaluation | {:.2} |",
        per_step(evaluate.saturating_sub(kernel4 + kernel8))
    );
    println!("| argmax and read back | {:.2} |", per_step(select));
    println!(
        "kernel calls per step: {:.0}; tokens/s: {:.1}",
        calls as f64 / steps as f64,
        (steps * rows) as f64 / total.as_secs_f64()
    );
    Ok(())
}

extern "C" {
    fn fopen(
        path: *const std::os::raw::c_char,
        mode: *const std::os::raw::c_char,
    ) -> *mut mlx_sys::FILE;
    fn fclose(file: *mut mlx_sys::FILE) -> std::os::raw::c_int;
}

/// Writes the graph behind `out` to `path` and counts its operations.
fn write_dot(path: &str, out: &Array) -> Result<usize> {
    let c_path = std::ffi::CString::new(path)?;
    // SAFETY: a file opened and closed here, a vector of one valid handle and
    // a default namer, all freed before returning.
    unsafe {
        let file = fopen(c_path.as_ptr(), c"w".as_ptr());
        if file.is_null() {
            bail!("cannot write {path}");
        }
        let handles = [out.as_ptr()];
        let outputs = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), 1);
        let namer = mlx_sys::mlx_node_namer_new();
        let rc = mlx_sys::mlx_export_to_dot(file, namer, outputs);
        mlx_sys::mlx_node_namer_free(namer);
        mlx_sys::mlx_vector_array_free(outputs);
        fclose(file);
        if rc != 0 {
            bail!("MLX could not export the graph");
        }
    }
    let text = std::fs::read_to_string(path)?;
    Ok(text.matches("shape=rectangle").count())
}
