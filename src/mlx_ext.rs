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

/// MLX's quantized ops for every mode (`affine`, `mxfp4`, `nvfp4`,
/// `mxfp8`): mlx-rs 0.33 passes `affine` only, so these call mlx-c with the
/// mode of the layer's `QuantSpec`. `biases` is None for the float modes.
pub(crate) mod quant {
    use std::ffi::CString;

    use anyhow::{bail, Result};
    use mlx_rs::{Array, Stream};

    use crate::model::layers::QuantSpec;

    fn optional_int(value: i32) -> mlx_sys::mlx_optional_int {
        mlx_sys::mlx_optional_int {
            value,
            has_value: true,
        }
    }

    /// Runs one mlx-c op writing an array; `what` names it in the error.
    fn call(
        what: impl FnOnce() -> String,
        f: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_array, mlx_sys::mlx_stream) -> i32,
    ) -> Result<Array> {
        let stream = Stream::thread_local_or_default();
        // SAFETY: `none` is an empty handle standing for an absent optional
        // array, freed here; `res` is owned by the returned Array on success
        // and freed on failure; the stream outlives the call.
        unsafe {
            let none = mlx_sys::mlx_array_new();
            let mut res = mlx_sys::mlx_array_new();
            let rc = f(&mut res, none, stream.as_ptr());
            mlx_sys::mlx_array_free(none);
            if rc != 0 {
                mlx_sys::mlx_array_free(res);
                bail!("MLX could not {}", what());
            }
            Ok(Array::from_ptr(res))
        }
    }

    fn mode_name(spec: QuantSpec) -> CString {
        CString::new(spec.mode.name()).expect("mode names have no NUL")
    }

    /// `mx.quantize(w, group_size, bits, mode)`: `[weight, scales]`, plus
    /// `biases` in affine mode.
    pub(crate) fn quantize(w: &Array, spec: QuantSpec) -> Result<Vec<Array>> {
        let mode = mode_name(spec);
        let stream = Stream::thread_local_or_default();
        // SAFETY: every handle passed is valid for the call; the output
        // vector is created here, read into owned Arrays, and freed once.
        unsafe {
            let none = mlx_sys::mlx_array_new();
            let mut out = mlx_sys::mlx_vector_array_new();
            let rc = mlx_sys::mlx_quantize(
                &mut out,
                w.as_ptr(),
                optional_int(spec.group_size),
                optional_int(spec.bits),
                mode.as_ptr(),
                none,
                stream.as_ptr(),
            );
            mlx_sys::mlx_array_free(none);
            if rc != 0 {
                mlx_sys::mlx_vector_array_free(out);
                bail!(
                    "MLX could not quantize a {:?} array with mode {}, {} bits, group size {}",
                    w.shape(),
                    spec.mode.name(),
                    spec.bits,
                    spec.group_size
                );
            }
            let n = mlx_sys::mlx_vector_array_size(out);
            let arrays = (0..n)
                .map(|i| {
                    let mut a = mlx_sys::mlx_array_new();
                    mlx_sys::mlx_vector_array_get(&mut a, out, i);
                    Array::from_ptr(a)
                })
                .collect();
            mlx_sys::mlx_vector_array_free(out);
            Ok(arrays)
        }
    }

    /// `mx.quantized_matmul(x, w, scales, biases, transpose, group_size, bits, mode)`.
    pub(crate) fn quantized_matmul(
        x: &Array,
        w: &Array,
        scales: &Array,
        biases: Option<&Array>,
        transpose: bool,
        spec: QuantSpec,
    ) -> Result<Array> {
        let mode = mode_name(spec);
        let what = || {
            format!(
                "multiply {:?} by a {:?} {} matrix ({} bits, group size {})",
                x.shape(),
                w.shape(),
                spec.mode.name(),
                spec.bits,
                spec.group_size
            )
        };
        // SAFETY (inside `call`): valid handles owned by the caller.
        call(what, |res, none, s| unsafe {
            mlx_sys::mlx_quantized_matmul(
                res,
                x.as_ptr(),
                w.as_ptr(),
                scales.as_ptr(),
                biases.map_or(none, |b| b.as_ptr()),
                transpose,
                optional_int(spec.group_size),
                optional_int(spec.bits),
                mode.as_ptr(),
                s,
            )
        })
    }

    /// `mx.dequantize(w, scales, biases, group_size, bits, mode)`.
    pub(crate) fn dequantize(
        w: &Array,
        scales: &Array,
        biases: Option<&Array>,
        spec: QuantSpec,
    ) -> Result<Array> {
        let mode = mode_name(spec);
        let what = || {
            format!(
                "dequantize a {:?} {} matrix ({} bits, group size {})",
                w.shape(),
                spec.mode.name(),
                spec.bits,
                spec.group_size
            )
        };
        // SAFETY (inside `call`): valid handles owned by the caller; a
        // zeroed optional dtype is "none".
        call(what, |res, none, s| unsafe {
            let no_dtype: mlx_sys::mlx_optional_dtype = std::mem::zeroed();
            mlx_sys::mlx_dequantize(
                res,
                w.as_ptr(),
                scales.as_ptr(),
                biases.map_or(none, |b| b.as_ptr()),
                optional_int(spec.group_size),
                optional_int(spec.bits),
                mode.as_ptr(),
                none,
                no_dtype,
                s,
            )
        })
    }

    /// `mx.gather_qmm(x, w, scales, biases, rhs_indices=indices, transpose=True, ...)`.
    pub(crate) fn gather_qmm(
        x: &Array,
        w: &Array,
        scales: &Array,
        biases: Option<&Array>,
        indices: &Array,
        sorted: bool,
        spec: QuantSpec,
    ) -> Result<Array> {
        let mode = mode_name(spec);
        let what = || {
            format!(
                "multiply {:?} by the {:?} {} experts ({} bits, group size {})",
                x.shape(),
                w.shape(),
                spec.mode.name(),
                spec.bits,
                spec.group_size
            )
        };
        // SAFETY (inside `call`): valid handles owned by the caller.
        call(what, |res, none, s| unsafe {
            mlx_sys::mlx_gather_qmm(
                res,
                x.as_ptr(),
                w.as_ptr(),
                scales.as_ptr(),
                biases.map_or(none, |b| b.as_ptr()),
                none,
                indices.as_ptr(),
                true,
                optional_int(spec.group_size),
                optional_int(spec.bits),
                mode.as_ptr(),
                sorted,
                s,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use mlx_rs::ops::indexing::IndexOp;
    use mlx_rs::Array;

    use super::quant;
    use crate::convert::quantize::quantize_with_mode;
    use crate::model::config::QuantMode;
    use crate::model::layers::QuantSpec;

    /// Every mode through the three ops: `gather_qmm` over stacked experts
    /// equals `quantized_matmul` with each row's expert, which equals a
    /// matmul with the dequantized weight.
    #[test]
    fn every_mode_runs_the_quantized_ops() {
        let w = mlx_rs::random::normal::<f32>(&[2, 64, 128], None, None, None).unwrap();
        let x = mlx_rs::random::normal::<f32>(&[3, 1, 128], None, None, None).unwrap();
        let experts = Array::from_slice(&[1u32, 0, 1], &[3]);
        for mode in [
            QuantMode::Affine,
            QuantMode::Mxfp4,
            QuantMode::Nvfp4,
            QuantMode::Mxfp8,
        ] {
            let (group_size, bits) = mode.defaults();
            let spec = QuantSpec {
                group_size,
                bits,
                mode,
            };
            let parts = quantize_with_mode(&w, group_size, bits, mode).unwrap();
            assert_eq!(parts.len(), if mode.has_biases() { 3 } else { 2 });
            let (q, s, b) = (&parts[0], &parts[1], parts.get(2));
            let gathered = quant::gather_qmm(&x, q, s, b, &experts, false, spec).unwrap();
            assert_eq!(gathered.shape(), &[3, 1, 64]);
            for (row, e) in [1, 0, 1].into_iter().enumerate() {
                let row = row as i32;
                let (qe, se) = (q.index(e), s.index(e));
                let be = b.map(|b| b.index(e));
                let xr = x.index(row);
                let one = quant::quantized_matmul(&xr, &qe, &se, be.as_ref(), true, spec).unwrap();
                let dense = quant::dequantize(&qe, &se, be.as_ref(), spec).unwrap();
                let reference = mlx_rs::ops::matmul(&xr, dense.t()).unwrap();
                let diff = |a: &Array, b: &Array| {
                    (a - b).abs().unwrap().max(None).unwrap().item_cast::<f32>()
                };
                assert!(diff(&gathered.index(row), &one) < 1e-4, "{mode:?}");
                assert!(diff(&one, &reference) < 1e-3, "{mode:?}");
            }
        }
    }
}
