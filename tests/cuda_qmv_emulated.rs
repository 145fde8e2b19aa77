//! mlx-bun's CUDA quantized matrix-vector kernel (`kernels/cuda/qmv.cu`) run
//! on the CPU: the kernel's source compiled by the C++ compiler with
//! `tests/cuda_emulation/cuda_shim.h` (one OS thread per CUDA thread; half
//! precision with CUDA's rounding), against the float32 product of the same
//! bfloat16 activations and MLX's affine-quantized weights. Every entry point
//! (a plain product with x in shared memory or per warp, 4 and 8 bits, the
//! fused MLP, a product plus its residual, q/k/v in one launch, the last two
//! after an RMS norm in the same launch) is checked where no GPU is; on a
//! GPU `bench qmv --check` checks the same.

use std::path::Path;

use common::cuda_emulation::{build, floats, random, read, relative, run, write};
use mlx_rs::ops::{dequantize, matmul, mean_axis, quantize, rsqrt, sigmoid};
use mlx_rs::{Array, Dtype};

mod common;

const GS: i32 = 64;

/// Random bfloat16 weights `[n, k]` quantized: words, scales, biases.
fn layer(n: i32, k: i32, bits: i32) -> [Array; 3] {
    let w = random(&[n, k], Dtype::Bfloat16);
    let (wq, scales, biases) = quantize(&w, GS, bits).unwrap();
    [wq, scales, biases]
}

/// `x @ dequantize(w).T` in float32: MLX's dequantization with float32
/// scales and biases, then a float32 matmul. (MLX's CPU `quantized_matmul`
/// on bfloat16 inputs came out 3e-2 from this at K = 512; the kernel sums
/// in float.)
fn product(x: &Array, [w, s, b]: &[Array; 3], bits: i32) -> Array {
    let f32 = Dtype::Float32;
    let dense = dequantize(
        w,
        s.as_dtype(f32).unwrap(),
        &b.as_dtype(f32).unwrap(),
        GS,
        bits,
    )
    .unwrap();
    matmul(x.as_dtype(f32).unwrap(), dense.t()).unwrap()
}

/// `x` `[rows, k]` after an RMS norm with `weight` and epsilon 1e-5 (the
/// kernel's test driver uses the same), in float32.
fn rms_normed(x: &Array, weight: &Array) -> Array {
    let x = x.as_dtype(Dtype::Float32).unwrap();
    let mean_square = mean_axis(&(&x * &x), -1, true).unwrap();
    let scale = rsqrt(&(&mean_square + 1e-5f32)).unwrap();
    &(&x * &scale) * &weight.as_dtype(Dtype::Float32).unwrap()
}

fn save(dir: &Path, names: [&str; 3], layer: &[Array; 3]) {
    for (name, a) in names.iter().zip(layer) {
        write(dir.join(name), a);
    }
}

fn args(dir: &Path, case: &str, dims: &[i32]) -> Vec<String> {
    let mut args = vec![dir.display().to_string(), case.to_string()];
    args.extend(dims.iter().map(|d| d.to_string()));
    args
}

fn assert_close(dir: &Path, file: &str, reference: &Array, tolerance: f32, what: &str) {
    let diff = relative(&read(dir.join(file)), &floats(reference));
    assert!(diff < tolerance, "{what}: differs by {diff:.2e}");
}

