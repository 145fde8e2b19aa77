//! Small helpers over mlx-rs: dtype policy, device queries and memory figures.

use anyhow::{Context, Result};
use mlx_rs::{Array, Dtype};

/// How a model's floating tensors are computed (`--compute-dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ComputeDtype {
    /// float32 on the CPU (the only fast float dtype of MLX's CPU backend),
    /// the model's own dtype on a GPU.
    #[default]
    Auto,
    /// The dtype the weights are stored in, on every device: what mlx-lm does.
    Model,
    /// float32 everywhere.
    Float32,
}

impl ComputeDtype {
    /// The dtype for a model whose floating tensors are stored as `stored`.
    pub fn resolve(self, stored: Dtype) -> Dtype {
        match self {
            ComputeDtype::Auto if on_gpu() => stored,
            ComputeDtype::Model => stored,
            ComputeDtype::Auto | ComputeDtype::Float32 => Dtype::Float32,
        }
    }
}

impl std::str::FromStr for ComputeDtype {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "model" => Ok(Self::Model),
            "float32" | "f32" => Ok(Self::Float32),
            other => Err(format!(
                "unknown compute dtype {other:?} (auto, model or float32)"
            )),
        }
    }
}

/// The dtype most floating tensors of a checkpoint are stored in (float32
/// when it has none).
pub(crate) fn stored_float_dtype(dtypes: impl IntoIterator<Item = Dtype>) -> Dtype {
    let mut counts: Vec<(Dtype, usize)> = Vec::new();
    for d in dtypes.into_iter().filter(|&d| is_float(d)) {
        match counts.iter_mut().find(|(k, _)| *k == d) {
            Some((_, n)) => *n += 1,
            None => counts.push((d, 1)),
        }
    }
    counts
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .map_or(Dtype::Float32, |(d, _)| d)
}

/// `src` with `update` written over the block of `src` that starts at
/// `start` (one index per axis) and has `update`'s shape: a single
/// `SliceUpdate` node, where indexed assignment adds two reshapes around it.
pub fn slice_update(src: &Array, update: &Array, start: &[i32]) -> Result<Array> {
    let stop: Vec<i32> = start
        .iter()
        .zip(update.shape())
        .map(|(&s, &n)| s + n)
        .collect();
    let strides = vec![1; start.len()];
    let stream = mlx_rs::StreamOrDevice::default();
    // SAFETY: the handles and slices are valid for the call; the result is
    // owned by the returned Array on success and freed on failure.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let rc = mlx_sys::mlx_slice_update(
            &mut res,
            src.as_ptr(),
            update.as_ptr(),
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            AsRef::<mlx_rs::Stream>::as_ref(&stream).as_ptr(),
        );
        if rc != 0 {
            mlx_sys::mlx_array_free(res);
            anyhow::bail!(
                "MLX could not write a {:?} block at {start:?} into {:?}",
                update.shape(),
                src.shape()
            );
        }
        Ok(Array::from_ptr(res))
    }
}

/// The float8 (e4m3) values whose bytes `bytes` (uint8) holds, as `dtype`.
pub(crate) fn from_fp8(bytes: &Array, dtype: Dtype) -> Result<Array> {
    let what = || format!("read {:?} as float8", bytes.dtype());
    // SAFETY (inside `call`): valid handles owned by the caller.
    crate::quant::call(what, |res, _, s| unsafe {
        mlx_sys::mlx_from_fp8(res, bytes.as_ptr(), dtype as mlx_sys::mlx_dtype, s)
    })
}

/// Waits until the work queued on this thread's stream has run. A decoder
/// queues the next forward pass before it knows the sequence has ended; a
/// process that exited with that pass still running tore OpenBLAS's
/// buffers down under it (a segmentation fault on exit).
pub fn synchronize() -> anyhow::Result<()> {
    let stream = mlx_rs::Stream::thread_local_or_default();
    // SAFETY: a plain call on a valid stream handle that outlives it.
    let rc = unsafe { mlx_sys::mlx_synchronize(stream.as_ptr()) };
    if rc != 0 {
        anyhow::bail!("MLX could not finish the queued work");
    }
    Ok(())
}

/// True when MLX has a GPU (the CUDA or Metal build on a machine with one).
pub fn on_gpu() -> bool {
    static ON_GPU: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON_GPU.get_or_init(|| {
        if let Some(device) = crate::settings::get().device {
            return device == crate::settings::Device::Gpu;
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

/// Whether `dtype` is a floating-point dtype.
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

/// The most memory MLX has had allocated since start or the last
/// [`reset_peak_memory`], in bytes (0 if MLX cannot say).
pub fn peak_memory_bytes() -> usize {
    mlx_rs::memory::peak_memory().unwrap_or(0)
}

/// Restarts MLX's peak-memory count ([`peak_memory_bytes`]).
pub fn reset_peak_memory() {
    let _ = mlx_rs::memory::reset_peak_memory();
}

/// The dtype's name as config.json and the command line spell it (`bfloat16`),
/// or `other`.
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

/// The dtype a name (`float32`/`f32`, `float16`/`f16`, `bfloat16`/`bf16`)
/// stands for; `None` for anything else.
pub fn parse_dtype(name: &str) -> Option<Dtype> {
    Some(match name {
        "float32" | "f32" => Dtype::Float32,
        "float16" | "f16" => Dtype::Float16,
        "bfloat16" | "bf16" => Dtype::Bfloat16,
        _ => return None,
    })
}

/// The float dtype a safetensors header names (`F32`, `F16`, `BF16`).
pub(crate) fn parse_safetensors_dtype(name: &str) -> Option<Dtype> {
    Some(match name {
        "F32" => Dtype::Float32,
        "F16" => Dtype::Float16,
        "BF16" => Dtype::Bfloat16,
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
