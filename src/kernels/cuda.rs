//! mlx-bun's CUDA matrix-vector kernel for affine-quantized weights
//! (`kernels/cuda/qmv.cu`), run through MLX's custom-kernel API: compiled by
//! NVRTC on first use, scheduled in MLX's graph like any other op. It serves
//! batched decode and speculative verification (2 to `MAX_ROWS` rows) of
//! large layers on an NVIDIA GPU; MLX's `quantized_matmul` covers everything
//! else. `MLX_BUN_CUDA_KERNEL=0` turns it off, `=all` uses it for every layer
//! and single rows too. Design and numbers: `docs/gpu.md`.

use std::ffi::CString;
use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::{anyhow, bail, Result};
use mlx_rs::{Array, Dtype};

use crate::model::layers::QuantSpec;

const SOURCE: &str = include_str!("../../kernels/cuda/qmv.cu");
const BODY_MARKER: &str = "// BODY\n";
/// Rows of `x` the kernel takes; from 8 rows MLX's tiled kernel wins.
pub(crate) const MAX_ROWS: usize = 4;
/// Fewest rows it takes by default. At one row the kernel itself is about
/// twice as fast as MLX's on large layers, but building each custom-kernel
/// node costs more host time than that saves in a single-sequence decode
/// step (measured on an H200, docs/gpu.md); from two rows it wins end to end.
/// `MLX_BUN_CUDA_KERNEL=all` takes single rows too.
const MIN_ROWS: usize = 2;
/// Smallest layer (out x in features) the kernel takes by default: on an
/// H200 it beats MLX's kernel on Llama-8B's MLP and output layers but not on
/// its 4096 x 4096 attention projections. `MLX_BUN_CUDA_KERNEL=all` lifts it.
const MIN_WEIGHTS: i64 = 16 << 20;
const WARPS_PER_BLOCK: i32 = 4;

const UNSET: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;
const ALL: u8 = 3;
static STATE: AtomicU8 = AtomicU8::new(UNSET);

/// Whether the kernel is used where it applies (GPU only; default on).
pub fn enabled() -> bool {
    state() != OFF
}

fn state() -> u8 {
    match STATE.load(Ordering::Relaxed) {
        UNSET => {
            let setting = std::env::var("MLX_BUN_CUDA_KERNEL").unwrap_or_default();
            let state = if !crate::mlx_ext::on_gpu() || setting == "0" {
                OFF
            } else if setting == "all" {
                ALL
            } else {
                ON
            };
            STATE.store(state, Ordering::Relaxed);
            state
        }
        state => state,
    }
}

/// Turns the kernel on or off for this process (benchmarks compare both).
pub fn set_enabled(on: bool) {
    STATE.store(if on { ON } else { OFF }, Ordering::Relaxed);
}

/// True when the kernel computes `quantized_matmul(x, w, scales, biases,
/// transpose = true)` for these operands.
pub fn applies(x: &Array, w: &Array, scales: &Array, biases: &Array, spec: QuantSpec) -> bool {
    if !enabled() || x.ndim() == 0 || w.ndim() != 2 || scales.ndim() != 2 {
        return false;
    }
    let k = x.shape()[x.ndim() - 1];
    let rows = x.size() / k.max(1) as usize;
    let per_chunk = 128 / spec.bits.max(1);
    let all = state() == ALL;
    let large_enough = all || w.shape()[0] as i64 * k as i64 >= MIN_WEIGHTS;
    let min_rows = if all { 1 } else { MIN_ROWS };
    large_enough
        && rows >= min_rows
        && matches!(spec.bits, 4 | 8)
        && rows <= MAX_ROWS
        && matches!(x.dtype(), Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16)
        && matches!(
            scales.dtype(),
            Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16
        )
        && biases.dtype() == scales.dtype()
        && w.dtype() == Dtype::Uint32
        && k % per_chunk == 0
        && spec.group_size % per_chunk == 0
        && k % spec.group_size == 0
        && w.shape()[1] * 32 / spec.bits == k
        && scales.shape()[1] == k / spec.group_size
}

