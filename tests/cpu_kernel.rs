//! mlx-bun's CPU quantized matmul kernel against MLX's `quantized_matmul`:
//! random shapes, rows 1..=16, group sizes 32/64/128, 4 and 8 bits, strided
//! inputs, the layer dispatch and the gradient with respect to the input.

use mlx_bun::kernels::{
    attention, attention_over, cpu_quantized_matmul, quantized_attention, quantized_embedding,
    quantized_matmul_add, quantized_matmul_t, quantized_qkv_rope, quantized_silu_glu,
    AttentionHeads, AttentionMask, RopeParams, RopeStart,
};
use mlx_bun::quant::QuantSpec;
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{concatenate, dequantize, quantize, quantized_matmul};
use mlx_rs::transforms::{eval, value_and_grad_with_argnums};
use mlx_rs::Array;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn random_array(rng: &mut StdRng, shape: &[i32], scale: f32) -> Array {
    let n: i32 = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| rng.gen_range(-scale..scale)).collect();
    Array::from_slice(&data, shape)
}

struct Layer {
    w: Array,
    scales: Array,
    biases: Array,
    spec: QuantSpec,
}

fn random_layer(rng: &mut StdRng, out: i32, inp: i32, group_size: i32, bits: i32) -> Layer {
    let dense = random_array(rng, &[out, inp], 0.1);
    let (w, scales, biases) = quantize(&dense, group_size, bits).unwrap();
    eval([&w, &scales, &biases]).unwrap();
    Layer {
        w,
        scales,
        biases,
        spec: QuantSpec::affine(group_size, bits),
    }
}

fn mlx_reference(x: &Array, l: &Layer) -> Array {
    quantized_matmul(
        x,
        &l.w,
        &l.scales,
        &l.biases,
        true,
        l.spec.group_size,
        l.spec.bits,
    )
    .unwrap()
}

/// Largest |a - b| relative to the largest |b| (plus one).
fn assert_close(got: &Array, want: &Array, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let g = got.as_slice::<f32>().to_vec();
    let w = want.as_slice::<f32>().to_vec();
    let scale = w.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let worst = g
        .iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        g.iter().all(|v| v.is_finite()) && worst <= 2e-5 * scale,
        "{what}: max difference {worst} (scale {scale})"
    );
}

