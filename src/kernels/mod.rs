//! mlx-bun's own CPU kernel for affine-quantized matmuls over few rows
//! (decode, small batches, speculative verification), an MLX primitive built
//! from `kernels/cpu`. MLX's CPU `quantized_matmul` spends most of a decode
//! step; this one streams the packed weights once for all rows with SIMD and
//! splits the output over the cores. Design and numbers: `docs/cpu-kernel.md`.
//!
//! `MLX_BUN_CPU_KERNEL=0` turns it off. `MLX_BUN_CPU_KERNEL_ROWS` caps the
//! rows for which `Linear` prefers it to its dense path (dequantize + BLAS
//! GEMM); by default it takes any number: past one block of rows it
//! dequantizes each weight block once for all of them, which beats the
//! dense path at every prompt length measured.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};

use anyhow::{anyhow, Result};
use mlx_rs::{Array, Dtype};

use crate::quant::QuantSpec;

pub mod cuda;
pub mod cuda_attention;

extern "C" {
    fn mlx_bun_cpu_qmm(
        res: *mut mlx_sys::mlx_array,
        x: mlx_sys::mlx_array,
        w: mlx_sys::mlx_array,
        scales: mlx_sys::mlx_array,
        biases: mlx_sys::mlx_array,
        group_size: c_int,
        bits: c_int,
    ) -> c_int;
    fn mlx_bun_cpu_qmm_add(
        res: *mut mlx_sys::mlx_array,
        x: mlx_sys::mlx_array,
        w: mlx_sys::mlx_array,
        scales: mlx_sys::mlx_array,
        biases: mlx_sys::mlx_array,
        residual: mlx_sys::mlx_array,
        group_size: c_int,
        bits: c_int,
    ) -> c_int;
    fn mlx_bun_cpu_silu_glu(
        res: *mut mlx_sys::mlx_array,
        x: mlx_sys::mlx_array,
        gate_w: mlx_sys::mlx_array,
        gate_scales: mlx_sys::mlx_array,
        gate_biases: mlx_sys::mlx_array,
        up_w: mlx_sys::mlx_array,
        up_scales: mlx_sys::mlx_array,
        up_biases: mlx_sys::mlx_array,
        group_size: c_int,
        bits: c_int,
    ) -> c_int;
    fn mlx_bun_cpu_rms_norm(
        res: *mut mlx_sys::mlx_array,
        x: mlx_sys::mlx_array,
        weight: mlx_sys::mlx_array,
        eps: f32,
    ) -> c_int;
    fn mlx_bun_cpu_log_softmax(res: *mut mlx_sys::mlx_array, x: mlx_sys::mlx_array) -> c_int;
    fn mlx_bun_cpu_quantized_embedding(
        res: *mut mlx_sys::mlx_array,
        ids: mlx_sys::mlx_array,
        w: mlx_sys::mlx_array,
        scales: mlx_sys::mlx_array,
        biases: mlx_sys::mlx_array,
        group_size: c_int,
        bits: c_int,
    ) -> c_int;
    fn mlx_bun_cpu_rope(
        res: *mut mlx_sys::mlx_array,
        x: mlx_sys::mlx_array,
        dims: c_int,
        base: f32,
        scale: f32,
        offset: c_int,
        freqs: mlx_sys::mlx_array,
        offsets: mlx_sys::mlx_array,
    ) -> c_int;
    fn mlx_bun_cpu_attention(
        res: *mut mlx_sys::mlx_array,
        q: mlx_sys::mlx_array,
        k: mlx_sys::mlx_array,
        v: mlx_sys::mlx_array,
        mask: mlx_sys::mlx_array,
        scale: f32,
        causal: c_int,
        positions: c_int,
    ) -> c_int;
    fn mlx_bun_cpu_quantized_attention(
        res: *mut mlx_sys::mlx_array,
        q: mlx_sys::mlx_array,
        keys: *const mlx_sys::mlx_array,
        values: *const mlx_sys::mlx_array,
        mask: mlx_sys::mlx_array,
        scale: f32,
        causal: c_int,
        bits: c_int,
        group_size: c_int,
        positions: c_int,
    ) -> c_int;
    fn mlx_bun_cpu_qkv_rope(
        q_out: *mut mlx_sys::mlx_array,
        k_out: *mut mlx_sys::mlx_array,
        v_out: *mut mlx_sys::mlx_array,
        x: mlx_sys::mlx_array,
        q_layer: *const mlx_sys::mlx_array,
        k_layer: *const mlx_sys::mlx_array,
        v_layer: *const mlx_sys::mlx_array,
        group_size: c_int,
        bits: c_int,
        heads: c_int,
        kv_heads: c_int,
        head_dim: c_int,
        rope_dims: c_int,
        rope_base: f32,
        rope_scale: f32,
        offset: c_int,
        freqs: mlx_sys::mlx_array,
        offsets: mlx_sys::mlx_array,
    ) -> c_int;
    fn mlx_bun_cpu_qmm_supported(in_features: c_int, group_size: c_int, bits: c_int) -> c_int;
    fn mlx_bun_cpu_configure(threads: c_int, spin_us: c_int, isa: *const c_char, int8_rows: c_int);
    fn mlx_bun_cpu_isa() -> *const c_char;
    fn mlx_bun_cpu_int8() -> *const c_char;
    fn mlx_bun_cpu_threads() -> c_int;
    fn mlx_bun_cpu_qmm_stats(bits: c_int, calls: *mut u64, nanoseconds: *mut u64);
    fn mlx_bun_last_error() -> *const c_char;
}

