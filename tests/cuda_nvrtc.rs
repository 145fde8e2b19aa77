//! mlx-bun's CUDA kernels (`kernels/cuda`) compile with NVRTC as MLX's
//! custom-kernel API wraps them, for an H100/H200, every instantiation the
//! routing can ask for: checked on machines without a GPU
//! (`scripts/cuda/nvrtc_check.py`, NVRTC from `scripts/cuda/nvrtc-setup.sh`).

use std::process::Command;

mod common;

#[test]
fn cuda_kernels_compile_with_nvrtc() {
    let root = common::repo_root();
    let dir = mlx_bun::hub::cache_dir().join("nvrtc-12.9.86");
    let lib = dir.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
    let include = dir.join("nvidia/cuda_runtime/include");
    if !lib.is_file() || !include.join("cuda_bf16.h").is_file() {
        common::missing(
            &format!("NVRTC and the CUDA headers at {}", dir.display()),
            "run scripts/cuda/nvrtc-setup.sh",
        );
        return;
    }
    let out = Command::new("python3")
        .arg(root.join("scripts/cuda/nvrtc_check.py"))
        .arg(&lib)
        .arg(&include)
        .arg(root.join("kernels/cuda"))
        .output()
        .expect("running python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "NVRTC failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for kernel in [
        "mlx_bun_decode_attention",
        "mlx_bun_qmv",
        "mlx_bun_qmv_qkv_norm",
        "mlx_bun_qmv_glu_norm",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(kernel) && l.ends_with(": ok")),
            "{kernel} was not compiled:\n{stdout}"
        );
    }
}