#[test]
fn matches_mlx_over_random_shapes() {
    let mut rng = StdRng::seed_from_u64(16);
    let mut cases = 0;
    for &bits in &[4, 8] {
        for &group_size in &[32, 64, 128] {
            for _ in 0..6 {
                let inp = group_size * rng.gen_range(1..=12);
                // Output widths that are and are not multiples of the kernel's block.
                let out = rng.gen_range(1..=300);
                let rows = rng.gen_range(1..=16);
                let layer = random_layer(&mut rng, out, inp, group_size, bits);
                let x = random_array(&mut rng, &[1, rows, inp], 1.0);
                let got = cpu_quantized_matmul(
                    &x,
                    &layer.w,
                    &layer.scales,
                    &layer.biases,
                    group_size,
                    bits,
                )
                .unwrap();
                let want = mlx_reference(&x, &layer);
                eval([&got, &want]).unwrap();
                let what = format!("bits {bits} group {group_size} rows {rows} {out}x{inp}");
                assert_close(&got, &want, &what);
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 36);
}

#[test]
fn every_row_count_up_to_sixteen_on_model_shapes() {
    let mut rng = StdRng::seed_from_u64(135);
    // SmolLM2-135M's projections (576 wide, MLP 1536) and a large output.
    let layers = [
        random_layer(&mut rng, 576, 576, 32, 4),
        random_layer(&mut rng, 1536, 576, 32, 4),
        random_layer(&mut rng, 576, 1536, 32, 4),
        random_layer(&mut rng, 4099, 576, 32, 8),
    ];
    for layer in &layers {
        let inp = layer.w.shape()[1] * 32 / layer.spec.bits;
        for rows in 1..=16 {
            let x = random_array(&mut rng, &[rows, 1, inp], 2.0);
            let got = cpu_quantized_matmul(
                &x,
                &layer.w,
                &layer.scales,
                &layer.biases,
                layer.spec.group_size,
                layer.spec.bits,
            )
            .unwrap();
            let want = mlx_reference(&x, layer);
            eval([&got, &want]).unwrap();
            assert_close(
                &got,
                &want,
                &format!("rows {rows} of {:?}", layer.w.shape()),
            );
        }
    }
}

/// A batch row's product equals that row's product alone, bit for bit, at
/// any row count (blocks of rows dequantized in registers or once for all
/// rows): batched decoding and speculative verification depend on it.
#[test]
fn each_row_equals_the_row_alone() {
    let mut rng = StdRng::seed_from_u64(77);
    for (bits, group_size) in [(4, 32), (4, 64), (8, 64)] {
        let layer = random_layer(&mut rng, 203, 384, group_size, bits);
        for rows in [2, 4, 5, 8, 13, 16] {
            let x = random_array(&mut rng, &[rows, 384], 1.0);
            let product = |x: &Array| {
                let y = cpu_quantized_matmul(
                    x,
                    &layer.w,
                    &layer.scales,
                    &layer.biases,
                    group_size,
                    bits,
                )
                .unwrap();
                eval([&y]).unwrap();
                y.as_slice::<f32>().to_vec()
            };
            let together = product(&x);
            for r in 0..rows {
                let alone = product(&x.index(r..r + 1));
                let row = &together[(r * 203) as usize..((r + 1) * 203) as usize];
                assert!(
                    row == alone.as_slice(),
                    "bits {bits} group {group_size}: row {r} of {rows} differs from the row alone"
                );
            }
        }
    }
}

#[test]
fn strided_input_is_read_correctly() {
    let mut rng = StdRng::seed_from_u64(3);
    let layer = random_layer(&mut rng, 96, 128, 64, 4);
    // [128, 5] transposed: rows are not contiguous in memory.
    let x = random_array(&mut rng, &[128, 5], 1.0).t();
    let got = cpu_quantized_matmul(&x, &layer.w, &layer.scales, &layer.biases, 64, 4).unwrap();
    let want = mlx_reference(&x, &layer);
    eval([&got, &want]).unwrap();
    assert_close(&got, &want, "transposed input");
    // A slice of a larger array (non-zero offset).
    let big = random_array(&mut rng, &[6, 256], 1.0);
    let x = big.index((1..4, 128..));
    let got = cpu_quantized_matmul(&x, &layer.w, &layer.scales, &layer.biases, 64, 4).unwrap();
    let want = mlx_reference(&x, &layer);
    eval([&got, &want]).unwrap();
    assert_close(&got, &want, "sliced input");
}

#[test]
fn layer_dispatch_matches_mlx_for_small_and_large_row_counts() {
    let mut rng = StdRng::seed_from_u64(5);
    let layer = random_layer(&mut rng, 200, 256, 32, 4);
    for rows in [1, 3, 16, 17, 40, 130] {
        let x = random_array(&mut rng, &[rows, 256], 1.0);
        let got =
            quantized_matmul_t(&x, &layer.w, &layer.scales, &layer.biases, layer.spec).unwrap();
        let want = mlx_reference(&x, &layer);
        eval([&got, &want]).unwrap();
        assert_close(&got, &want, &format!("dispatch with {rows} rows"));
    }
}

#[test]
fn bad_inputs_are_errors_not_crashes() {
    let mut rng = StdRng::seed_from_u64(9);
    let layer = random_layer(&mut rng, 64, 128, 32, 4);
    let x = random_array(&mut rng, &[2, 96], 1.0);
    let err = cpu_quantized_matmul(&x, &layer.w, &layer.scales, &layer.biases, 32, 4).unwrap_err();
    assert!(err.to_string().contains("weight shape"), "{err}");
    let x = random_array(&mut rng, &[2, 128], 1.0);
    let err = cpu_quantized_matmul(&x, &layer.w, &layer.scales, &layer.biases, 32, 3).unwrap_err();
    assert!(err.to_string().contains("unsupported"), "{err}");
    let half = x.as_dtype(mlx_rs::Dtype::Float16).unwrap();
    let err =
        cpu_quantized_matmul(&half, &layer.w, &layer.scales, &layer.biases, 32, 4).unwrap_err();
    assert!(err.to_string().contains("float32"), "{err}");
}

#[test]
fn gradient_with_respect_to_the_input_matches_mlx() {
    let mut rng = StdRng::seed_from_u64(11);
    let layer = random_layer(&mut rng, 48, 64, 32, 8);
    let x = random_array(&mut rng, &[3, 64], 1.0);
    let grad_of = |use_kernel: bool| {
        let (w, s, b) = (layer.w.clone(), layer.scales.clone(), layer.biases.clone());
        let f = move |args: &[Array]| -> Result<Vec<Array>, Exception> {
            let y = if use_kernel {
                cpu_quantized_matmul(&args[0], &w, &s, &b, 32, 8)
                    .map_err(|e| Exception::custom(e.to_string()))?
            } else {
                quantized_matmul(&args[0], &w, &s, &b, true, 32, 8)?
            };
            Ok(vec![(&y * &y).sum_axes(&[0, 1], None)?])
        };
        let mut vg = value_and_grad_with_argnums(f, &[0][..]);
        let (_, grads) = vg(std::slice::from_ref(&x)).unwrap();
        eval(grads.iter()).unwrap();
        grads[0].clone()
    };
    assert_close(&grad_of(true), &grad_of(false), "gradient");
}

#[test]
fn uses_simd_where_the_cpu_has_it() {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::env::var("MLX_BUN_CPU_ISA").is_err() {
        assert_ne!(mlx_bun::kernels::isa(), "scalar");
    }
    #[cfg(target_arch = "aarch64")]
    assert_eq!(mlx_bun::kernels::isa(), "neon");
    assert!(mlx_bun::kernels::threads() >= 1);
}

/// The AVX2 and scalar variants, forced in a child process (the choice is
/// made once per process), pass the same property test.
#[test]
fn narrower_instruction_sets_match_mlx_too() {
    if std::env::var("MLX_BUN_CPU_ISA").is_ok() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for isa in ["avx2", "scalar"] {
        let out = std::process::Command::new(&exe)
            .args([
                "--exact",
                "matches_mlx_over_random_shapes",
                "--test-threads",
                "1",
            ])
            .env("MLX_BUN_CPU_ISA", isa)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{isa}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn rms_norm_matches_mlx() {
    let mut rng = StdRng::seed_from_u64(21);
    for shape in [vec![1, 1, 576], vec![2, 7, 64], vec![3, 100]] {
        let d = *shape.last().unwrap();
        let x = random_array(&mut rng, &shape, 3.0);
        let w = random_array(&mut rng, &[d], 1.0);
        let got = mlx_bun::kernels::rms_norm(&x, &w, 1e-5).unwrap();
        let want = mlx_rs::fast::rms_norm(&x, Some(&w), 1e-5).unwrap();
        eval([&got, &want]).unwrap();
        assert_close(&got, &want, &format!("rms_norm {shape:?}"));
    }
    // A transposed (strided) input.
    let x = random_array(&mut rng, &[64, 5], 1.0).t();
    let w = random_array(&mut rng, &[64], 1.0);
    let got = mlx_bun::kernels::rms_norm(&x, &w, 1e-6).unwrap();
    let want = mlx_rs::fast::rms_norm(&x, Some(&w), 1e-6).unwrap();
    eval([&got, &want]).unwrap();
    assert_close(&got, &want, "rms_norm strided");
}

#[test]
fn rope_matches_mlx() {
    let mut rng = StdRng::seed_from_u64(22);
    let freqs = Array::from_slice(
        &(0..16).map(|i| 1.0 + i as f32 * 3.5).collect::<Vec<_>>(),
        &[16],
    );
    // (shape [B, L, H, D] transposed to [B, H, L, D], dims, base, scale, offset, freqs)
    type Case<'a> = (Vec<i32>, i32, Option<f32>, f32, i32, Option<&'a Array>);
    let cases: Vec<Case> = vec![
        (vec![1, 1, 9, 64], 64, Some(100000.0), 1.0, 70, None),
        (vec![1, 6, 3, 64], 64, Some(10000.0), 1.0, 0, None),
        (vec![2, 5, 2, 48], 32, Some(10000.0), 0.5, 9, None),
        (vec![1, 4, 2, 32], 32, None, 1.0, 1000, Some(&freqs)),
    ];
    for (shape, dims, base, scale, offset, f) in cases {
        let x = random_array(&mut rng, &shape, 2.0)
            .transpose_axes(&[0, 2, 1, 3])
            .unwrap();
        let params = RopeParams {
            dims,
            traditional: false,
            base,
            scale,
            freqs: f,
        };
        let got = mlx_bun::kernels::rope(&x, &params, offset).unwrap();
        let want = mlx_rs::fast::rope(&x, dims, false, base, scale, offset, f).unwrap();
        eval([&got, &want]).unwrap();
        assert_close(
            &got,
            &want,
            &format!("rope {shape:?} dims {dims} offset {offset}"),
        );
    }
}

/// Rows of a batch, each at its own position: every row's numbers equal
/// those of the row rotated alone (so a row decodes the same in a batch as
/// by itself; MLX's RoPE with an array offset rounds its angles otherwise,
/// which flipped a near-tie between a served batch and `generate`), and
/// MLX's within float32 rounding of angles up to 4095 radians.
#[test]
fn rope_per_row_equals_each_row_alone() {
    let mut rng = StdRng::seed_from_u64(23);
    let freqs = Array::from_slice(
        &(0..16).map(|i| 1.0 + i as f32 * 3.5).collect::<Vec<_>>(),
        &[16],
    );
    let starts = [0, 7, 130, 4095];
    for (base, f) in [(Some(10000.0), None), (None, Some(&freqs))] {
        for len in [1, 3] {
            // [B, L, H, D] transposed to [B, H, L, D], as attention holds it.
            let x = random_array(&mut rng, &[4, len, 2, 32], 2.0)
                .transpose_axes(&[0, 2, 1, 3])
                .unwrap();
            let params = RopeParams {
                dims: 32,
                traditional: false,
                base,
                scale: 1.0,
                freqs: f,
            };
            let offsets = Array::from_slice(&starts, &[4]);
            let batch = mlx_bun::kernels::rope_per_row(&x, &params, &offsets).unwrap();
            let want = mlx_rs::fast::rope_dynamic(&x, 32, false, base, 1.0, &offsets, f).unwrap();
            eval([&batch, &want]).unwrap();
            let worst = batch
                .as_slice::<f32>()
                .iter()
                .zip(want.as_slice::<f32>())
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                worst < 1e-3,
                "per-row rope, {len} positions: {worst} from MLX's"
            );
            for (b, &start) in starts.iter().enumerate() {
                let b = b as i32;
                let row = x.index((b..b + 1, .., .., ..));
                let alone = mlx_bun::kernels::rope(&row, &params, start).unwrap();
                let in_batch = batch.index((b..b + 1, .., .., ..));
                assert!(
                    alone.eq_values(&in_batch).unwrap(),
                    "row {b} at {start} differs from alone"
                );
            }
        }
    }
}

#[test]
fn rms_norm_and_rope_gradients_match_mlx() {
    let mut rng = StdRng::seed_from_u64(23);
    let x = random_array(&mut rng, &[1, 3, 4, 32], 1.0);
    let w = random_array(&mut rng, &[32], 1.0);
    let grad_of = |ours: bool| {
        let w = w.clone();
        let f = move |args: &[Array]| -> Result<Vec<Array>, Exception> {
            let (n, r) = if ours {
                let n = mlx_bun::kernels::rms_norm(&args[0], &args[1], 1e-5)
                    .map_err(|e| Exception::custom(e.to_string()))?;
                let params = RopeParams {
                    dims: 32,
                    traditional: false,
                    base: Some(10000.0),
                    scale: 1.0,
                    freqs: None,
                };
                let r = mlx_bun::kernels::rope(&n, &params, 5)
                    .map_err(|e| Exception::custom(e.to_string()))?;
                (n, r)
            } else {
                let n = mlx_rs::fast::rms_norm(&args[0], Some(&args[1]), 1e-5)?;
                let r = mlx_rs::fast::rope(&n, 32, false, Some(10000.0), 1.0, 5, None)?;
                (n, r)
            };
            let _ = n;
            Ok(vec![(&r * &r).sum_axes(&[0, 1, 2, 3], None)?])
        };
        let mut vg = value_and_grad_with_argnums(f, &[0, 1][..]);
        let (_, grads) = vg(&[x.clone(), w.clone()]).unwrap();
        eval(grads.iter()).unwrap();
        grads
    };
    let (ours, theirs) = (grad_of(true), grad_of(false));
    assert_close(&ours[0], &theirs[0], "gradient wrt x");
    assert_close(&ours[1], &theirs[1], "gradient wrt the norm weight");
}

/// MLX's attention with the heads moved back beside the features, as the
/// CPU attention primitive returns it: `[B, L, heads × D]`.
fn mlx_attention(q: &Array, k: &Array, v: &Array, scale: f32, mask: &AttentionMask) -> Array {
    use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
    let out = match mask {
        AttentionMask::None => scaled_dot_product_attention(q, k, v, scale, None, None),
        AttentionMask::Causal => scaled_dot_product_attention(
            q,
            k,
            v,
            scale,
            ScaledDotProductAttentionMask::Causal,
            None,
        ),
        AttentionMask::Array(m) => scaled_dot_product_attention(q, k, v, scale, *m, None),
    }
    .unwrap();
    let (b, l) = (q.shape()[0], q.shape()[2]);
    out.transpose_axes(&[0, 2, 1, 3])
        .unwrap()
        .reshape(&[b, l, -1])
        .unwrap()
}

#[test]
fn attention_matches_mlx() {
    let mut rng = StdRng::seed_from_u64(31);
    // (batch, heads, kv heads, queries, keys, head size)
    let shapes = [
        (1, 9, 3, 1, 1, 64),
        (1, 9, 3, 1, 70, 64),
        (2, 4, 4, 3, 17, 32),
        (3, 8, 2, 5, 300, 128),
        (1, 2, 1, 16, 16, 24),
        // Prompts: several tiles of queries, a chunk after cached keys, a
        // head size with a tail past the lanes.
        (1, 9, 3, 40, 40, 64),
        (2, 8, 2, 33, 50, 128),
        (1, 4, 1, 20, 20, 24),
    ];
    for (b, h, hk, l, s, d) in shapes {
        let q = random_array(&mut rng, &[b, h, l, d], 1.0);
        let k = random_array(&mut rng, &[b, hk, s, d], 1.0);
        let v = random_array(&mut rng, &[b, hk, s, d], 1.0);
        let keep: Vec<bool> = (0..b * l * s).map(|i| i % 7 != 3).collect();
        let bool_mask = Array::from_slice(&keep, &[b, 1, l, s]);
        let masks = [
            AttentionMask::None,
            AttentionMask::Causal,
            AttentionMask::Array(&bool_mask),
        ];
        for mask in masks {
            let scale = (d as f32).powf(-0.5);
            let got = attention(&q, &k, &v, scale, mask).unwrap().unwrap();
            let want = mlx_attention(&q, &k, &v, scale, &mask);
            eval([&got, &want]).unwrap();
            assert_close(&got, &want, &format!("attention {:?}", (b, h, hk, l, s, d)));
        }
    }
    // Keys and values read through a cache-like view (a slice of a longer
    // buffer) and queries transposed from [B, L, heads, D].
    let buffer = random_array(&mut rng, &[1, 3, 256, 64], 1.0);
    let k = buffer.index((.., .., ..40, ..));
    let v = (&buffer * 0.5).index((.., .., ..40, ..));
    let q = random_array(&mut rng, &[1, 2, 9, 64], 1.0)
        .transpose_axes(&[0, 2, 1, 3])
        .unwrap();
    let got = attention(&q, &k, &v, 0.125, AttentionMask::Causal)
        .unwrap()
        .unwrap();
    let want = mlx_attention(&q, &k, &v, 0.125, &AttentionMask::Causal);
    eval([&got, &want]).unwrap();
    assert_close(&got, &want, "attention over views");
}

/// A prompt's queries go through tiles whose products are summed across
/// keys; one query's through products summed across features. Both round
/// alike, so a prompt's last position attends exactly as a decode step
/// over the same keys does (what keeps speculative verification and plain
/// decoding on the same tokens).
#[test]
fn prompt_attention_equals_decode_attention_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(35);
    for (h, hk, l, d) in [(9, 3, 37, 64), (8, 2, 20, 128), (4, 4, 17, 40)] {
        let q = random_array(&mut rng, &[1, h, l, d], 1.0);
        let k = random_array(&mut rng, &[1, hk, l, d], 1.0);
        let v = random_array(&mut rng, &[1, hk, l, d], 1.0);
        let scale = (d as f32).powf(-0.5);
        let prompt = attention(&q, &k, &v, scale, AttentionMask::Causal)
            .unwrap()
            .unwrap();
        let last = q.index((.., .., l - 1.., ..));
        let decode = attention(&last, &k, &v, scale, AttentionMask::Causal)
            .unwrap()
            .unwrap();
        let prompt_last = prompt.index((.., l - 1.., ..));
        eval([&prompt_last, &decode]).unwrap();
        assert_eq!(
            prompt_last.as_slice::<f32>(),
            decode.as_slice::<f32>(),
            "heads {h}/{hk}, {l} queries, head size {d}"
        );
    }
}

#[test]
fn attention_gradient_matches_mlx() {
    let mut rng = StdRng::seed_from_u64(33);
    let q = random_array(&mut rng, &[1, 4, 3, 16], 1.0);
    let k = random_array(&mut rng, &[1, 2, 7, 16], 1.0);
    let v = random_array(&mut rng, &[1, 2, 7, 16], 1.0);
    let grad_of = |ours: bool| {
        let f = move |args: &[Array]| -> Result<Vec<Array>, Exception> {
            let out = if ours {
                attention(&args[0], &args[1], &args[2], 0.25, AttentionMask::Causal)
                    .map_err(|e| Exception::custom(e.to_string()))?
                    .expect("the primitive applies")
            } else {
                mlx_attention(&args[0], &args[1], &args[2], 0.25, &AttentionMask::Causal)
            };
            Ok(vec![(&out * &out).sum(None)?])
        };
        let mut vg = value_and_grad_with_argnums(f, &[0, 1, 2][..]);
        let (_, grads) = vg(&[q.clone(), k.clone(), v.clone()]).unwrap();
        eval(grads.iter()).unwrap();
        grads
    };
    let (ours, theirs) = (grad_of(true), grad_of(false));
    for (i, what) in ["queries", "keys", "values"].iter().enumerate() {
        assert_eq!(ours[i].shape(), theirs[i].shape(), "{what}");
        // Flattened: a reshape copies a strided gradient into row order.
        let flat = |a: &Array| a.reshape(&[-1]).unwrap();
        let (got, want) = (flat(&ours[i]), flat(&theirs[i]));
        eval([&got, &want]).unwrap();
        assert_close(&got, &want, &format!("gradient wrt the {what}"));
    }
}

#[test]
fn quantized_attention_matches_mlx_lm_formulation() {
    use mlx_bun::cache::{Mask, QuantizedState};
    use mlx_bun::model::quantized_attention::quantized_sdpa;
    let mut rng = StdRng::seed_from_u64(35);
    for (bits, group_size) in [(8, 64), (4, 32), (2, 64)] {
        for (b, h, hk, l, s) in [(1, 9, 3, 1, 50), (2, 4, 2, 4, 33)] {
            let d = 64;
            let q = random_array(&mut rng, &[b, h, l, d], 1.0);
            let quantized = |rng: &mut StdRng| {
                let x = random_array(rng, &[b, hk, s, d], 1.0);
                let (w, sc, bi) = quantize(&x, group_size, bits).unwrap();
                [w, sc, bi]
            };
            let kv = QuantizedState {
                keys: quantized(&mut rng),
                values: quantized(&mut rng),
                group_size,
                bits,
                buffers: None,
            };
            // The same positions in buffers with spare room after them, as a
            // cache keeps them: attending to the first `s` reads nothing else.
            let mut spare = |a: &Array| {
                let sh = a.shape();
                let junk = random_array(&mut rng, &[sh[0], sh[1], 7, sh[3]], 1.0)
                    .as_dtype(a.dtype())
                    .unwrap();
                concatenate(&[a.clone(), junk], 2).unwrap()
            };
            let keys = kv.keys.clone().map(|a| spare(&a));
            let buffers = [keys, kv.values.clone().map(|a| spare(&a))];
            let keep: Vec<bool> = (0..b * s).map(|i| i % 5 != 1).collect();
            let bool_mask = Array::from_slice(&keep, &[b, 1, 1, s]);
            let cases = [
                (AttentionMask::None, Mask::None),
                (AttentionMask::Causal, Mask::Causal),
                (
                    AttentionMask::Array(&bool_mask),
                    Mask::Array(bool_mask.clone()),
                ),
            ];
            for (ours, theirs) in cases {
                let [kw, ks, kb] = &kv.keys;
                let [vw, vs, vb] = &kv.values;
                let got = quantized_attention(
                    &q,
                    [kw, ks, kb],
                    [vw, vs, vb],
                    (bits, group_size),
                    0.125,
                    ours,
                    None,
                )
                .unwrap()
                .unwrap();
                let [[bkw, bks, bkb], [bvw, bvs, bvb]] = &buffers;
                let from_buffers = quantized_attention(
                    &q,
                    [bkw, bks, bkb],
                    [bvw, bvs, bvb],
                    (bits, group_size),
                    0.125,
                    ours,
                    Some(s),
                )
                .unwrap()
                .unwrap();
                eval([&got, &from_buffers]).unwrap();
                assert!(
                    got.eq_values(&from_buffers).unwrap(),
                    "attention over buffers with spare positions differs"
                );
                let want = quantized_sdpa(&q, &kv, 0.125, theirs)
                    .unwrap()
                    .transpose_axes(&[0, 2, 1, 3])
                    .unwrap()
                    .reshape(&[b, l, -1])
                    .unwrap();
                eval([&got, &want]).unwrap();
                assert_close(
                    &got,
                    &want,
                    &format!("{bits}-bit attention {:?}", (b, h, l, s)),
                );
            }
        }
    }
}

/// The quantized path folds the dequantization into its products; it
/// agrees with attention over the dequantized keys and values.
#[test]
fn quantized_attention_matches_dequantized_attention() {
    let mut rng = StdRng::seed_from_u64(36);
    for bits in [2, 4, 8] {
        for (d, group_size) in [(64, 64), (64, 32), (128, 128), (128, 64), (96, 32)] {
            // Query heads per key head 5: blocks of several query vectors and a remainder.
            for (b, h, hk, l, s) in [(1, 10, 2, 1, 70), (2, 4, 4, 3, 19)] {
                let q = random_array(&mut rng, &[b, h, l, d], 1.0);
                let mut quantized = || {
                    let x = random_array(&mut rng, &[b, hk, s, d], 2.0);
                    let (w, sc, bi) = quantize(&x, group_size, bits).unwrap();
                    let dense = dequantize(&w, &sc, &bi, group_size, bits).unwrap();
                    ([w, sc, bi], dense)
                };
                let ([kw, ks, kb], k) = quantized();
                let ([vw, vs, vb], v) = quantized();
                for mask in [AttentionMask::None, AttentionMask::Causal] {
                    let got = quantized_attention(
                        &q,
                        [&kw, &ks, &kb],
                        [&vw, &vs, &vb],
                        (bits, group_size),
                        0.125,
                        mask,
                        None,
                    )
                    .unwrap()
                    .unwrap();
                    let want = attention(&q, &k, &v, 0.125, mask).unwrap().unwrap();
                    eval([&got, &want]).unwrap();
                    let g = got.as_slice::<f32>();
                    let w = want.as_slice::<f32>();
                    let scale = w.iter().fold(1.0f32, |m, x| m.max(x.abs()));
                    let worst = g
                        .iter()
                        .zip(w)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0f32, f32::max);
                    assert!(
                        worst <= 1e-5 * scale,
                        "{bits}-bit, D {d}, group {group_size}, {:?}: max difference {worst}",
                        (b, h, hk, l, s)
                    );
                }
            }
        }
    }
}

