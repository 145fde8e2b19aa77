//! mlx-bun's CUDA decode attention kernel (`kernels/cuda/decode_attention.cu`)
//! run on the CPU: the kernel's source, compiled by the C++ compiler with
//! `tests/cuda_emulation/cuda_shim.h` (one OS thread per CUDA thread, warp
//! shuffles and block barriers as barriers), against MLX's RoPE and
//! attention on the same bfloat16 heads and caches. It checks what a GPU
//! run checks (`bench attention --check`) where no GPU is: the heads'
//! outputs, the rotated key and the value written at the new position, and
//! every other cached position left as it was.

use std::path::Path;

use common::cuda_emulation::{build, floats, random, read, relative, run, write};
use mlx_rs::fast::{rope, scaled_dot_product_attention};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};

mod common;

struct Case {
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    traditional: bool,
    freqs: bool,
    /// The new token's position: positions before it are cached.
    position: i32,
}

const BASE: f32 = 10000.0;

fn check(exe: &Path, dir: &Path, case: &Case) {
    let (h, kvh, d, pos) = (case.heads, case.kv_heads, case.head_dim, case.position);
    let capacity = (pos + 256) / 256 * 256;
    let bf16 = Dtype::Bfloat16;
    let q = random(&[1, h, 1, d], bf16);
    let k = random(&[1, kvh, 1, d], bf16);
    let v = random(&[1, kvh, 1, d], bf16);
    let keys = random(&[1, kvh, capacity, d], bf16);
    let values = random(&[1, kvh, capacity, d], bf16);
    let freqs = Array::from_iter(
        (0..d / 2).map(|i| BASE.powf(2.0 * i as f32 / d as f32) * (1.0 + (i % 3) as f32 * 0.5)),
        &[d / 2],
    );
    for (name, a) in [
        ("q", &q),
        ("k", &k),
        ("v", &v),
        ("keys", &keys),
        ("values", &values),
        ("freqs", &freqs),
    ] {
        write(dir.join(name), a);
    }
    let scale = (d as f32).powf(-0.5);
    let mut args = vec![dir.display().to_string()];
    args.extend(
        [
            1,
            h,
            kvh,
            d,
            capacity,
            pos,
            case.traditional as i32,
            case.freqs as i32,
        ]
        .map(|n| n.to_string()),
    );
    args.extend([scale, 1.0, BASE.log2()].map(|f| f.to_string()));
    run(exe, &args);

    // MLX's RoPE on the bfloat16 heads, then attention in float32 over the
    // cache with the rotated key and the value written at `pos`.
    let rotated = |x: &Array| -> Array {
        let (base, f) = if case.freqs {
            (None, Some(&freqs))
        } else {
            (Some(BASE), None)
        };
        rope(x, d, case.traditional, base, 1.0, pos, f).unwrap()
    };
    let (qr, kr) = (rotated(&q), rotated(&k));
    let new_keys = mlx_bun::mlx_ext::slice_update(&keys, &kr, &[0, 0, pos, 0]).unwrap();
    let new_values = mlx_bun::mlx_ext::slice_update(&values, &v, &[0, 0, pos, 0]).unwrap();
    let f32_live = |a: &Array| {
        a.index((.., .., ..pos + 1, ..))
            .as_dtype(Dtype::Float32)
            .unwrap()
    };
    let reference = scaled_dot_product_attention(
        qr.as_dtype(Dtype::Float32).unwrap(),
        f32_live(&new_keys),
        f32_live(&new_values),
        scale,
        None,
        None,
    )
    .unwrap();

    let name = format!(
        "{h}x{kvh}:{d} at {pos}, {}",
        match (case.traditional, case.freqs) {
            (true, true) => "adjacent pairs, given frequencies",
            (true, false) => "adjacent pairs",
            (false, true) => "halves, given frequencies",
            (false, false) => "halves",
        }
    );
    let out_diff = relative(&read(dir.join("out")), &floats(&reference));
    assert!(out_diff < 1e-2, "{name}: output differs by {out_diff:.2e}");
    // The rotated key at `pos` as MLX rounds it (the same formula: at most
    // a last-bit difference in the angle), the value exactly, and every
    // other position untouched.
    let key_diff = relative(&read(dir.join("keys")), &floats(&new_keys));
    assert!(key_diff < 1e-2, "{name}: keys differ by {key_diff:.2e}");
    let ours_keys = read(dir.join("keys"));
    let before = floats(&keys);
    let row = |i: usize| (i / d as usize) % capacity as usize;
    for (i, (a, b)) in ours_keys.iter().zip(&before).enumerate() {
        if row(i) != pos as usize {
            assert_eq!(a.to_bits(), b.to_bits(), "{name}: key {i} changed");
        }
    }
    assert_eq!(
        read(dir.join("values")),
        floats(&new_values),
        "{name}: values"
    );
}

#[test]
fn decode_attention_kernel_matches_mlx_rope_and_attention() {
    let work = tempfile::tempdir().unwrap();
    let exe = build(work.path(), "decode_attention");
    let cases = [
        // Llama 3 8B's heads: four query heads per key head.
        (32, 8, 128, false, false, 0),
        (32, 8, 128, false, false, 17),
        (32, 8, 128, false, true, 300),
        (32, 8, 128, true, false, 45),
        (32, 8, 128, true, true, 9),
        // One key head per query head, 64 features.
        (16, 16, 64, false, false, 37),
        (16, 16, 64, false, true, 255),
        // One key head for eight query heads, 256 features.
        (8, 1, 256, true, false, 70),
        (8, 1, 256, false, false, 3),
    ];
    for (heads, kv_heads, head_dim, traditional, freqs, position) in cases {
        check(
            &exe,
            work.path(),
            &Case {
                heads,
                kv_heads,
                head_dim,
                traditional,
                freqs,
                position,
            },
        );
    }
}
