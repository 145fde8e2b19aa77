//! Small helpers over mlx-rs: dtype policy, device queries and memory figures.

use anyhow::{Context, Result};
use mlx_rs::{Array, Dtype};

/// The dtype activations are computed in. MLX's CPU backend is fast only in
/// float32, so on CPU every floating tensor is promoted; on an accelerator the
/// model's own dtype is kept.
pub(crate) fn compute_dtype(stored: Dtype) -> Dtype {
    if on_gpu() {
        stored
    } else {
        Dtype::Float32
    }
}

/// True when MLX has a GPU (the CUDA or Metal build on a machine with one).
pub fn on_gpu() -> bool {
    static ON_GPU: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON_GPU.get_or_init(|| {
        if let Ok(forced) = std::env::var("MLX_BUN_DEVICE") {
            return forced == "gpu";
        }
        let mut available = false;
        // SAFETY: plain queries of the MLX runtime; the device handle is freed.
        unsafe {
            let dev = mlx_sys::mlx_device_new_type(mlx_sys::mlx_device_type__MLX_GPU, 0);
            let rc = mlx_sys::mlx_device_is_available(&mut available, dev);
            mlx_sys::mlx_device_free(dev);
            rc == 0 && available
        }
    })
}

pub fn is_float(dtype: Dtype) -> bool {
    matches!(
        dtype,
        Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float64
    )
}

/// Casts a floating array to `dtype`; other arrays are returned as they are.
pub(crate) fn cast_float(a: Array, dtype: Dtype) -> Result<Array> {
    if is_float(a.dtype()) && a.dtype() != dtype {
        Ok(a.as_dtype(dtype).context("cast")?)
    } else {
        Ok(a)
    }
}

pub fn peak_memory_bytes() -> usize {
    mlx_rs::memory::peak_memory().unwrap_or(0)
}

pub fn reset_peak_memory() {
    let _ = mlx_rs::memory::reset_peak_memory();
}

pub fn dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Float32 => "float32",
        Dtype::Float16 => "float16",
        Dtype::Bfloat16 => "bfloat16",
        Dtype::Float64 => "float64",
        Dtype::Uint32 => "uint32",
        Dtype::Int32 => "int32",
        Dtype::Uint8 => "uint8",
        Dtype::Int64 => "int64",
        Dtype::Bool => "bool",
        _ => "other",
    }
}

pub fn parse_dtype(name: &str) -> Option<Dtype> {
    Some(match name {
        "float32" | "f32" => Dtype::Float32,
        "float16" | "f16" => Dtype::Float16,
        "bfloat16" | "bf16" => Dtype::Bfloat16,
        _ => return None,
    })
}

#[cfg(openblas)]
extern "C" {
    fn openblas_set_num_threads(n: std::os::raw::c_int);
}

/// One-time runtime setup before MLX runs anything. OpenBLAS's own thread
/// pool deadlocks when MLX's CPU workers call it concurrently, so BLAS calls
/// run in the calling thread.
pub(crate) fn init_runtime() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        #[cfg(openblas)]
        // SAFETY: plain setter of OpenBLAS's thread count, called once.
        unsafe {
            openblas_set_num_threads(1)
        };
    });
}