#[test]
fn silu_glu_matches_mlx() {
    let mut rng = StdRng::seed_from_u64(37);
    for (rows, out, inp, group_size, bits) in [
        (1, 1536, 576, 64, 4),
        (3, 96, 128, 32, 8),
        (16, 64, 256, 128, 4),
    ] {
        let gate = random_layer(&mut rng, out, inp, group_size, bits);
        let up = random_layer(&mut rng, out, inp, group_size, bits);
        let x = random_array(&mut rng, &[1, rows, inp], 1.0);
        let got = quantized_silu_glu(
            &x,
            [&gate.w, &gate.scales, &gate.biases],
            [&up.w, &up.scales, &up.biases],
            gate.spec,
        )
        .unwrap()
        .expect("the CPU kernel applies");
        let g = mlx_reference(&x, &gate);
        let want = &(&g * &mlx_rs::ops::sigmoid(&g).unwrap()) * &mlx_reference(&x, &up);
        eval([&got, &want]).unwrap();
        assert_close(&got, &want, &format!("SwiGLU {:?}", (rows, out, inp, bits)));
    }
}

#[test]
fn silu_glu_gradient_matches_mlx() {
    let mut rng = StdRng::seed_from_u64(39);
    let gate = random_layer(&mut rng, 64, 128, 64, 4);
    let up = random_layer(&mut rng, 64, 128, 64, 4);
    let x = random_array(&mut rng, &[1, 2, 128], 1.0);
    let grad_of = |ours: bool| {
        let f = |args: &[Array]| -> Result<Vec<Array>, Exception> {
            let y = if ours {
                quantized_silu_glu(
                    &args[0],
                    [&gate.w, &gate.scales, &gate.biases],
                    [&up.w, &up.scales, &up.biases],
                    gate.spec,
                )
                .map_err(|e| Exception::custom(e.to_string()))?
                .expect("the CPU kernel applies")
            } else {
                let g = mlx_reference(&args[0], &gate);
                &(&g * &mlx_rs::ops::sigmoid(&g)?) * &mlx_reference(&args[0], &up)
            };
            Ok(vec![(&y * &y).sum(None)?])
        };
        let mut vg = value_and_grad_with_argnums(f, &[0][..]);
        let (_, grads) = vg(std::slice::from_ref(&x)).unwrap();
        eval(grads.iter()).unwrap();
        grads
    };
    assert_close(
        &grad_of(true)[0],
        &grad_of(false)[0],
        "SwiGLU gradient wrt x",
    );
}