/// `x @ dequantize(w).T` by mlx-bun's CPU kernel: `x`, `scales` and `biases`
/// float32, `w` uint32 in MLX's affine layout, bits 4 or 8, group size 32, 64
/// or 128. Lazy like any MLX op; it always runs on the CPU stream.
pub fn cpu_quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    // SAFETY: the handles are valid arrays owned by the caller; on success
    // `res` holds a new array whose ownership passes to the returned Array.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let rc = mlx_bun_cpu_qmm(
            &mut res,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            group_size,
            bits,
        );
        if rc != 0 {
            mlx_sys::mlx_array_free(res);
            let msg = CStr::from_ptr(mlx_bun_last_error()).to_string_lossy();
            return Err(anyhow!("CPU quantized matmul: {msg}"));
        }
        Ok(Array::from_ptr(res))
    }
}

/// `x @ dequantize(w).T + residual` in one node: by the CPU kernel where it
/// takes `x` (as [`cpu_kernel_takes`]) and `residual` is float32 of the
/// product's shape, by the CUDA kernel where it takes the product on a GPU;
/// `None` otherwise. Each sum rounds as the separate add.
pub fn quantized_matmul_add(
    x: &Array,
    [w, scales, biases]: [&Array; 3],
    residual: &Array,
    spec: QuantSpec,
) -> Result<Option<Array>> {
    let fits = cpu_kernel_takes(x, w, scales, Some(biases), spec)
        && residual.dtype() == Dtype::Float32
        && residual.ndim() == x.ndim()
        && residual.shape()[..x.ndim() - 1] == x.shape()[..x.ndim() - 1]
        && residual.shape().last() == w.shape().first();
    if !fits {
        return cuda::quantized_matvec_plus(x, [w, scales, biases], residual, spec);
    }
    // SAFETY (inside `call`): valid handles owned by the caller.
    call("CPU quantized matmul", |res| unsafe {
        mlx_bun_cpu_qmm_add(
            res,
            x.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            residual.as_ptr(),
            spec.group_size,
            spec.bits,
        )
    })
    .map(Some)
}

/// `silu(x @ gate.T) * (x @ up.T)`, each layer a quantized `(w, scales,
/// biases)` of one shape: the gated MLP's first half in one node, by the CPU
/// kernel (both products in one pass over its threads) for the rows it takes
/// or by the CUDA kernel for a few rows on a GPU; `None` where neither applies.
pub fn quantized_silu_glu(
    x: &Array,
    gate: [&Array; 3],
    up: [&Array; 3],
    spec: QuantSpec,
) -> Result<Option<Array>> {
    let [gw, gs, gb] = gate;
    let [uw, us, ub] = up;
    let rows = x.size() / x.shape().last().map_or(1, |&k| k.max(1) as usize);
    let cpu = rows <= preferred_rows()
        && gw.shape() == uw.shape()
        && kernel_applies(x, gw, gs, gb, spec)
        && kernel_applies(x, uw, us, ub, spec);
    if !cpu {
        return cuda::quantized_silu_glu(x, gate, up, spec, None);
    }
    // SAFETY (inside `call`): valid handles owned by the caller.
    call("CPU quantized SwiGLU", |res| unsafe {
        mlx_bun_cpu_silu_glu(
            res,
            x.as_ptr(),
            gw.as_ptr(),
            gs.as_ptr(),
            gb.as_ptr(),
            uw.as_ptr(),
            us.as_ptr(),
            ub.as_ptr(),
            spec.group_size,
            spec.bits,
        )
    })
    .map(Some)
}