/// `x @ dequantize(w, scales, biases).T` by the CUDA kernel. The caller
/// checks [`applies`] first.
pub fn quantized_matvec(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    spec: QuantSpec,
) -> Result<Array> {
    if !applies(x, w, scales, biases, spec) {
        bail!("the CUDA kernel does not apply to these operands");
    }
    let k = x.shape()[x.ndim() - 1];
    let n = w.shape()[0];
    let rows = (x.size() / k as usize) as i32;
    let mut out_shape: Vec<i32> = x.shape()[..x.ndim() - 1].to_vec();
    out_shape.push(n);
    let (header, body) = SOURCE
        .split_once(BODY_MARKER)
        .ok_or_else(|| anyhow!("kernels/cuda/qmv.cu lacks its body marker"))?;
    let bound = [1, 2, 4]
        .into_iter()
        .find(|&b| b >= rows)
        .unwrap_or(MAX_ROWS as i32);
    let x2 = x.reshape(&[rows, k])?;
    let per_warp = columns_per_warp(n);
    let template_ints = [
        ("MB", bound),
        ("GS", spec.group_size),
        ("BITS", spec.bits),
        ("WARPS", WARPS_PER_BLOCK),
        ("R", per_warp),
    ];
    let template_types = [("T", x.dtype()), ("S", scales.dtype())];
    let warps = n / per_warp;
    let grid = (warps + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK * WARPS_PER_BLOCK * 32;
    let out = run_kernel(KernelCall {
        name: "mlx_bun_qmv",
        inputs: &[("x", &x2), ("w", w), ("scales", scales), ("biases", biases)],
        output: ("y", &[rows, n], x.dtype()),
        header,
        body,
        template_ints: &template_ints,
        template_types: &template_types,
        grid: (grid, 1, 1),
        block: (WARPS_PER_BLOCK * 32, 1, 1),
    })?;
    Ok(out.reshape(&out_shape)?)
}

/// Output columns per warp: 4 while that still leaves about four blocks per
/// streaming multiprocessor of a large GPU (132 on an H200), fewer for
/// narrow layers; always a divisor of `n`.
fn columns_per_warp(n: i32) -> i32 {
    const TARGET_BLOCKS: i32 = 4 * 132;
    [4, 2]
        .into_iter()
        .find(|&r| n % r == 0 && n / (r * WARPS_PER_BLOCK) >= TARGET_BLOCKS)
        .unwrap_or(1)
}

struct KernelCall<'a> {
    name: &'a str,
    inputs: &'a [(&'a str, &'a Array)],
    output: (&'a str, &'a [i32], Dtype),
    header: &'a str,
    body: &'a str,
    template_ints: &'a [(&'a str, i32)],
    template_types: &'a [(&'a str, Dtype)],
    /// Threads in total, per dimension (MLX divides by the block).
    grid: (i32, i32, i32),
    block: (i32, i32, i32),
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| anyhow!("kernel text contains a NUL byte"))
}

/// An MLX custom-kernel object, made once per process: it depends only on
/// the kernel's name, argument names and source.
struct KernelHandle(mlx_sys::mlx_fast_cuda_kernel);
// SAFETY: the handle wraps an immutable MLX function object that MLX calls
// from any thread; it is never freed.
unsafe impl Send for KernelHandle {}
unsafe impl Sync for KernelHandle {}

static QMV_KERNEL: std::sync::OnceLock<Result<KernelHandle, String>> = std::sync::OnceLock::new();