/// The fused attention-input primitive gives, bit for bit, what the three
/// products, the reshapes to heads and the two RoPE primitives give apart:
/// grouped heads, partial rotation, explicit frequencies, a shared and a
/// per-row start, several rows and tokens, 4 and 8 bits.
#[test]
fn qkv_rope_equals_the_separate_operations() {
    let mut rng = StdRng::seed_from_u64(31);
    let freqs = Array::from_slice(
        &(0..16).map(|i| 1.0 + i as f32 * 2.5).collect::<Vec<_>>(),
        &[16],
    );
    let offsets = Array::from_slice(&[3i32, 40], &[2]);
    // (B, L, heads, kv_heads, head_dim, rope dims, base or freqs, per-row, bits)
    type Case<'a> = (i32, i32, i32, i32, i32, i32, Option<&'a Array>, bool, i32);
    let cases: Vec<Case> = vec![
        (1, 1, 9, 3, 64, 64, None, false, 4),
        (1, 5, 4, 2, 64, 32, None, false, 8),
        (2, 1, 4, 4, 32, 32, Some(&freqs), true, 4),
        (2, 3, 6, 2, 32, 32, None, true, 4),
    ];
    for (b, l, heads, kv_heads, head_dim, dims, f, per_row, bits) in cases {
        let hidden = 128;
        let q = random_layer(&mut rng, heads * head_dim, hidden, 32, bits);
        let k = random_layer(&mut rng, kv_heads * head_dim, hidden, 32, bits);
        let v = random_layer(&mut rng, kv_heads * head_dim, hidden, 32, bits);
        let x = random_array(&mut rng, &[b, l, hidden], 1.0);
        let params = RopeParams {
            dims,
            traditional: false,
            base: f.is_none().then_some(10000.0),
            scale: 1.0,
            freqs: f,
        };
        let start = if per_row {
            RopeStart::PerRow(&offsets)
        } else {
            RopeStart::Shared(17)
        };
        let heads_of = AttentionHeads {
            heads,
            kv_heads,
            head_dim,
        };
        let [fq, fk, fv] = quantized_qkv_rope(
            &x,
            [planes(&q), planes(&k), planes(&v)],
            q.spec,
            heads_of,
            &params,
            start,
        )
        .unwrap()
        .expect("the primitive takes these operands");
        let apart = |layer: &Layer, n: i32, rotate: bool| -> Array {
            let y =
                cpu_quantized_matmul(&x, &layer.w, &layer.scales, &layer.biases, 32, bits).unwrap();
            let y = y
                .reshape(&[b, l, n, head_dim])
                .unwrap()
                .transpose_axes(&[0, 2, 1, 3])
                .unwrap();
            match (rotate, per_row) {
                (false, _) => y,
                (true, true) => mlx_bun::kernels::rope_per_row(&y, &params, &offsets).unwrap(),
                (true, false) => mlx_bun::kernels::rope(&y, &params, 17).unwrap(),
            }
        };
        let want = [
            apart(&q, heads, true),
            apart(&k, kv_heads, true),
            apart(&v, kv_heads, false),
        ];
        for (name, (got, want)) in ["q", "k", "v"].iter().zip([fq, fk, fv].iter().zip(&want)) {
            assert_eq!(got.shape(), want.shape(), "{name} shape");
            let same = mlx_rs::ops::array_eq(got, want, false).unwrap();
            assert!(
                same.item_cast::<bool>(),
                "{name} of case {:?} differs",
                (b, l, heads, kv_heads, head_dim, dims, per_row, bits)
            );
        }
    }
}

