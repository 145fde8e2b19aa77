//! mlx-bun's CUDA matrix-vector kernel for affine-quantized weights
//! (`kernels/cuda/qmv.cu`), run through MLX's custom-kernel API: compiled by
//! NVRTC on first use, scheduled in MLX's graph like any other op. It serves
//! batched decode and speculative verification (2 to `MAX_ROWS`
//! rows) of large layers on an NVIDIA GPU, and the gated MLP's
//! `silu(gate) * up` as one node; MLX's `quantized_matmul` covers everything
//! else. The settings' `cuda_kernel` says where it runs: `serve` uses it by
//! default (its warm-up compiles it), `MLX_BUN_CUDA_KERNEL=1` turns it on
//! elsewhere, `=0` off everywhere, `=all` takes single rows and layers of
//! any size. Design and numbers:
//! `docs/gpu.md`.

use std::ffi::CString;
use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::{anyhow, bail, Result};
use mlx_rs::{Array, Dtype};

use crate::quant::QuantSpec;
use crate::settings::CudaKernel;

const SOURCE: &str = include_str!("../../kernels/cuda/qmv.cu");
/// Rows of `x` the kernel takes; from 8 rows MLX's tiled kernel wins.
pub(crate) const MAX_ROWS: usize = 4;
/// Fewest rows it takes unless `MLX_BUN_CUDA_KERNEL=all`. At one row the
/// kernel itself is 2.6-3.4 times as fast as MLX's on large layers, but MLX
/// spends about 10 us more host time making each custom-kernel node than its
/// own, and a single-sequence step of an 8B model is already bound by the
/// host: no faster end to end (docs/gpu.md). From two rows it wins.
const MIN_ROWS: usize = 2;
/// Smallest layer (out x in features) it takes unless `all`: Llama-8B's
/// 4096 x 4096 and larger; at 1024 x 4096 it was no faster than MLX's.
const MIN_WEIGHTS: i64 = 16 << 20;
const WARPS_PER_BLOCK: i32 = 4;
/// Static shared memory a block may hold (CUDA's limit without opting in).
const SHARED_BYTES: i64 = 48 << 10;

const UNSET: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;
const ALL: u8 = 3;
/// Every layer and row count it can compute (`bench qmv` times any shape).
const EVERYWHERE: u8 = 4;
/// The kernel's state in this process: from the settings on first use,
/// switched only by benchmarks ([`set_enabled`], [`set_everywhere`]).
static STATE: AtomicU8 = AtomicU8::new(UNSET);

/// Whether the kernel is used where it applies (GPU only).
pub fn enabled() -> bool {
    state() != OFF
}

fn state() -> u8 {
    match STATE.load(Ordering::Relaxed) {
        UNSET => {
            let state = if !crate::mlx_ext::on_gpu() {
                OFF
            } else {
                match crate::settings::get().cuda_kernel {
                    CudaKernel::All => ALL,
                    CudaKernel::On => ON,
                    CudaKernel::Off | CudaKernel::Unset => OFF,
                }
            };
            STATE.store(state, Ordering::Relaxed);
            state
        }
        state => state,
    }
}

/// Which products the kernel takes in this process now (a compiled trace
/// holds the routing it was traced with).
pub(crate) fn routing() -> u8 {
    state()
}

/// Whether a benchmark forced mlx-bun's kernels everywhere they can run
/// ([`set_everywhere`]).
pub(crate) fn forced_everywhere() -> bool {
    state() == EVERYWHERE
}

/// Turns the kernel on or off for this process (benchmarks compare both);
/// on keeps the settings' `all` policy.
pub fn set_enabled(on: bool) {
    let all = crate::settings::get().cuda_kernel == CudaKernel::All;
    let state = match (on, all) {
        (false, _) => OFF,
        (true, true) => ALL,
        (true, false) => ON,
    };
    STATE.store(state, Ordering::Relaxed);
}

/// Uses the kernel for every quantized layer and row count it can compute,
/// narrow layers included (`bench qmv` times it on any shape).
pub fn set_everywhere() {
    STATE.store(EVERYWHERE, Ordering::Relaxed);
}

/// True when the kernel computes `quantized_matmul(x, w, scales, biases,
/// transpose = true)` for these operands.
pub fn applies(x: &Array, w: &Array, scales: &Array, biases: &Array, spec: QuantSpec) -> bool {
    let k = x.shape().last().copied().unwrap_or(0);
    fits(x, w, scales, biases, spec) && wins(x, w.shape()[0] as i64 * k as i64)
}