/// Runs one of the C constructors and takes ownership of its result.
fn call(what: &str, f: impl FnOnce(*mut mlx_sys::mlx_array) -> c_int) -> Result<Array> {
    // SAFETY: `f` writes a new array into `res` on success (rc 0); the handle
    // is freed on failure and owned by the returned Array otherwise.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        if f(&mut res) != 0 {
            mlx_sys::mlx_array_free(res);
            let msg = CStr::from_ptr(mlx_bun_last_error()).to_string_lossy();
            return Err(anyhow!("{what}: {msg}"));
        }
        Ok(Array::from_ptr(res))
    }
}

/// `fast::rms_norm(x, weight, eps)`. MLX 0.32 has no CPU kernel for it and
/// expands it into about 8 ops; on the CPU with float32 this is one primitive.
pub fn rms_norm(x: &Array, weight: &Array, eps: f32) -> Result<Array> {
    let ours = enabled()
        && x.dtype() == Dtype::Float32
        && weight.dtype() == Dtype::Float32
        && weight.ndim() == 1
        && x.ndim() >= 1
        && x.shape()[x.ndim() - 1] == weight.shape()[0];
    if !ours {
        return Ok(mlx_rs::fast::rms_norm(x, Some(weight), eps)?);
    }
    // SAFETY (inside `call`): valid handles owned by the caller.
    call("CPU rms_norm", |res| unsafe {
        mlx_bun_cpu_rms_norm(res, x.as_ptr(), weight.as_ptr(), eps)
    })
}

/// `x - logsumexp(x)` over the last axis (log-probabilities from logits).
/// On the CPU with float32 one primitive computes it with MLX's numbers bit
/// for bit, its exponentials in SIMD lanes (MLX's CPU `logsumexp` takes them
/// one at a time); elsewhere MLX's two operations.
pub fn log_softmax(x: &Array) -> Result<Array> {
    if !(enabled() && x.dtype() == Dtype::Float32 && x.ndim() >= 1) {
        return Ok(x - &mlx_rs::ops::logsumexp_axis(x, -1, true)?);
    }
    // SAFETY (inside `call`): a valid handle owned by the caller.
    call("CPU log_softmax", |res| unsafe {
        mlx_bun_cpu_log_softmax(res, x.as_ptr())
    })
}

/// Rows `ids` of an affine-quantized embedding table `[w, scales, biases]`,
/// dequantized: one CPU primitive with MLX's numbers bit for bit, where MLX
/// 0.32 takes the rows and dequantizes them in about 35 operations. `None`
/// where it does not apply (kernels off or on a GPU, another mode or dtype,
/// bits other than 2, 4 and 8).
pub fn quantized_embedding(
    ids: &Array,
    [w, scales, biases]: [&Array; 3],
    spec: QuantSpec,
) -> Result<Option<Array>> {
    let applies = enabled()
        && spec.mode.has_biases()
        && matches!(spec.bits, 2 | 4 | 8)
        && matches!(
            ids.dtype(),
            Dtype::Int32 | Dtype::Uint32 | Dtype::Int64 | Dtype::Uint64
        )
        && w.dtype() == Dtype::Uint32
        && [scales, biases].iter().all(|a| a.dtype() == Dtype::Float32);
    if !applies {
        return Ok(None);
    }
    // SAFETY (inside `call`): valid handles owned by the caller.
    call("CPU quantized embedding", |res| unsafe {
        mlx_bun_cpu_quantized_embedding(
            res,
            ids.as_ptr(),
            w.as_ptr(),
            scales.as_ptr(),
            biases.as_ptr(),
            spec.group_size,
            spec.bits,
        )
    })
    .map(Some)
}