fn planes(layer: &Layer) -> [&Array; 3] {
    [&layer.w, &layer.scales, &layer.biases]
}

/// The bits of each entry, every NaN alike.
fn bits(a: &Array) -> Vec<u32> {
    a.as_slice::<f32>()
        .iter()
        .map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() })
        .collect()
}

#[test]
fn log_softmax_equals_mlx_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(11);
    let vocab = 49_157;
    let mut rows: Vec<Vec<f32>> = Vec::new();
    for scale in [1.0f32, 8.0, 30.0, 120.0] {
        rows.push((0..vocab).map(|_| rng.gen_range(-scale..scale)).collect());
    }
    // Masked entries, a spike past exp's range, signed zeros, a NaN, a row
    // with nothing visible.
    let mut masked = rows[1].clone();
    for v in masked.iter_mut().step_by(3) {
        *v = f32::NEG_INFINITY;
    }
    masked[7] = 500.0;
    masked[8] = -0.0;
    masked[9] = 0.0;
    rows.push(masked);
    let mut nan = rows[0].clone();
    nan[1234] = f32::NAN;
    rows.push(nan);
    rows.push(vec![f32::NEG_INFINITY; vocab]);
    for (i, row) in rows.iter().enumerate() {
        let x = Array::from_slice(row, &[1, vocab as i32]);
        let ours = mlx_bun::kernels::log_softmax(&x).unwrap();
        let mlx = &x - &mlx_rs::ops::logsumexp_axis(&x, -1, true).unwrap();
        eval([&ours, &mlx]).unwrap();
        assert_eq!(bits(&ours), bits(&mlx), "row {i}");
    }
    // Several rows at once, and a transposed (strided) input.
    let data: Vec<f32> = (0..4 * 1000).map(|_| rng.gen_range(-20.0..20.0)).collect();
    let x = Array::from_slice(&data, &[1000, 4])
        .transpose_axes(&[1, 0])
        .unwrap();
    let ours = mlx_bun::kernels::log_softmax(&x).unwrap();
    let mlx = &x - &mlx_rs::ops::logsumexp_axis(&x, -1, true).unwrap();
    eval([&ours, &mlx]).unwrap();
    assert_eq!(bits(&ours), bits(&mlx), "strided rows");
}