/// Whether the routing takes `x`'s rows for a product of `weights`
/// weights: from [`MIN_ROWS`] rows (one with `all`) on layers of at least
/// [`MIN_WEIGHTS`] (narrower ones were slower than MLX's kernel, `all`
/// included: docs/gpu.md).
fn wins(x: &Array, weights: i64) -> bool {
    let rows = x.size() / x.shape().last().map_or(1, |&k| k.max(1) as usize);
    match state() {
        OFF => false,
        EVERYWHERE => true,
        ALL => weights >= MIN_WEIGHTS,
        _ => rows >= MIN_ROWS && weights >= MIN_WEIGHTS,
    }
}

/// Whether the kernel can compute this product at all (dtypes, layout,
/// at most [`MAX_ROWS`] rows).
fn fits(x: &Array, w: &Array, scales: &Array, biases: &Array, spec: QuantSpec) -> bool {
    if x.ndim() == 0 || w.ndim() != 2 || scales.ndim() != 2 {
        return false;
    }
    let k = x.shape()[x.ndim() - 1];
    let rows = x.size() / k.max(1) as usize;
    let per_chunk = 128 / spec.bits.max(1);
    rows >= 1
        && matches!(spec.bits, 4 | 8)
        && rows <= MAX_ROWS
        && matches!(x.dtype(), Dtype::Float16 | Dtype::Bfloat16)
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

/// `residual + x @ dequantize(w).T` by one launch (the sum rounded as
/// MLX's separate add rounds it); `None` where the kernel does not take the
/// product or `residual` is not of the output's shape and dtype.
pub fn quantized_matvec_plus(
    x: &Array,
    [w, scales, biases]: [&Array; 3],
    residual: &Array,
    spec: QuantSpec,
) -> Result<Option<Array>> {
    let fits_residual = residual.dtype() == x.dtype()
        && residual.ndim() == x.ndim()
        && residual.shape()[..x.ndim() - 1] == x.shape()[..x.ndim() - 1]
        && residual.shape().last() == w.shape().first();
    if !fits_residual || !applies(x, w, scales, biases, spec) {
        return Ok(None);
    }
    launch(Variant::Residual, x, &[w, scales, biases, residual], spec).map(Some)
}

/// An RMS norm applied to a product's input inside the product's launch:
/// its weight `[K]` and epsilon, rounded step by step as MLX's `rms_norm`.
#[derive(Clone, Copy)]
pub struct RmsNormWeight<'a> {
    /// The per-feature scale.
    pub weight: &'a Array,
    /// Added to the mean square before its root.
    pub eps: f32,
}

impl RmsNormWeight<'_> {
    /// Whether the kernel can normalize `x` `[.., K]` itself: the weight of
    /// `x`'s dtype and length, `x` staged in shared memory.
    fn fits(&self, x: &Array, spec: QuantSpec) -> bool {
        let k = x.shape()[x.ndim() - 1];
        let rows = (x.size() / k.max(1) as usize) as i32;
        self.weight.dtype() == x.dtype()
            && self.weight.shape() == [k]
            && self.eps.is_finite()
            && self.eps >= 0.0
            && shared_x_cap(k, row_bound(rows), 128 / spec.bits) > 0
    }
}

/// The query, key and value projections of `x` (each a quantized `(w,
/// scales, biases)` of one quantization) by one launch, of `x` after `norm`
/// when given; `None` where the kernel does not take them. The three count
/// as one layer for the routing, so the narrow key and value projections
/// ride along with the queries'.
pub fn quantized_qkv(
    x: &Array,
    layers: [[&Array; 3]; 3],
    spec: QuantSpec,
    norm: Option<RmsNormWeight>,
) -> Result<Option<[Array; 3]>> {
    let k = x.shape().last().copied().unwrap_or(0);
    let weights: i64 = layers
        .iter()
        .map(|[w, ..]| w.shape()[0] as i64 * k as i64)
        .sum();
    let same_types = layers
        .iter()
        .all(|[_, s, b]| s.dtype() == layers[0][1].dtype() && b.dtype() == layers[0][2].dtype());
    if !same_types
        || !wins(x, weights)
        || !layers.iter().all(|[w, s, b]| fits(x, w, s, b, spec))
        || norm.is_some_and(|n| !n.fits(x, spec))
    {
        return Ok(None);
    }
    let [[qw, qs, qb], [kw, ks, kb], [vw, vs, vb]] = layers;
    let weights = [qw, qs, qb, kw, ks, kb, vw, vs, vb];
    let mut out = launch_all(Variant::Qkv, x, &weights, spec, norm)?;
    if out.len() != 3 {
        bail!("the CUDA kernel returned {} arrays for q, k, v", out.len());
    }
    let v = out.pop().expect("three");
    let k = out.pop().expect("three");
    let q = out.pop().expect("three");
    Ok(Some([q, k, v]))
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
    launch(Variant::Plain, x, &[w, scales, biases], spec)
}