/// One rotary embedding's parameters: those of `fast::rope` but the input
/// and the position offset.
#[derive(Clone, Copy, Debug)]
pub struct RopeParams<'a> {
    /// Features rotated: the first `dims` of the last axis.
    pub dims: i32,
    /// Rotates consecutive pairs instead of the two halves.
    pub traditional: bool,
    /// The frequency base; `None` when `freqs` gives the frequencies.
    pub base: Option<f32>,
    /// Multiplies the positions.
    pub scale: f32,
    /// Precomputed frequencies (Llama 3 or YaRN scaling), in place of `base`.
    pub freqs: Option<&'a Array>,
}

/// `fast::rope(x, dims, traditional, base, scale, offset, freqs)`. On the CPU
/// MLX 0.32 expands it into about 20 ops; for float32 rotate-half RoPE this is
/// one primitive computing the same formula.
pub fn rope(x: &Array, params: &RopeParams, offset: i32) -> Result<Array> {
    if !rope_applies(x, params) {
        let p = params;
        return Ok(mlx_rs::fast::rope(
            x,
            p.dims,
            p.traditional,
            p.base,
            p.scale,
            offset,
            p.freqs,
        )?);
    }
    cpu_rope(x, params, offset, None)
}

/// [`rope`] with each batch row (`x` is `[B, ..., L, d]`) starting at its
/// own position: `offsets` is int32 `[B]` (as `fast::rope` with an array
/// offset). Each row's numbers equal those [`rope`] gives the row alone, so
/// a row decodes the same in a batch as by itself.
pub fn rope_per_row(x: &Array, params: &RopeParams, offsets: &Array) -> Result<Array> {
    let per_row = x.ndim() >= 3
        && offsets.dtype() == Dtype::Int32
        && offsets.ndim() == 1
        && offsets.shape()[0] == x.shape()[0];
    if !per_row || !rope_applies(x, params) {
        let p = params;
        return Ok(mlx_rs::fast::rope_dynamic(
            x,
            p.dims,
            p.traditional,
            p.base,
            p.scale,
            offsets,
            p.freqs,
        )?);
    }
    cpu_rope(x, params, 0, Some(offsets))
}

/// Whether mlx-bun's CPU RoPE computes `x` with these parameters.
fn rope_applies(x: &Array, params: &RopeParams) -> bool {
    let dims = params.dims;
    enabled()
        && !params.traditional
        && x.dtype() == Dtype::Float32
        && x.ndim() >= 2
        && dims > 0
        && dims % 2 == 0
        && dims <= x.shape()[x.ndim() - 1]
        && (params.freqs.is_some() || params.base.is_some())
        && params.freqs.is_none_or(|f| f.dtype() == Dtype::Float32)
}

fn cpu_rope(x: &Array, params: &RopeParams, offset: i32, offsets: Option<&Array>) -> Result<Array> {
    // SAFETY (inside `call`): valid handles owned by the caller; an empty
    // handle stands for "no freqs" or "one shared offset".
    call("CPU rope", |res| unsafe {
        let none = mlx_sys::mlx_array_new();
        let f = params.freqs.map_or(none, |f| f.as_ptr());
        let o = offsets.map_or(none, |o| o.as_ptr());
        mlx_bun_cpu_rope(
            res,
            x.as_ptr(),
            params.dims,
            params.base.unwrap_or(0.0),
            params.scale,
            offset,
            f,
            o,
        )
    })
}

/// The head layout of one attention block's projections.
#[derive(Clone, Copy, Debug)]
pub struct AttentionHeads {
    /// Query heads.
    pub heads: i32,
    /// Key and value heads.
    pub kv_heads: i32,
    /// Features per head.
    pub head_dim: i32,
}

/// Where each row's tokens start, for RoPE.
#[derive(Clone, Copy)]
pub enum RopeStart<'a> {
    /// Every row at this position.
    Shared(i32),
    /// Row `b` at `offsets[b]` (int32 `[B]`).
    PerRow(&'a Array),
}

