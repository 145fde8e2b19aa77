//! Link-time setup of the binary:
//! - an rpath to the MLX library, so it runs without LD_PRELOAD or LD_LIBRARY_PATH;
//! - on Linux, OpenBLAS linked ahead of the reference BLAS that the `mlx-cpu`
//!   wheel bundles. MLX's CPU backend runs every float matmul through BLAS; with
//!   OpenBLAS a float32 forward pass is several times faster. `MLX_BUN_BLAS=reference`
//!   keeps the bundled one.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(openblas)");
    println!("cargo:rerun-if-env-changed=MLX_BUN_BLAS");
    if let Ok(dir) = std::env::var("DEP_MLX_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let choice = std::env::var("MLX_BUN_BLAS").unwrap_or_else(|_| "auto".into());
    if target_os == "linux" && choice != "reference" {
        link_openblas(choice == "openblas");
    }
}

fn link_openblas(required: bool) {
    let dirs = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ];
    let found = dirs
        .iter()
        .find(|d| Path::new(d).join("libopenblas.so.0").exists());
    match found {
        Some(dir) => {
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
            println!("cargo:rustc-link-arg=-l:libopenblas.so.0");
            println!("cargo:rustc-link-arg=-Wl,--as-needed");
            println!("cargo:rustc-cfg=openblas");
        }
        None if required => panic!("MLX_BUN_BLAS=openblas but libopenblas.so.0 was not found"),
        None => println!(
            "cargo:warning=OpenBLAS not found (Debian: libopenblas0-pthread); float32 matmuls use the slow reference BLAS"
        ),
    }
}