#[test]
fn product_plus_residual_equals_the_separate_add_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(577);
    for (out, inp, width, rows) in [(576, 1536, 4, 1), (576, 576, 4, 3), (300, 256, 8, 16)] {
        let layer = random_layer(&mut rng, out, inp, 32, width);
        let x = random_array(&mut rng, &[1, rows, inp], 1.0);
        let plain = random_array(&mut rng, &[1, rows, out], 4.0);
        // A residual read through strides: the transpose of a [1, out, rows] array.
        let strided = random_array(&mut rng, &[1, out, rows], 4.0)
            .transpose_axes(&[0, 2, 1])
            .unwrap();
        for residual in [&plain, &strided] {
            let product =
                cpu_quantized_matmul(&x, &layer.w, &layer.scales, &layer.biases, 32, width)
                    .unwrap();
            let want = residual + &product;
            let got = quantized_matmul_add(&x, planes(&layer), residual, layer.spec)
                .unwrap()
                .expect("the kernel takes a float32 residual of the product's shape");
            eval([&got, &want]).unwrap();
            assert_eq!(
                bits(&got),
                bits(&want),
                "{out}x{inp} {width}-bit, {rows} rows"
            );
        }
        // A residual of another shape is left to the separate add.
        let wrong = random_array(&mut rng, &[1, rows, out + 1], 1.0);
        assert!(quantized_matmul_add(&x, planes(&layer), &wrong, layer.spec)
            .unwrap()
            .is_none());
    }
}

