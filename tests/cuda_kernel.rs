//! mlx-bun's CUDA quantized matrix-vector kernel (`kernels/cuda/qmv.cu`)
//! and decode attention kernel (`kernels/cuda/decode_attention.cu`).
//! On a machine with an NVIDIA GPU, its output must equal MLX's
//! `quantized_matmul` within float tolerance for 4- and 8-bit weights and
//! 1-4 rows (bfloat16 and float16 activations). CI has no GPU: there the kernel check is skipped, saying so, and
//! the command must refuse clearly instead.

mod common;

fn has_gpu() -> bool {
    mlx_bun::mlx_ext::on_gpu()
}

#[test]
fn kernel_matches_mlx_quantized_matmul_or_refuses_without_a_gpu() {
    let cases: &[&[&str]] = &[
        &["--bits", "4", "--group-size", "64", "--rows", "1,3,4"],
        &["--bits", "4", "--group-size", "32", "--rows", "1"],
        &["--bits", "8", "--group-size", "64", "--rows", "1,2"],
        &[
            "--bits",
            "4",
            "--group-size",
            "64",
            "--rows",
            "2",
            "--dtype",
            "float16",
        ],
        &[
            "--bits",
            "4",
            "--group-size",
            "64",
            "--rows",
            "1,4",
            "--glu",
        ],
    ];
    for case in cases {
        let mut args = vec![
            "bench", "qmv", "--check", "--json", "--runs", "1", "--batch", "4",
        ];
        args.extend(["--shapes", "1024x4096,4096x1024,600x2048"]);
        args.extend_from_slice(case);
        let out = common::bin().args(&args).output().expect("running mlx-bun");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if has_gpu() {
            assert!(out.status.success(), "bench qmv {case:?} failed: {stderr}");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let rows: Vec<serde_json::Value> = stdout
                .lines()
                .map(|l| serde_json::from_str(l).expect("a JSON line"))
                .collect();
            assert!(!rows.is_empty(), "no results for {case:?}");
            for row in rows {
                let tolerance = if row["glu"] == true { 2e-2 } else { 1e-2 };
                assert!(row["max_rel_diff"].as_f64().unwrap() <= tolerance, "{row}");
            }
        } else {
            assert_eq!(out.status.code(), Some(1), "{stderr}");
            assert!(stderr.contains("needs a GPU"), "{stderr}");
        }
    }
    if !has_gpu() {
        eprintln!("skipped: no GPU here, so the CUDA kernel's output was not compared (the refusal was checked)");
    }
}

/// The decode attention kernel against MLX's nodes (`bench attention
/// --check`) on a GPU; the same clear refusal without one.
#[test]
fn decode_attention_matches_mlx_or_refuses_without_a_gpu() {
    let out = common::bin()
        .args([
            "bench",
            "attention",
            "--check",
            "--json",
            "--runs",
            "1",
            "--batch",
            "4",
        ])
        .args([
            "--heads",
            "32x8:128,16x16:64,8x1:256",
            "--context",
            "0,17,300",
        ])
        .output()
        .expect("running mlx-bun");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !has_gpu() {
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("needs a GPU"), "{stderr}");
        eprintln!("skipped: no GPU here, so the decode attention kernel ran only emulated (tests/cuda_attention_emulated.rs); the refusal was checked");
        return;
    }
    assert!(out.status.success(), "bench attention failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(rows.len(), 3 * 3 * 3 - 3, "{stdout}");
    for row in rows {
        assert!(row["max_rel_diff"].as_f64().unwrap() <= 2e-2, "{row}");
        assert!(row["cache_rel_diff"].as_f64().unwrap() <= 1e-2, "{row}");
    }
}