/// An attention block's inputs in one CPU primitive: `q`, `k`, `v` =
/// `x @ dequantize(layer).T` for three affine-quantized layers (`[w, scales,
/// biases]` each) of one quantization, `q` and `k` rotated by rotate-half
/// RoPE from `start`, each `[B, heads, L, head_dim]` for float32 `x` `[B, L,
/// k]`: the numbers of the three products, [`rope`] or [`rope_per_row`],
/// and the reshapes between them. `None` where it does not apply (kernel
/// off, a GPU, another dtype, traditional RoPE, more rows than the kernel
/// takes).
pub fn quantized_qkv_rope(
    x: &Array,
    layers: [[&Array; 3]; 3],
    spec: QuantSpec,
    heads: AttentionHeads,
    rope: &RopeParams,
    start: RopeStart,
) -> Result<Option<[Array; 3]>> {
    let rows = x.size() / x.shape().last().map_or(1, |&k| k.max(1) as usize);
    let per_row_fits = match start {
        RopeStart::Shared(_) => true,
        RopeStart::PerRow(o) => {
            o.dtype() == Dtype::Int32 && o.ndim() == 1 && o.shape()[0] == x.shape()[0]
        }
    };
    let fits = x.ndim() == 3
        && rows <= preferred_rows()
        && per_row_fits
        && rope.dims <= heads.head_dim
        && rope_applies(x, rope)
        && layers
            .iter()
            .all(|[w, s, b]| kernel_applies(x, w, s, b, spec))
        && spec.mode.has_biases();
    if !fits {
        return Ok(None);
    }
    let handles = |[w, s, b]: [&Array; 3]| [w.as_ptr(), s.as_ptr(), b.as_ptr()];
    let [q_layer, k_layer, v_layer] = layers.map(handles);
    // SAFETY: valid handles owned by the caller; empty handles stand for "no
    // freqs" and "one shared offset"; on success each output handle holds a
    // new array whose ownership passes to the returned Arrays, on failure all
    // three are freed.
    unsafe {
        let none = mlx_sys::mlx_array_new();
        let (offset, offsets) = match start {
            RopeStart::Shared(offset) => (offset, none),
            RopeStart::PerRow(o) => (0, o.as_ptr()),
        };
        let mut out = [
            mlx_sys::mlx_array_new(),
            mlx_sys::mlx_array_new(),
            mlx_sys::mlx_array_new(),
        ];
        let [qo, ko, vo] = &mut out;
        let rc = mlx_bun_cpu_qkv_rope(
            qo,
            ko,
            vo,
            x.as_ptr(),
            q_layer.as_ptr(),
            k_layer.as_ptr(),
            v_layer.as_ptr(),
            spec.group_size,
            spec.bits,
            heads.heads,
            heads.kv_heads,
            heads.head_dim,
            rope.dims,
            rope.base.unwrap_or(0.0),
            rope.scale,
            offset,
            rope.freqs.map_or(none, |f| f.as_ptr()),
            offsets,
        );
        if rc != 0 {
            out.into_iter().for_each(|a| {
                mlx_sys::mlx_array_free(a);
            });
            let msg = CStr::from_ptr(mlx_bun_last_error()).to_string_lossy();
            return Err(anyhow!("CPU q/k/v projections with RoPE: {msg}"));
        }
        Ok(Some(out.map(|a| Array::from_ptr(a))))
    }
}

/// Which keys each query of [`attention`] sees.
#[derive(Clone, Copy)]
pub enum AttentionMask<'a> {
    /// Every key.
    None,
    /// Keys up to the query's own position (the last `L` keys are the queries').
    Causal,
    /// A boolean mask broadcastable to `[B, heads, L, S]`.
    Array(&'a Array),
}

/// `scaled_dot_product_attention(q, k, v, scale, mask)` with the heads
/// moved back beside the features, `[B, L, heads × D]`, in one CPU primitive
/// (MLX 0.32 expands it into about a dozen operations on the CPU), for
/// float32 `q` `[B, heads, L, D]` and `k`, `v` `[B, kv_heads, S, D]`.
/// Prompts too: the queries go in tiles, so the scores are never
/// materialized. `None` where it does not apply (kernels off or on a GPU,
/// another dtype, a mask that is not boolean).
pub fn attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: AttentionMask,
) -> Result<Option<Array>> {
    attention_over(q, k, v, scale, mask, None)
}

