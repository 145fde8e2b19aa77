//! Raw bindings to mlx-c, built against a prebuilt MLX (see `build.rs`).
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case, clippy::all)]
include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// mlx-rs seeds its random state with the macOS-only `mach_approximate_time`.
#[cfg(not(target_vendor = "apple"))]
#[no_mangle]
pub extern "C" fn mach_approximate_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