/// `silu(x @ gate.T) * (x @ up.T)` (each a quantized `(w, scales, biases)`)
/// by one CUDA kernel, of `x` after `norm` when given, rounded step by step
/// as MLX computes it; `None` where the kernel does not apply to both.
pub fn quantized_silu_glu(
    x: &Array,
    gate: [&Array; 3],
    up: [&Array; 3],
    spec: QuantSpec,
    norm: Option<RmsNormWeight>,
) -> Result<Option<Array>> {
    let [gw, gs, gb] = gate;
    let [uw, us, ub] = up;
    let same = gw.shape() == uw.shape()
        && gs.shape() == us.shape()
        && gs.dtype() == us.dtype()
        && ub.dtype() == gb.dtype();
    if !same
        || !applies(x, gw, gs, gb, spec)
        || !applies(x, uw, us, ub, spec)
        || norm.is_some_and(|n| !n.fits(x, spec))
    {
        return Ok(None);
    }
    launch_all(Variant::Glu, x, &[gw, gs, gb, uw, us, ub], spec, norm)?
        .pop()
        .ok_or_else(|| anyhow!("the CUDA kernel {} returned nothing", Variant::Glu.name()))
        .map(Some)
}

fn launch(variant: Variant, x: &Array, weights: &[&Array], spec: QuantSpec) -> Result<Array> {
    launch_all(variant, x, weights, spec, None)?
        .pop()
        .ok_or_else(|| anyhow!("the CUDA kernel {} returned nothing", variant.name()))
}

/// Launches `variant` on `x` and its weights (and residual), one output per
/// product it computes; with `norm`, of `x` normalized in the launch (the
/// caller checks [`RmsNormWeight::fits`]).
fn launch_all(
    variant: Variant,
    x: &Array,
    weights: &[&Array],
    spec: QuantSpec,
    norm: Option<RmsNormWeight>,
) -> Result<Vec<Array>> {
    let variant = match (variant, norm.is_some()) {
        (Variant::Qkv, true) => Variant::QkvNorm,
        (Variant::Glu, true) => Variant::GluNorm,
        (variant, false) => variant,
        (variant, true) => bail!("the CUDA kernel {} takes no norm", variant.name()),
    };
    let k = x.shape()[x.ndim() - 1];
    let rows = (x.size() / k as usize) as i32;
    // The output widths: one product, or q, k and v.
    let widths: Vec<i32> = match variant {
        Variant::Qkv | Variant::QkvNorm => weights.chunks(3).map(|l| l[0].shape()[0]).collect(),
        _ => vec![weights[0].shape()[0]],
    };
    let scales = weights[1];
    let bound = row_bound(rows);
    let tuning = tuning();
    let per_warp = tuning
        .columns
        .filter(|r| widths.iter().all(|n| n % r == 0))
        .unwrap_or_else(|| columns_per_warp(&widths));
    let template_ints = [
        bound,
        spec.group_size,
        spec.bits,
        tuning.warps,
        per_warp,
        shared_x_cap(k, bound, 128 / spec.bits),
        norm.map_or(0, |n| n.eps.to_bits() as i32),
    ];
    let blocks: i32 = widths
        .iter()
        .map(|n| (n / per_warp + tuning.warps - 1) / tuning.warps)
        .sum();
    let outputs: Vec<(Vec<i32>, Dtype)> = widths
        .iter()
        .map(|&n| {
            let mut shape: Vec<i32> = x.shape()[..x.ndim() - 1].to_vec();
            shape.push(n);
            (shape, x.dtype())
        })
        .collect();
    let mut inputs = vec![x];
    inputs.extend(norm.map(|n| n.weight));
    inputs.extend_from_slice(weights);
    run_kernel(
        kernel(variant)?,
        &inputs,
        &outputs,
        &template_ints,
        &[x.dtype(), scales.dtype()],
        (blocks * tuning.warps * 32, 1, 1),
        (tuning.warps * 32, 1, 1),
    )
}