/// [`attention`] over the first `positions` of the `S` keys and values
/// stored (a cache's buffers, spare capacity after them); `None`: all.
pub fn attention_over(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: AttentionMask,
    positions: Option<i32>,
) -> Result<Option<Array>> {
    let float32 = [k, v]
        .iter()
        .all(|a| a.dtype() == Dtype::Float32 && a.ndim() == 4);
    let Some((mask, causal)) = attention_applies(q, mask).filter(|_| float32) else {
        return Ok(None);
    };
    // SAFETY (inside `call`): valid handles owned by the caller; an empty
    // handle stands for "no mask".
    call("CPU attention", |res| unsafe {
        mlx_bun_cpu_attention(
            res,
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            mask,
            scale,
            c_int::from(causal),
            positions.unwrap_or(0),
        )
    })
    .map(Some)
}

/// Whether [`attention`] takes these queries with no mask or a causal one.
pub(crate) fn attention_takes(q: &Array) -> bool {
    attention_applies(q, AttentionMask::Causal).is_some()
}

/// [`attention`] over a quantized KV cache's contents: `keys` and `values`
/// each the packed `[B, kv_heads, S, D × bits / 32]` with float32 scales and
/// biases `[B, kv_heads, S, D / group_size]`, as mlx-lm's
/// `quantized_scaled_dot_product_attention` computes it (every value
/// `scale × q + bias`). `positions` attends to the first that many of the
/// `S` stored (a cache's buffers, spare capacity after them); `None`: all.
/// `None` where it does not apply (also bits other than 2, 4 and 8).
pub fn quantized_attention(
    q: &Array,
    keys: [&Array; 3],
    values: [&Array; 3],
    (bits, group_size): (i32, i32),
    scale: f32,
    mask: AttentionMask,
    positions: Option<i32>,
) -> Result<Option<Array>> {
    let stored = keys.iter().chain(&values).all(|a| a.ndim() == 4)
        && [keys[1], keys[2], values[1], values[2]]
            .iter()
            .all(|a| a.dtype() == Dtype::Float32)
        && matches!(bits, 2 | 4 | 8);
    let Some((mask, causal)) = attention_applies(q, mask).filter(|_| stored) else {
        return Ok(None);
    };
    let k = keys.map(|a| a.as_ptr());
    let v = values.map(|a| a.as_ptr());
    // SAFETY (inside `call`): valid handles owned by the caller, read
    // during the call; an empty handle stands for "no mask".
    call("CPU quantized attention", |res| unsafe {
        mlx_bun_cpu_quantized_attention(
            res,
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            mask,
            scale,
            c_int::from(causal),
            bits,
            group_size,
            positions.unwrap_or(0),
        )
    })
    .map(Some)
}

/// The mask handle (empty for none) and the causal flag when the attention
/// primitive takes these queries and this mask.
fn attention_applies(q: &Array, mask: AttentionMask) -> Option<(mlx_sys::mlx_array, bool)> {
    let fits = enabled() && q.dtype() == Dtype::Float32 && q.ndim() == 4;
    if !fits {
        return None;
    }
    // SAFETY: an empty handle, owns nothing.
    let none = unsafe { mlx_sys::mlx_array_new() };
    match mask {
        AttentionMask::None => Some((none, false)),
        AttentionMask::Causal => Some((none, true)),
        AttentionMask::Array(m) if m.dtype() == Dtype::Bool => Some((m.as_ptr(), false)),
        AttentionMask::Array(_) => None,
    }
}

/// `quantized_matmul(x, w, scales, biases, transpose = true)`: by mlx-bun's
/// CPU kernel where it applies (CPU, float32, affine 4 or 8 bits), by its
/// CUDA kernel for few rows on an NVIDIA GPU (affine), else by MLX, which
/// runs every mode (`biases` is None for mxfp4, nvfp4 and mxfp8).
/// MLX's CPU kernel costs the same per row at any row count, so this one is
/// faster at every count; `Linear` sends long prompts to its dense path first.
pub fn quantized_matmul_t<'a>(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: impl Into<Option<&'a Array>>,
    spec: QuantSpec,
) -> Result<Array> {
    let biases = biases.into();
    if let Some(b) = biases.filter(|_| spec.mode.has_biases()) {
        if kernel_applies(x, w, scales, b, spec) {
            return cpu_quantized_matmul(x, w, scales, b, spec.group_size, spec.bits);
        }
        if cuda::applies(x, w, scales, b, spec) {
            return cuda::quantized_matvec(x, w, scales, b, spec);
        }
    }
    crate::quant::quantized_matmul(x, w, scales, biases, true, spec)
}

