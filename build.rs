//! Link-time setup of the binary:
//! - an rpath to the MLX library, so it runs without LD_PRELOAD or LD_LIBRARY_PATH;
//! - on Linux, OpenBLAS linked ahead of the reference BLAS that the `mlx-cpu`
//!   wheel bundles. MLX's CPU backend runs every float matmul through BLAS; with
//!   OpenBLAS a float32 forward pass is several times faster. `MLX_BUN_BLAS=reference`
//!   keeps the bundled one.
//! - mlx-bun's own CPU kernels (`kernels/cpu`), compiled against the same MLX
//!   headers as mlx-c; on x86-64 the AVX2 and AVX-512 variants are built with
//!   their own target flags and chosen at run time.

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
    compile_kernels();
}

fn compile_kernels() {
    println!("cargo:rerun-if-changed=kernels");
    let prefix = std::env::var("DEP_MLX_PREFIX").expect("mlx-sys exports the MLX prefix");
    let mlx_c = std::env::var("DEP_MLX_MLXC").expect("mlx-sys exports the mlx-c sources");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let base = || {
        let mut b = cc::Build::new();
        b.cpp(true)
            .std("c++20")
            .opt_level(3)
            .warnings(false)
            .include("kernels/cpu")
            .include(format!("{prefix}/include"))
            .include(&mlx_c);
        b
    };
    let mut main = base();
    main.file("kernels/cpu/qmv.cpp")
        .file("kernels/cpu/primitive.cpp")
        .file("kernels/cpu/norm_rope.cpp")
        .file("kernels/cpu/attention.cpp")
        .file("kernels/cpu/qkv_rope.cpp")
        .file("kernels/cpu/embedding.cpp")
        // Same operation order as MLX's unfused ops: no contraction into FMAs.
        .flag("-ffp-contract=off");
    // Floating-point exceptions are never read: without their ordering
    // constraints the exponentials vectorize (the values are the same).
    let log_softmax = base()
        .file("kernels/cpu/log_softmax.cpp")
        .flag("-ffp-contract=off")
        .flag("-fno-trapping-math")
        .compile_intermediates();
    main.objects(log_softmax);
    if arch == "x86_64" {
        main.define("MLX_BUN_HAVE_AVX512", None)
            .define("MLX_BUN_HAVE_AVX2", None);
        // One archive for all: the wide variants are objects built with
        // their own flags and added to it.
        let unit = |file: &str, flags: &[&str]| {
            let mut b = base();
            b.file(file);
            for flag in flags {
                b.flag(flag);
            }
            b.compile_intermediates()
        };
        const AVX512: &[&str] = &["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma"];
        let avx512 = unit("kernels/cpu/qmv_avx512.cpp", AVX512);
        let avx2 = unit("kernels/cpu/qmv_avx2.cpp", &["-mavx2", "-mfma"]);
        let int8_avx512 = unit("kernels/cpu/qmv_int8_avx512.cpp", AVX512);
        let int8_vnni = unit(
            "kernels/cpu/qmv_int8_vnni.cpp",
            &[AVX512, &["-mavx512vnni"]].concat(),
        );
        main.objects(avx512)
            .objects(avx2)
            .objects(int8_avx512)
            .objects(int8_vnni);
    } else if arch == "aarch64" {
        main.file("kernels/cpu/qmv_neon.cpp");
    }
    main.compile("mlxbun_kernels");
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