/// The kernel's `MB`: a bound on the rows of x.
fn row_bound(rows: i32) -> i32 {
    [1, 2, 4]
        .into_iter()
        .find(|&b| b >= rows)
        .unwrap_or(MAX_ROWS as i32)
}

/// Launch shape overrides from the settings, for tuning on a new GPU:
/// output columns per warp (1, 2, 4 or 8) and warps per block (1 to 16).
#[derive(Clone, Copy)]
struct Tuning {
    columns: Option<i32>,
    warps: i32,
}

fn tuning() -> Tuning {
    let qmv = &crate::settings::get().qmv;
    Tuning {
        columns: qmv.columns,
        warps: qmv.warps.unwrap_or(WARPS_PER_BLOCK),
    }
}

/// Warps a layer's grid should have at least: an H200 has 132 SMs, and
/// fewer warps than this leave SMs idle on a narrow layer (4096 x 4096 ran
/// at 8.0-8.1 us with 2 columns per warp against 8.9-9.3 with 4).
const MIN_GRID_WARPS: i32 = 2048;

/// Output columns per warp: 4 (the fastest on the wide Llama-8B layers on
/// an H200, docs/gpu.md) where that leaves the grid [`MIN_GRID_WARPS`]
/// warps, else fewer; always a divisor of every width in the launch.
fn columns_per_warp(widths: &[i32]) -> i32 {
    let total: i32 = widths.iter().sum();
    [4, 2, 1]
        .into_iter()
        .filter(|&r| widths.iter().all(|n| n % r == 0))
        .find(|&r| r == 1 || total / r >= MIN_GRID_WARPS)
        .unwrap_or(1)
}

/// The kernel's `KCAP`: the smallest power of two at least `k` for which
/// `rows` rows of x, as halves plus one float per chunk of `per_chunk`
/// values, fit in a block's shared memory; 0 (each warp converts x itself)
/// when none does.
fn shared_x_cap(k: i32, rows: i32, per_chunk: i32) -> i32 {
    let cap = (k.max(1) as u32).next_power_of_two() as i64;
    let bytes = rows as i64 * (cap * 2 + cap / per_chunk as i64 * 4);
    if bytes <= SHARED_BYTES {
        cap as i32
    } else {
        0
    }
}