#[test]
fn qmv_kernel_matches_mlx_quantized_matmul() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let exe = build(dir, "qmv");
    let bf16 = Dtype::Bfloat16;

    // Plain products: (case, rows, K, N, bits).
    for (case, m, k, n, bits) in [
        ("plain-1", 1, 512, 256, 4),
        ("plain-4", 3, 256, 128, 4),
        ("plain-8bit", 2, 256, 64, 8),
    ] {
        let x = random(&[m, k], bf16);
        let w = layer(n, k, bits);
        write(dir.join("x"), &x);
        save(dir, ["w", "scales", "biases"], &w);
        run(&exe, &args(dir, case, &[m, k, n]));
        assert_close(dir, "y", &product(&x, &w, bits), 1e-2, case);
    }

    // silu(x @ gate.T) * (x @ up.T); the kernel rounds each step to
    // bfloat16 as MLX does, the reference stays in float32.
    let (k, n) = (512, 128);
    let x = random(&[1, k], bf16);
    let (gate, up) = (layer(n, k, 4), layer(n, k, 4));
    write(dir.join("x"), &x);
    save(dir, ["w", "scales", "biases"], &gate);
    save(dir, ["w2", "scales2", "biases2"], &up);
    run(&exe, &args(dir, "glu", &[1, k, n]));
    let g = product(&x, &gate, 4);
    let silu = &g * &sigmoid(&g).unwrap();
    assert_close(dir, "y", &(&silu * &product(&x, &up, 4)), 2e-2, "glu");

    // A product plus a residual of its shape.
    let (k, n) = (256, 128);
    let x = random(&[1, k], bf16);
    let w = layer(n, k, 4);
    let residual = random(&[1, n], bf16);
    write(dir.join("x"), &x);
    write(dir.join("residual"), &residual);
    save(dir, ["w", "scales", "biases"], &w);
    run(&exe, &args(dir, "residual", &[1, k, n]));
    let expected = &product(&x, &w, 4) + &residual;
    assert_close(dir, "y", &expected, 1e-2, "residual");

    // q, k and v (of different widths) in one launch.
    let (k, n, nk, nv) = (256, 256, 64, 64);
    let x = random(&[1, k], bf16);
    let (q, kl, v) = (layer(n, k, 4), layer(nk, k, 4), layer(nv, k, 4));
    write(dir.join("x"), &x);
    save(dir, ["w", "scales", "biases"], &q);
    save(dir, ["wk", "sk", "bk"], &kl);
    save(dir, ["wv", "sv", "bv"], &v);
    run(&exe, &args(dir, "qkv", &[1, k, n, nk, nv]));
    assert_close(dir, "y", &product(&x, &q, 4), 1e-2, "qkv: q");
    assert_close(dir, "yk", &product(&x, &kl, 4), 1e-2, "qkv: k");
    assert_close(dir, "yv", &product(&x, &v, 4), 1e-2, "qkv: v");

    // The same two launches normalizing x themselves: three rows of q, k
    // and v; one row of the MLP. x far from unit scale (the MLP's mean
    // square near epsilon), the weight of either sign.
    let norm = random(&[k], bf16);
    write(dir.join("norm"), &norm);
    let x = &random(&[3, k], bf16) * &Array::from_f32(7.0).as_dtype(bf16).unwrap();
    write(dir.join("x"), &x);
    run(&exe, &args(dir, "qkv-norm", &[3, k, n, nk, nv]));
    let normed = rms_normed(&x, &norm);
    assert_close(dir, "y", &product(&normed, &q, 4), 1e-2, "qkv-norm: q");
    assert_close(dir, "yk", &product(&normed, &kl, 4), 1e-2, "qkv-norm: k");
    assert_close(dir, "yv", &product(&normed, &v, 4), 1e-2, "qkv-norm: v");

    let (k, n) = (512, 128);
    let norm = random(&[k], bf16);
    let x = &random(&[1, k], bf16) * &Array::from_f32(0.003).as_dtype(bf16).unwrap();
    let (gate, up) = (layer(n, k, 4), layer(n, k, 4));
    write(dir.join("norm"), &norm);
    write(dir.join("x"), &x);
    save(dir, ["w", "scales", "biases"], &gate);
    save(dir, ["w2", "scales2", "biases2"], &up);
    run(&exe, &args(dir, "glu-norm", &[1, k, n]));
    let normed = rms_normed(&x, &norm);
    let g = product(&normed, &gate, 4);
    let silu = &g * &sigmoid(&g).unwrap();
    assert_close(
        dir,
        "y",
        &(&silu * &product(&normed, &up, 4)),
        2e-2,
        "glu-norm",
    );
}