fn kernel_applies(x: &Array, w: &Array, scales: &Array, biases: &Array, spec: QuantSpec) -> bool {
    if !enabled() || x.ndim() == 0 || w.ndim() != 2 {
        return false;
    }
    let in_features = x.shape()[x.ndim() - 1];
    x.size() > 0
        && x.dtype() == Dtype::Float32
        && scales.dtype() == Dtype::Float32
        && biases.dtype() == Dtype::Float32
        && w.dtype() == Dtype::Uint32
        && supported(in_features, spec)
}

/// True when the kernel handles layers of this width and quantization.
pub fn supported(in_features: i32, spec: QuantSpec) -> bool {
    // SAFETY: a pure function of its integer arguments.
    spec.mode.has_biases()
        && unsafe { mlx_bun_cpu_qmm_supported(in_features, spec.group_size, spec.bits) == 1 }
}

/// The most rows the kernel takes, or None when it is off (GPU, or the
/// settings turn it off).
fn max_rows() -> Option<usize> {
    static ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        configure();
        let rows = crate::settings::get().cpu_kernel.max_rows;
        (!crate::mlx_ext::on_gpu() && rows > 0).then_some(rows)
    })
}

/// Hands the kernel its threads, spin time and instruction set from the
/// settings, once, before its first product.
fn configure() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        let kernel = &crate::settings::get().cpu_kernel;
        let isa = std::ffi::CString::new(kernel.isa.clone().unwrap_or_default())
            .expect("instruction set names have no NUL");
        let threads = kernel
            .threads
            .map_or(0, |t| t.min(c_int::MAX as usize) as c_int);
        let spin = kernel.spin.as_micros().min(c_int::MAX as u128) as c_int;
        // SAFETY: copies the string and three integers before returning.
        unsafe { mlx_bun_cpu_configure(threads, spin, isa.as_ptr(), kernel.int8_dot.max_rows()) };
    });
}

/// Whether `Linear` and the tied output head use the kernel.
pub fn enabled() -> bool {
    max_rows().is_some()
}

/// The most rows for which `Linear` prefers the kernel to its dense path
/// (0 when the kernel is off).
pub(crate) fn preferred_rows() -> usize {
    max_rows().unwrap_or(0)
}

/// Whether `Linear` runs `x @ dequantize(w).T` by the CPU kernel: it applies
/// and `x` has at most the preferred rows.
pub(crate) fn cpu_kernel_takes(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    spec: QuantSpec,
) -> bool {
    let rows = x.size() / x.shape().last().map_or(1, |&k| k.max(1) as usize);
    rows <= preferred_rows()
        && biases.is_some_and(|b| spec.mode.has_biases() && kernel_applies(x, w, scales, b, spec))
}

/// The instruction set the kernel uses here: `avx512`, `avx2`, `neon` or `scalar`.
pub fn isa() -> &'static str {
    configure();
    // SAFETY: returns a pointer to a static C string.
    unsafe { CStr::from_ptr(mlx_bun_cpu_isa()) }
        .to_str()
        .unwrap_or("unknown")
}

/// The integer dot products in use (`avx512-vnni`, `avx512bw`), or `None`
/// when the settings leave them off or the CPU has none.
pub fn int8_dot() -> Option<&'static str> {
    configure();
    // SAFETY: returns a pointer to a static C string.
    let name = unsafe { CStr::from_ptr(mlx_bun_cpu_int8()) }
        .to_str()
        .ok()?;
    (!name.is_empty()).then_some(name)
}

/// Threads one product is split over, the MLX worker included.
pub fn threads() -> usize {
    configure();
    // SAFETY: plain query; starts the kernel's helper threads on first use.
    unsafe { mlx_bun_cpu_threads() as usize }
}

/// Products the kernel has computed at `bits` (4 or 8) in this process, and
/// the wall time MLX's CPU stream spent in them.
pub fn stats(bits: i32) -> (u64, std::time::Duration) {
    let (mut calls, mut ns) = (0u64, 0u64);
    // SAFETY: writes two integers through valid pointers.
    unsafe { mlx_bun_cpu_qmm_stats(bits, &mut calls, &mut ns) };
    (calls, std::time::Duration::from_nanos(ns))
}