/// The kernel's two entry points: a plain product, and the gated MLP's
/// `silu(x @ gate.T) * (x @ up.T)` from two weights at once.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Variant {
    Plain,
    Glu,
    /// A plain product plus a residual of its shape.
    Residual,
    /// The query, key and value projections of one input.
    Qkv,
    /// `Qkv` of the input after an RMS norm.
    QkvNorm,
    /// `Glu` of the input after an RMS norm.
    GluNorm,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Plain => "mlx_bun_qmv",
            Variant::Glu => "mlx_bun_qmv_glu",
            Variant::Residual => "mlx_bun_qmv_residual",
            Variant::Qkv => "mlx_bun_qmv_qkv",
            Variant::QkvNorm => "mlx_bun_qmv_qkv_norm",
            Variant::GluNorm => "mlx_bun_qmv_glu_norm",
        }
    }

    fn inputs(self) -> &'static [&'static str] {
        match self {
            Variant::Plain => &["x", "w", "scales", "biases"],
            Variant::Glu => &["x", "w", "scales", "biases", "w2", "scales2", "biases2"],
            Variant::Residual => &["x", "w", "scales", "biases", "residual"],
            Variant::Qkv => &[
                "x", "w", "scales", "biases", "wk", "sk", "bk", "wv", "sv", "bv",
            ],
            Variant::QkvNorm => &[
                "x", "norm", "w", "scales", "biases", "wk", "sk", "bk", "wv", "sv", "bv",
            ],
            Variant::GluNorm => &[
                "x", "norm", "w", "scales", "biases", "w2", "scales2", "biases2",
            ],
        }
    }

    fn outputs(self) -> &'static [&'static str] {
        match self {
            Variant::Qkv | Variant::QkvNorm => &["y", "yk", "yv"],
            _ => &["y"],
        }
    }

    /// The kernel body MLX wraps in a signature: one call of `qmv()` (or of
    /// `qkv()`, three products).
    fn body(self) -> &'static str {
        match self {
            Variant::Plain => {
                "mlx_bun_qmv::qmv<T, S, MB, GS, BITS, WARPS, R, KCAP, false>(\n\
                 x, x_shape, x_ndim, w, w_shape, scales, biases, w, scales, biases, y, nullptr, 0);\n"
            }
            Variant::Glu => {
                "mlx_bun_qmv::qmv<T, S, MB, GS, BITS, WARPS, R, KCAP, true>(\n\
                 x, x_shape, x_ndim, w, w_shape, scales, biases, w2, scales2, biases2, y, nullptr, 0);\n"
            }
            Variant::Residual => {
                "mlx_bun_qmv::qmv<T, S, MB, GS, BITS, WARPS, R, KCAP, false>(\n\
                 x, x_shape, x_ndim, w, w_shape, scales, biases, w, scales, biases, y, residual, 0);\n"
            }
            Variant::Qkv => {
                "mlx_bun_qmv::qkv<T, S, MB, GS, BITS, WARPS, R, KCAP>(\n\
                 x, x_shape, x_ndim, w, w_shape, scales, biases, wk, wk_shape, sk, bk,\n\
                 wv, wv_shape, sv, bv, y, yk, yv);\n"
            }
            Variant::QkvNorm => {
                "mlx_bun_qmv::qkv<T, S, MB, GS, BITS, WARPS, R, KCAP>(\n\
                 x, x_shape, x_ndim, w, w_shape, scales, biases, wk, wk_shape, sk, bk,\n\
                 wv, wv_shape, sv, bv, y, yk, yv, norm, __int_as_float(EPS));\n"
            }
            Variant::GluNorm => {
                "mlx_bun_qmv::qmv<T, S, MB, GS, BITS, WARPS, R, KCAP, true>(\n\
                 x, x_shape, x_ndim, w, w_shape, scales, biases, w2, scales2, biases2, y, nullptr, 0,\n\
                 norm, __int_as_float(EPS));\n"
            }
        }
    }
}

/// `EPS`: the bits of a fused norm's epsilon as an `int` (0 without one).
const INT_PARAMS: [&str; 7] = ["MB", "GS", "BITS", "WARPS", "R", "KCAP", "EPS"];
const TYPE_PARAMS: [&str; 2] = ["T", "S"];

pub(crate) fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| anyhow!("kernel text contains a NUL byte"))
}

/// The kernel source without comments.
pub(crate) fn compact(source: &str) -> String {
    source
        .lines()
        .map(|line| match line.find("//") {
            Some(at) => line[..at].trim(),
            None => line.trim(),
        })
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The MLX custom-kernel object and the C strings each application passes,
/// made once per process and variant.
pub(crate) struct Kernel {
    name: &'static str,
    handle: mlx_sys::mlx_fast_cuda_kernel,
    int_params: Vec<CString>,
    type_params: Vec<CString>,
}
// SAFETY: the handle wraps an immutable MLX function object that MLX calls
// from any thread; it is never freed. The C strings are never mutated.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

fn kernel(variant: Variant) -> Result<&'static Kernel> {
    type Slot = std::sync::OnceLock<Result<Kernel, String>>;
    static PLAIN: Slot = std::sync::OnceLock::new();
    static GLU: Slot = std::sync::OnceLock::new();
    static RESIDUAL: Slot = std::sync::OnceLock::new();
    static QKV: Slot = std::sync::OnceLock::new();
    static QKV_NORM: Slot = std::sync::OnceLock::new();
    static GLU_NORM: Slot = std::sync::OnceLock::new();
    let slot = match variant {
        Variant::Plain => &PLAIN,
        Variant::Glu => &GLU,
        Variant::Residual => &RESIDUAL,
        Variant::Qkv => &QKV,
        Variant::QkvNorm => &QKV_NORM,
        Variant::GluNorm => &GLU_NORM,
    };
    slot.get_or_init(|| make_kernel(variant).map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

/// The header handed to MLX: `kernels/cuda/qmv.cu`, or the file named by
/// `MLX_BUN_QMV_SOURCE` (for trying a change on a GPU without a rebuild),
/// without comments (MLX copies the whole text into each kernel node).
fn header() -> Result<&'static str> {
    static HEADER: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    HEADER
        .get_or_init(|| {
            let source = match &crate::settings::get().qmv.source {
                Some(path) => std::fs::read_to_string(path)
                    .map_err(|e| format!("reading MLX_BUN_QMV_SOURCE {}: {e}", path.display()))?,
                None => SOURCE.to_string(),
            };
            Ok(compact(&source))
        })
        .as_ref()
        .map(String::as_str)
        .map_err(|e| anyhow!("{e}"))
}

/// What MLX needs to make one custom kernel.
pub(crate) struct KernelText<'a> {
    pub(crate) name: &'static str,
    /// Device code the body calls, without comments (MLX copies the whole
    /// text into each kernel node).
    pub(crate) header: &'a str,
    /// The statements MLX wraps in a kernel signature.
    pub(crate) body: &'a str,
    pub(crate) inputs: &'a [&'a str],
    pub(crate) outputs: &'a [&'a str],
    /// Names of the compile-time integers, in the order applications give them.
    pub(crate) int_params: &'a [&'a str],
    /// Names of the compile-time types, in the order applications give them.
    pub(crate) type_params: &'a [&'a str],
}