#[test]
fn attention_over_a_prefix_of_the_buffers_equals_attention_over_its_slice() {
    let mut rng = StdRng::seed_from_u64(256);
    let keys = random_array(&mut rng, &[1, 3, 256, 64], 1.0);
    let values = random_array(&mut rng, &[1, 3, 256, 64], 1.0);
    for (queries, len) in [(1, 1), (1, 77), (5, 77), (9, 256)] {
        let q = random_array(&mut rng, &[1, 9, queries, 64], 1.0);
        let mask = if queries == 1 {
            AttentionMask::None
        } else {
            AttentionMask::Causal
        };
        let k = keys.index((.., .., ..len, ..));
        let v = values.index((.., .., ..len, ..));
        let want = attention(&q, &k, &v, 0.125, mask).unwrap().unwrap();
        let got = attention_over(&q, &keys, &values, 0.125, mask, Some(len))
            .unwrap()
            .unwrap();
        eval([&got, &want]).unwrap();
        assert_eq!(bits(&got), bits(&want), "{queries} queries over {len} keys");
    }
    let q = random_array(&mut rng, &[1, 9, 1, 64], 1.0);
    let err = attention_over(&q, &keys, &values, 0.125, AttentionMask::None, Some(257))
        .expect_err("more keys than stored is an error");
    assert!(
        err.to_string().contains("more keys than the cache holds"),
        "{err}"
    );
}