fn make_kernel(call: &KernelCall<'_>) -> Result<KernelHandle> {
    let name = cstring(call.name)?;
    let header = cstring(call.header)?;
    let body = cstring(call.body)?;
    let input_names: Vec<CString> = call
        .inputs
        .iter()
        .map(|(n, _)| cstring(n))
        .collect::<Result<_>>()?;
    let output_name = cstring(call.output.0)?;
    // SAFETY: the C strings outlive the calls; the vectors are freed after
    // MLX has copied them into the kernel object.
    unsafe {
        let in_ptrs: Vec<*const std::os::raw::c_char> =
            input_names.iter().map(|s| s.as_ptr()).collect();
        let in_names =
            mlx_sys::mlx_vector_string_new_data(in_ptrs.as_ptr() as *mut _, in_ptrs.len());
        let out_ptrs = [output_name.as_ptr()];
        let out_names = mlx_sys::mlx_vector_string_new_data(out_ptrs.as_ptr() as *mut _, 1);
        let kernel = mlx_sys::mlx_fast_cuda_kernel_new(
            name.as_ptr(),
            in_names,
            out_names,
            body.as_ptr(),
            header.as_ptr(),
            true,
            0,
        );
        mlx_sys::mlx_vector_string_free(out_names);
        mlx_sys::mlx_vector_string_free(in_names);
        if kernel.ctx.is_null() {
            bail!("MLX could not create the CUDA kernel {}", call.name);
        }
        Ok(KernelHandle(kernel))
    }
}

/// Applies the process's custom CUDA kernel (compiled by MLX on first use).
fn run_kernel(call: KernelCall<'_>) -> Result<Array> {
    let handle = QMV_KERNEL
        .get_or_init(|| make_kernel(&call).map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("{e}"))?;
    let ints: Vec<(CString, i32)> = call
        .template_ints
        .iter()
        .map(|(n, v)| Ok((cstring(n)?, *v)))
        .collect::<Result<_>>()?;
    let types: Vec<(CString, Dtype)> = call
        .template_types
        .iter()
        .map(|(n, d)| Ok((cstring(n)?, *d)))
        .collect::<Result<_>>()?;
    // SAFETY: every handle created here is freed before returning; the
    // C strings outlive the calls that read them; on success the output
    // array is copied out of the vector (a new reference) before the vector
    // is freed.
    unsafe {
        let kernel = handle.0;
        let config = mlx_sys::mlx_fast_cuda_kernel_config_new();
        let (shape, dtype) = (call.output.1, call.output.2);
        let mut rc = mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
            config,
            shape.as_ptr(),
            shape.len(),
            dtype as mlx_sys::mlx_dtype,
        );
        rc |= mlx_sys::mlx_fast_cuda_kernel_config_set_grid(
            config,
            call.grid.0,
            call.grid.1,
            call.grid.2,
        );
        rc |= mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(
            config,
            call.block.0,
            call.block.1,
            call.block.2,
        );
        for (n, d) in &types {
            rc |= mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(
                config,
                n.as_ptr(),
                *d as mlx_sys::mlx_dtype,
            );
        }
        for (n, v) in &ints {
            rc |= mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(config, n.as_ptr(), *v);
        }
        let handles: Vec<mlx_sys::mlx_array> =
            call.inputs.iter().map(|(_, a)| a.as_ptr()).collect();
        let inputs = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
        let stream = mlx_sys::mlx_default_gpu_stream_new();
        let mut outputs = mlx_sys::mlx_vector_array_new();
        if rc == 0 {
            rc = mlx_sys::mlx_fast_cuda_kernel_apply(&mut outputs, kernel, inputs, config, stream);
        }
        let mut result = Err(anyhow!(
            "the CUDA kernel {} failed to build or run",
            call.name
        ));
        if rc == 0 && mlx_sys::mlx_vector_array_size(outputs) == 1 {
            let mut out = mlx_sys::mlx_array_new();
            if mlx_sys::mlx_vector_array_get(&mut out, outputs, 0) == 0 {
                result = Ok(Array::from_ptr(out));
            } else {
                mlx_sys::mlx_array_free(out);
            }
        }
        mlx_sys::mlx_vector_array_free(outputs);
        mlx_sys::mlx_stream_free(stream);
        mlx_sys::mlx_vector_array_free(inputs);
        mlx_sys::mlx_fast_cuda_kernel_config_free(config);
        result
    }
}