fn make_kernel(variant: Variant) -> Result<Kernel> {
    make_custom_kernel(&KernelText {
        name: variant.name(),
        header: header()?,
        body: variant.body(),
        inputs: variant.inputs(),
        outputs: variant.outputs(),
        int_params: &INT_PARAMS,
        type_params: &TYPE_PARAMS,
    })
}

/// An MLX custom kernel for `text` (compiled by NVRTC on its first launch).
pub(crate) fn make_custom_kernel(text: &KernelText) -> Result<Kernel> {
    let name = cstring(text.name)?;
    let header = cstring(text.header)?;
    let body = cstring(text.body)?;
    let input_names: Vec<CString> = text
        .inputs
        .iter()
        .map(|n| cstring(n))
        .collect::<Result<_>>()?;
    let output_names: Vec<CString> = text
        .outputs
        .iter()
        .map(|n| cstring(n))
        .collect::<Result<_>>()?;
    // SAFETY: the C strings outlive the calls; the vectors are freed after
    // MLX has copied them into the kernel object.
    let handle = unsafe {
        let in_ptrs: Vec<*const std::os::raw::c_char> =
            input_names.iter().map(|s| s.as_ptr()).collect();
        let in_names =
            mlx_sys::mlx_vector_string_new_data(in_ptrs.as_ptr() as *mut _, in_ptrs.len());
        let out_ptrs: Vec<*const std::os::raw::c_char> =
            output_names.iter().map(|s| s.as_ptr()).collect();
        let out_names =
            mlx_sys::mlx_vector_string_new_data(out_ptrs.as_ptr() as *mut _, out_ptrs.len());
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
        kernel
    };
    if handle.ctx.is_null() {
        bail!("MLX could not create the CUDA kernel {}", text.name);
    }
    Ok(Kernel {
        name: text.name,
        handle,
        int_params: text
            .int_params
            .iter()
            .map(|n| cstring(n))
            .collect::<Result<_>>()?,
        type_params: text
            .type_params
            .iter()
            .map(|n| cstring(n))
            .collect::<Result<_>>()?,
    })
}