#[test]
fn gradient_through_a_prefix_of_the_buffers_is_the_slices_gradient_then_zeros() {
    let mut rng = StdRng::seed_from_u64(257);
    let keys = random_array(&mut rng, &[1, 2, 32, 16], 1.0);
    let values = random_array(&mut rng, &[1, 2, 32, 16], 1.0);
    let q = random_array(&mut rng, &[1, 4, 11, 16], 1.0);
    let len = 11;
    let grad_of = |over_buffers: bool| {
        let f = move |args: &[Array]| -> Result<Vec<Array>, Exception> {
            let out = if over_buffers {
                attention_over(
                    &args[0],
                    &args[1],
                    &args[2],
                    0.25,
                    AttentionMask::Causal,
                    Some(len),
                )
            } else {
                let k = args[1].index((.., .., ..len, ..));
                let v = args[2].index((.., .., ..len, ..));
                attention(&args[0], &k, &v, 0.25, AttentionMask::Causal)
            }
            .map_err(|e| Exception::custom(e.to_string()))?
            .expect("the CPU kernel takes these shapes");
            Ok(vec![(&out * &out).sum_axes(&[0, 1, 2], None)?])
        };
        let mut vg = value_and_grad_with_argnums(f, &[0, 1, 2][..]);
        let (_, grads) = vg(&[q.clone(), keys.clone(), values.clone()]).unwrap();
        eval(grads.iter()).unwrap();
        grads
    };
    let (ours, sliced) = (grad_of(true), grad_of(false));
    assert_close(&ours[0], &sliced[0], "gradient wrt the queries");
    for (i, what) in [(1, "keys"), (2, "values")] {
        assert_eq!(ours[i].shape(), keys.shape(), "gradient wrt the {what}");
        assert_close(&ours[i], &sliced[i], &format!("gradient wrt the {what}"));
    }
}

/// The embedding primitive equals MLX's `take` of the three tables and its
/// `dequantize`, bit for bit: 2, 4 and 8 bits, groups of 32/64/128, ids of
/// any shape, repeated and negative (counted from the end, as `take` does).
#[test]
fn quantized_embedding_rows_equal_mlx_take_and_dequantize_bit_for_bit() {
    let mut rng = StdRng::seed_from_u64(21);
    for (bits, group_size) in [(2, 32), (4, 32), (4, 64), (8, 32), (8, 128)] {
        let l = random_layer(&mut rng, 50, 256, group_size, bits);
        for (ids, shape) in [
            (vec![7], vec![1, 1]),
            (vec![0, 49, 7, 7, -1, 3], vec![2, 3]),
            (vec![12, 5, 31], vec![3]),
        ] {
            let ids = Array::from_slice(&ids, &shape);
            let got = quantized_embedding(&ids, [&l.w, &l.scales, &l.biases], l.spec)
                .unwrap()
                .expect("the primitive applies on the CPU");
            let take = |a: &Array| a.take_axis(&ids, 0).unwrap();
            let want = dequantize(
                take(&l.w),
                take(&l.scales),
                &take(&l.biases),
                group_size,
                bits,
            )
            .unwrap();
            eval([&got, &want]).unwrap();
            let what = format!("{bits} bits, group {group_size}, ids {shape:?}");
            assert_eq!(got.shape(), want.shape(), "{what}");
            assert_eq!(got.as_slice::<f32>(), want.as_slice::<f32>(), "{what}");
        }
    }
}
