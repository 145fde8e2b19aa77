//! mlx-bun's CUDA decode attention kernel (`kernels/cuda/decode_attention.cu`)
//! run on the CPU: the kernel's source, compiled by the C++ compiler with
//! `tests/cuda_emulation/cuda_shim.h` (one OS thread per CUDA thread, warp
//! shuffles and block barriers as barriers), against MLX's RoPE and
//! attention on the same bfloat16 heads and caches. It checks what a GPU
//! run checks (`bench attention --check`) where no GPU is: the heads'
//! outputs, the rotated key and the value written at the new position, and
//! every other cached position left as it was.

use std::path::{Path, PathBuf};
use std::process::Command;

use mlx_rs::fast::{rope, scaled_dot_product_attention};
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::transforms::eval;
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

/// The emulated kernel, built once into `dir`.
fn build(dir: &Path) -> PathBuf {
    let root = common::repo_root();
    let include = dir.join("include");
    std::fs::create_dir_all(&include).unwrap();
    // The CUDA headers the kernel includes; the shim defines what it uses.
    for header in ["cuda_bf16.h", "cuda_fp16.h"] {
        std::fs::write(include.join(header), "").unwrap();
    }
    let exe = dir.join("decode_attention");
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&compiler)
        .args([
            "-std=c++20",
            "-O2",
            "-pthread",
            "-Wall",
            "-Wno-unknown-pragmas",
        ])
        .arg("-I")
        .arg(&include)
        .arg("-I")
        .arg(root.join("kernels/cuda"))
        .arg("-I")
        .arg(root.join("tests/cuda_emulation"))
        .arg("-o")
        .arg(&exe)
        .arg(root.join("tests/cuda_emulation/decode_attention.cpp"))
        .output()
        .unwrap_or_else(|e| panic!("running the C++ compiler {compiler}: {e}"));
    assert!(
        out.status.success(),
        "compiling the emulated kernel: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn random_bf16(shape: &[i32]) -> Array {
    let a = mlx_rs::random::normal::<f32>(shape, None, None, None)
        .unwrap()
        .as_dtype(Dtype::Bfloat16)
        .unwrap();
    eval([&a]).unwrap();
    a
}

fn floats(a: &Array) -> Vec<f32> {
    let a = a.as_dtype(Dtype::Float32).unwrap();
    eval([&a]).unwrap();
    a.as_slice::<f32>().to_vec()
}

fn write(path: PathBuf, a: &Array) {
    let bytes: Vec<u8> = floats(a).iter().flat_map(|f| f.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap();
}

fn read(path: PathBuf) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// The largest difference relative to the largest reference value.
fn relative(ours: &[f32], reference: &[f32]) -> f32 {
    assert_eq!(ours.len(), reference.len());
    let diff = ours
        .iter()
        .zip(reference)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    if ours.iter().any(|x| x.is_nan()) {
        return f32::NAN;
    }
    diff / max_abs(reference).max(f32::MIN_POSITIVE)
}

fn check(exe: &Path, dir: &Path, case: &Case) {
    let (h, kvh, d, pos) = (case.heads, case.kv_heads, case.head_dim, case.position);
    let capacity = (pos + 256) / 256 * 256;
    let q = random_bf16(&[1, h, 1, d]);
    let k = random_bf16(&[1, kvh, 1, d]);
    let v = random_bf16(&[1, kvh, 1, d]);
    let keys = random_bf16(&[1, kvh, capacity, d]);
    let values = random_bf16(&[1, kvh, capacity, d]);
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
    let out = Command::new(exe)
        .arg(dir)
        .args(
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
        )
        .args([scale, 1.0, BASE.log2()].map(|f| f.to_string()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the emulated kernel: {}",
        String::from_utf8_lossy(&out.stderr)
    );

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
    let exe = build(work.path());
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