/// Applies the kernel (compiled by MLX on first use) to `inputs` in the order
/// of the variant's input names; `grid` counts threads in total per
/// dimension (MLX divides by the block).
pub(crate) fn run_kernel(
    kernel: &Kernel,
    inputs: &[&Array],
    outputs: &[(Vec<i32>, Dtype)],
    ints: &[i32],
    types: &[Dtype],
    grid: (i32, i32, i32),
    block: (i32, i32, i32),
) -> Result<Vec<Array>> {
    if ints.len() != kernel.int_params.len() || types.len() != kernel.type_params.len() {
        bail!("the CUDA kernel {} takes other parameters", kernel.name);
    }
    // SAFETY: every handle created here is freed before returning; the
    // C strings live as long as the process; on success the output array is
    // copied out of the vector (a new reference) before the vector is freed.
    unsafe {
        let config = mlx_sys::mlx_fast_cuda_kernel_config_new();
        let mut rc = 0;
        for (shape, dtype) in outputs {
            rc |= mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
                config,
                shape.as_ptr(),
                shape.len(),
                *dtype as mlx_sys::mlx_dtype,
            );
        }
        rc |= mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, grid.0, grid.1, grid.2);
        rc |= mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(
            config, block.0, block.1, block.2,
        );
        for (n, d) in kernel.type_params.iter().zip(types) {
            rc |= mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(
                config,
                n.as_ptr(),
                *d as mlx_sys::mlx_dtype,
            );
        }
        for (n, v) in kernel.int_params.iter().zip(ints) {
            rc |= mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(config, n.as_ptr(), *v);
        }
        let handles: Vec<mlx_sys::mlx_array> = inputs.iter().map(|a| a.as_ptr()).collect();
        let inputs = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
        let stream = mlx_sys::mlx_default_gpu_stream_new();
        let mut made = mlx_sys::mlx_vector_array_new();
        if rc == 0 {
            rc = mlx_sys::mlx_fast_cuda_kernel_apply(
                &mut made,
                kernel.handle,
                inputs,
                config,
                stream,
            );
        }
        let mut result = Err(anyhow!(
            "the CUDA kernel {} failed to build or run",
            kernel.name
        ));
        if rc == 0 && mlx_sys::mlx_vector_array_size(made) == outputs.len() {
            let mut arrays = Vec::with_capacity(outputs.len());
            for i in 0..outputs.len() {
                let mut out = mlx_sys::mlx_array_new();
                if mlx_sys::mlx_vector_array_get(&mut out, made, i) == 0 {
                    arrays.push(Array::from_ptr(out));
                } else {
                    mlx_sys::mlx_array_free(out);
                }
            }
            if arrays.len() == outputs.len() {
                result = Ok(arrays);
            }
        }
        mlx_sys::mlx_vector_array_free(made);
        mlx_sys::mlx_stream_free(stream);
        mlx_sys::mlx_vector_array_free(inputs);
        mlx_sys::mlx_fast_cuda_kernel_config_free(config);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_source_keeps_code_and_drops_comments() {
        let text = compact(SOURCE);
        assert!(!text.contains("//"));
        assert!(text.contains("#include <cuda_bf16.h>"));
        assert!(
            text.contains("w_shape[0]") && text.contains("__device__ __forceinline__ void qmv(")
        );
        assert!(3 * text.len() < 2 * SOURCE.len());
    }

    #[test]
    fn bodies_call_the_kernel_with_every_input() {
        for variant in [
            Variant::Plain,
            Variant::Glu,
            Variant::Residual,
            Variant::Qkv,
            Variant::QkvNorm,
            Variant::GluNorm,
        ] {
            let body = variant.body();
            for input in variant.inputs() {
                assert!(body.contains(&format!("{input},")), "{input} in {body}");
            }
            for output in variant.outputs() {
                assert!(
                    body.contains(&format!("{output},")) || body.contains(&format!("{output})")),
                    "{output} in {body}"
                );
            }
            assert!(
                body.contains("x_shape") && body.contains("w_shape") && body.contains("x_ndim")
            );
        }
    }

    #[test]
    fn columns_per_warp_divides_the_layer() {
        for n in [1024, 4096, 14336, 128256, 151936, 3, 6] {
            let r = columns_per_warp(&[n]);
            assert_eq!(n % r, 0, "{n}");
        }
        assert_eq!(columns_per_warp(&[14336]), 4);
        assert_eq!(columns_per_warp(&[4096]), 2);
        assert_eq!(columns_per_warp(&[1024]), 1);
        assert_eq!(columns_per_warp(&[6]), 1);
        // q, k and v of Llama-8B in one launch: 6144 columns.
        assert_eq!(columns_per_warp(&[4096, 1024, 1024]), 2);
        assert_eq!(columns_per_warp(&[4096, 1024, 1022]), 2);
        assert_eq!(columns_per_warp(&[4096, 1024, 1021]), 1);
    }

    #[test]
    fn x_is_staged_in_shared_memory_when_it_fits() {
        assert_eq!(shared_x_cap(4096, 1, 32), 4096);
        assert_eq!(shared_x_cap(14336, 1, 32), 16384);
        assert_eq!(shared_x_cap(14336, 2, 32), 0);
        assert_eq!(shared_x_cap(4096, 4, 32), 4096);
        assert_eq!(shared_x_cap(2048, 2, 16), 2048);
        assert_eq!(shared_x_cap(28672, 1, 32), 0);
    }
}
