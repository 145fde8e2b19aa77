//! Building blocks shared by the architectures: linear layers (dense or
//! quantized in any MLX mode, with an optional LoRA adapter), embeddings,
//! RMS norm and rotary embeddings.

use anyhow::{anyhow, Context, Result};
use std::cell::Cell;

use mlx_rs::ops::{addmm, matmul};
use mlx_rs::Array;

use super::config::{RopeScaling, YarnScaling};
use super::weights::Weights;
use crate::quant::{dequantize, quantized_matmul, QuantSpec};

thread_local! {
    static DIFFERENTIABLE_QUANTIZED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with quantized layers computed by MLX's `quantized_matmul`, whose
/// gradient reaches the scales and biases (DWQ trains them); mlx-bun's CPU
/// kernel and the dense path differentiate only where adapters need it.
pub(crate) fn with_differentiable_quantization<R>(f: impl FnOnce() -> R) -> R {
    let before = DIFFERENTIABLE_QUANTIZED.with(|c| c.replace(true));
    let out = f();
    DIFFERENTIABLE_QUANTIZED.with(|c| c.set(before));
    out
}

fn differentiable_quantized() -> bool {
    DIFFERENTIABLE_QUANTIZED.with(Cell::get)
}

/// A low-rank adapter: `y += scale * (dropout(x) @ a) @ b`, `a: [in, r]`, `b: [r, out]`.
#[derive(Clone)]
pub struct Lora {
    /// The down projection `[in, r]`.
    pub a: Array,
    /// The up projection `[r, out]`.
    pub b: Array,
    /// Multiplies the adapter's output (mlx-lm's `scale`).
    pub scale: f32,
    /// Dropout probability on the adapter input; non-zero only while training.
    pub dropout: f32,
}

/// A linear layer's weight, as stored.
#[derive(Clone)]
pub enum LinearWeight {
    /// A float matrix `[out, in]`.
    Dense(Array),
    /// Packed `weight` with its `scales`, and `biases` in affine mode only.
    Quantized {
        /// The packed quantized values `[out, in × bits / 32]` (`uint32`).
        weight: Array,
        /// One scale per group of `spec.group_size` inputs.
        scales: Array,
        /// One bias per group (affine mode); `None` in the `mxfp4`, `nvfp4` and `mxfp8` modes.
        biases: Option<Array>,
        /// Bits, group size and mode of the quantization.
        spec: QuantSpec,
    },
}

impl LinearWeight {
    /// The same weight with `f` applied to each stored array (the packed
    /// values, scales and biases alike), e.g. to slice rows or heads.
    pub(crate) fn map_arrays(&self, f: impl Fn(&Array) -> Array) -> LinearWeight {
        match self {
            LinearWeight::Dense(w) => LinearWeight::Dense(f(w)),
            LinearWeight::Quantized {
                weight,
                scales,
                biases,
                spec,
            } => LinearWeight::Quantized {
                weight: f(weight),
                scales: f(scales),
                biases: biases.as_ref().map(&f),
                spec: *spec,
            },
        }
    }
}

/// A linear layer `y = x @ weight.T + bias`, dense or quantized, with an
/// optional LoRA adapter.
#[derive(Clone)]
pub struct Linear {
    /// The weight matrix `[out, in]`, dense or quantized.
    pub weight: LinearWeight,
    /// The bias `[out]`, if the layer has one.
    pub bias: Option<Array>,
    /// A LoRA adapter added to the output.
    pub lora: Option<Lora>,
    /// Row-parallel under tensor parallelism: the output is this rank's
    /// partial sum, summed across the group.
    pub all_sum: Option<crate::collective::Group>,
}

impl Linear {
    /// Loads `{prefix}.weight` (+ `scales`/`biases` when quantized, `bias` if present).
    pub fn load(w: &mut Weights, prefix: &str) -> Result<Self> {
        let weight = load_weight(w, prefix)?;
        let bias = w.take_opt(&format!("{prefix}.bias"))?;
        w.count_init_draws(usize::from(bias.is_some()));
        Ok(Self {
            weight,
            bias,
            lora: None,
            all_sum: None,
        })
    }

    /// The packed weight, scales and biases of a plain affine-quantized
    /// layer (no bias, adapter or cross-rank sum) outside training: what a
    /// fused kernel may read in place of [`Linear::forward`].
    pub(crate) fn plain_quantized(&self) -> Option<([&Array; 3], QuantSpec)> {
        match &self.weight {
            LinearWeight::Quantized {
                weight,
                scales,
                biases: Some(biases),
                spec,
            } if self.bias.is_none()
                && self.lora.is_none()
                && self.all_sum.is_none()
                && !differentiable_quantized() =>
            {
                Some(([weight, scales, biases], *spec))
            }
            _ => None,
        }
    }

    /// `x @ weight.T + bias` (plus the adapter, summed across ranks when
    /// row-parallel) for `x` `[.., in]`: `[.., out]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let mut y = match (&self.weight, &self.bias) {
            (LinearWeight::Dense(w), Some(b)) => addmm(b, x, w.t(), None, None)?,
            (LinearWeight::Dense(w), None) => matmul(x, w.t())?,
            (
                LinearWeight::Quantized {
                    weight,
                    scales,
                    biases,
                    spec,
                },
                bias,
            ) => {
                let biases = biases.as_ref();
                let y = if differentiable_quantized() {
                    quantized_matmul(x, weight, scales, biases, true, *spec)?
                } else if !crate::kernels::cpu_kernel_takes(x, weight, scales, biases, *spec)
                    && dense_path_for(x)
                {
                    let w = dequantize(weight, scales, biases, *spec)?;
                    matmul(x, w.t())?
                } else {
                    crate::kernels::quantized_matmul_t(x, weight, scales, biases, *spec)?
                };
                match bias {
                    Some(b) => &y + b,
                    None => y,
                }
            }
        };
        if let Some(lora) = &self.lora {
            let z = if lora.dropout > 0.0 {
                let keep = 1.0 - lora.dropout;
                let mask = mlx_rs::random::bernoulli(&Array::from_f32(keep), x.shape(), None)?;
                let dropped = &(x * &mask) / keep;
                matmul(matmul(&dropped, &lora.a)?, &lora.b)?
            } else {
                matmul(matmul(x, &lora.a)?, &lora.b)?
            };
            // As mlx-lm: the update is computed in the adapter's dtype and
            // added in the activations' dtype.
            y = &y + &(&z * lora.scale).as_dtype(x.dtype())?;
        }
        if let Some(group) = &self.all_sum {
            y = group.all_sum(&y)?;
        }
        Ok(y)
    }

    /// `residual + self.forward(x)`: in one node where the CPU kernel takes
    /// the product (a plain quantized layer), else the two steps; the sums
    /// are the same either way.
    pub fn forward_plus(&self, x: &Array, residual: &Array) -> Result<Array> {
        let rows = x.size() / x.shape().last().map_or(1, |&k| k.max(1) as usize);
        if let Some((params, spec)) = self.plain_quantized().filter(|_| rows <= FUSED_ADD_ROWS) {
            if let Some(y) = crate::kernels::quantized_matmul_add(x, params, residual, spec)? {
                return Ok(y);
            }
        }
        Ok(residual + &self.forward(x)?)
    }

    /// Splits a fused layer (Phi-3's `qkv_proj`, `gate_up_proj`) into layers
    /// of `rows` output rows each, in order. Quantized weights split along
    /// their rows too (packing and groups run along the input).
    pub(crate) fn split_rows(&self, rows: &[i32]) -> Result<Vec<Linear>> {
        use mlx_rs::ops::indexing::IndexOp;
        let total: i32 = rows.iter().sum();
        if total != self.shape().0 {
            anyhow::bail!(
                "a fused layer of {} rows cannot split into {rows:?}",
                self.shape().0
            );
        }
        let mut start = 0;
        let mut parts = Vec::with_capacity(rows.len());
        for &n in rows {
            let weight = self.weight.map_arrays(|a| a.index((start..start + n, ..)));
            let bias = self.bias.as_ref().map(|b| b.index(start..start + n));
            parts.push(Linear {
                weight,
                bias,
                lora: None,
                all_sum: None,
            });
            start += n;
        }
        Ok(parts)
    }

    /// `(out_features, in_features)`.
    pub fn shape(&self) -> (i32, i32) {
        match &self.weight {
            LinearWeight::Dense(w) => (w.shape()[0], w.shape()[1]),
            LinearWeight::Quantized { weight, spec, .. } => {
                (weight.shape()[0], weight.shape()[1] * 32 / spec.bits)
            }
        }
    }
}

/// The most rows whose residual add joins the product's node: decode steps
/// and drafts, where a node costs more than the add. A prompt keeps MLX's
/// separate add, which reuses the product's buffer (fused, a 700-token
/// prompt's peak memory grew by 7 %).
const FUSED_ADD_ROWS: usize = 16;

/// The most token ids whose embedding rows one CPU primitive takes: decode
/// steps and drafts. A prompt keeps MLX's gathers and dequantization, whose
/// buffers MLX reuses (through the primitive, a 700-token prompt's peak
/// memory grew by 1 MiB).
const FUSED_EMBEDDING_ROWS: usize = 16;

/// Rows from which a quantized layer the CPU kernel (`crate::kernels`) does
/// not take is dequantized and run as a dense matmul on the CPU: MLX's CPU
/// quantized kernel costs the same per row at any batch size, while a GEMM
/// reads the weights once for all rows. Only for float32 activations: in a
/// model's own half-precision dtype (`--compute-dtype model`) the layer
/// computes as mlx-lm's does. The settings' `dense_rows` (0 turns this off).
fn dense_rows_threshold() -> usize {
    if crate::mlx_ext::on_gpu() {
        return 0;
    }
    crate::settings::get().dense_rows
}

fn dense_path_for(x: &Array) -> bool {
    let threshold = dense_rows_threshold();
    let rows: i64 = x.shape()[..x.ndim() - 1]
        .iter()
        .map(|&d| d as i64)
        .product();
    threshold > 0 && rows >= threshold as i64 && x.dtype() == mlx_rs::Dtype::Float32
}

fn load_weight(w: &mut Weights, prefix: &str) -> Result<LinearWeight> {
    let spec = w.quant_spec(prefix)?;
    let weight = w.take(&format!("{prefix}.weight"))?;
    w.count_init_draws(1 + usize::from(spec.is_some()));
    match spec {
        Some(spec) => {
            let (scales, biases) = w.take_quant_params(prefix, spec)?;
            Ok(LinearWeight::Quantized {
                weight,
                scales,
                biases,
                spec,
            })
        }
        None => Ok(LinearWeight::Dense(weight)),
    }
}

/// Token embedding, dense or quantized; doubles as the tied output head.
#[derive(Clone)]
pub struct Embedding {
    /// The table `[vocab, hidden]`, dense or quantized.
    pub weight: LinearWeight,
}

impl Embedding {
    /// Loads `{prefix}.weight` (with `scales`/`biases` when quantized).
    pub fn load(w: &mut Weights, prefix: &str) -> Result<Self> {
        Ok(Self {
            weight: load_weight(w, prefix)?,
        })
    }

    /// The embedding rows `[.., hidden]` of the token ids `ids`, dequantized.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match &self.weight {
            LinearWeight::Dense(w) => Ok(w.take_axis(ids, 0)?),
            LinearWeight::Quantized {
                weight,
                scales,
                biases,
                spec,
            } => {
                let fused = ids.size() <= FUSED_EMBEDDING_ROWS && !differentiable_quantized();
                if let Some(biases) = biases.as_ref().filter(|_| fused) {
                    let table = [weight, scales, biases];
                    if let Some(rows) = crate::kernels::quantized_embedding(ids, table, *spec)? {
                        return Ok(rows);
                    }
                }
                let wq = weight.take_axis(ids, 0)?;
                let s = scales.take_axis(ids, 0)?;
                let b = biases.as_ref().map(|b| b.take_axis(ids, 0)).transpose()?;
                dequantize(&wq, &s, b.as_ref(), *spec)
            }
        }
    }

    /// Projects hidden states onto the vocabulary with the embedding matrix.
    pub(crate) fn as_linear(&self, x: &Array) -> Result<Array> {
        match &self.weight {
            LinearWeight::Dense(w) => Ok(matmul(x, w.t())?),
            LinearWeight::Quantized {
                weight,
                scales,
                biases,
                spec,
            } if differentiable_quantized() => {
                quantized_matmul(x, weight, scales, biases.as_ref(), true, *spec)
            }
            LinearWeight::Quantized {
                weight,
                scales,
                biases,
                spec,
            } => crate::kernels::quantized_matmul_t(x, weight, scales, biases.as_ref(), *spec),
        }
    }

    /// Number of rows in the table.
    pub fn vocab_size(&self) -> i32 {
        match &self.weight {
            LinearWeight::Dense(w) => w.shape()[0],
            LinearWeight::Quantized { weight, .. } => weight.shape()[0],
        }
    }
}

/// RMS normalization with a learned per-feature scale (`weight`).
#[derive(Clone)]
pub struct RmsNorm {
    /// The per-feature scale `[dims]`.
    pub weight: Array,
    /// Added to the mean square before its root (`rms_norm_eps`).
    pub eps: f32,
}

impl RmsNorm {
    /// Loads `{prefix}.weight`, normalizing with `eps`.
    pub fn load(w: &mut Weights, prefix: &str, eps: f32) -> Result<Self> {
        Ok(Self {
            weight: w.take(&format!("{prefix}.weight"))?,
            eps,
        })
    }

    /// A norm without a learned scale (MLX's `rms_norm(x, None, eps)`):
    /// its weight is `dims` ones of `dtype`.
    pub(crate) fn unscaled(dims: i32, eps: f32, dtype: mlx_rs::Dtype) -> Result<Self> {
        Ok(Self {
            weight: mlx_rs::ops::ones::<f32>(&[dims])?.as_dtype(dtype)?,
            eps,
        })
    }

    /// `x` normalized over its last axis and scaled by `weight`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        crate::kernels::rms_norm(x, &self.weight, self.eps)
    }

    /// The norm for the CUDA kernel to apply inside a product's launch,
    /// unless the settings keep it MLX's own node.
    pub(crate) fn in_kernel(&self) -> Option<crate::kernels::cuda::RmsNormWeight<'_>> {
        crate::settings::get()
            .qmv
            .norm
            .then_some(crate::kernels::cuda::RmsNormWeight {
                weight: &self.weight,
                eps: self.eps,
            })
    }
}

/// Rotary position embedding, with optional precomputed frequencies
/// (Llama 3 scaling) or a linear position scale.
#[derive(Clone)]
pub struct Rope {
    /// How many leading features of each head rotate (all of `head_dim`
    /// unless `partial_rotary_factor` says less).
    pub dims: i32,
    /// Rotates adjacent pairs (`rope_traditional`) instead of the two halves.
    pub traditional: bool,
    /// The frequency base (`rope_theta`), unused when `freqs` is set.
    pub base: f32,
    /// Multiplies the positions (`1 / factor` under linear scaling).
    pub scale: f32,
    /// Per-pair frequencies replacing `base` (Llama 3 and YaRN scaling), as
    /// MLX's `fast::rope` takes them.
    pub freqs: Option<Array>,
    /// Multiplies the rotated features before rotation (Phi-3's su/longrope
    /// attention factor); 1 elsewhere.
    pub mscale: f32,
}

impl Rope {
    /// RoPE over `dims` features with frequency base `base`, adjusted by the
    /// config's `rope_scaling`; errs on a scaling only Phi-3 supports.
    pub fn new(
        dims: i32,
        traditional: bool,
        base: f32,
        scaling: Option<&RopeScaling>,
    ) -> Result<Self> {
        let mut rope = Self {
            dims,
            traditional,
            base,
            scale: 1.0,
            freqs: None,
            mscale: 1.0,
        };
        match scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) => rope.scale = 1.0 / *factor as f32,
            Some(&RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                rope.freqs = Some(llama3_freqs(
                    dims,
                    base as f64,
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings,
                ));
            }
            Some(RopeScaling::Yarn(scaling)) => {
                let (freqs, attn) = yarn(dims, base, scaling)?;
                rope.freqs = Some(freqs);
                rope.mscale = attn;
            }
            Some(RopeScaling::LongRope) => {
                return Err(anyhow!(
                    "su/longrope RoPE scaling is supported on phi3 models only"
                ))
            }
        }
        Ok(rope)
    }

    /// `x` with its first `dims` features times `mscale`.
    fn pre_scale(&self, x: &Array) -> Result<Array> {
        if self.mscale == 1.0 {
            return Ok(x.clone());
        }
        let s = Array::from_f32(self.mscale).as_dtype(x.dtype())?;
        let d = x.shape()[x.ndim() - 1];
        if self.dims == d {
            return Ok(x * &s);
        }
        use mlx_rs::ops::indexing::IndexOp;
        let head = &x.index((.., .., .., ..self.dims)) * &s;
        let tail = x.index((.., .., .., self.dims..));
        Ok(mlx_rs::ops::concatenate(&[head, tail], -1)?)
    }

    /// Rotates `x` `[B, H, L, D]` for tokens at `positions`.
    pub(crate) fn forward_at(
        &self,
        x: &Array,
        positions: &crate::cache::Positions,
    ) -> Result<Array> {
        match positions {
            crate::cache::Positions::Shared(offset) => self.forward(x, *offset),
            crate::cache::Positions::PerRow(offsets) => {
                let x = &self.pre_scale(x)?;
                crate::kernels::rope_per_row(x, &self.params(), offsets)
                    .context("rope with per-row offsets")
            }
        }
    }

    /// Rotates `x` `[B, H, L, D]` for tokens at positions `offset..offset + L`.
    pub fn forward(&self, x: &Array, offset: i32) -> Result<Array> {
        let x = &self.pre_scale(x)?;
        crate::kernels::rope(x, &self.params(), offset).context("rope")
    }

    /// Its parameters as the kernels take them.
    pub(crate) fn params(&self) -> crate::kernels::RopeParams<'_> {
        crate::kernels::RopeParams {
            dims: self.dims,
            traditional: self.traditional,
            base: if self.freqs.is_some() {
                None
            } else {
                Some(self.base)
            },
            scale: self.scale,
            freqs: self.freqs.as_ref(),
        }
    }
}

fn llama3_freqs(dims: i32, base: f64, factor: f64, low: f64, high: f64, old_ctx: f64) -> Array {
    let low_wavelen = old_ctx / low;
    let high_wavelen = old_ctx / high;
    let freqs: Vec<f32> = (0..dims)
        .step_by(2)
        .map(|i| {
            let freq = base.powf(i as f64 / dims as f64);
            let wavelen = 2.0 * std::f64::consts::PI * freq;
            let scaled = if wavelen > low_wavelen {
                freq * factor
            } else {
                freq
            };
            let medium = wavelen > high_wavelen && wavelen < low_wavelen;
            if medium {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                (scaled / ((1.0 - smooth) / factor + smooth)) as f32
            } else {
                scaled as f32
            }
        })
        .collect();
    let n = freqs.len() as i32;
    Array::from_slice(&freqs, &[n])
}

/// YaRN: frequencies blended between interpolated and extrapolated by a
/// linear ramp over the dimensions, and the attention factor
/// `(0.1 * mscale * ln(factor) + 1) / (0.1 * mscale_all_dim * ln(factor) + 1)`,
/// in mlx-lm's arithmetic.
fn yarn(dims: i32, base: f32, scaling: &YarnScaling) -> Result<(Array, f32)> {
    use mlx_rs::ops::{arange, clip, power};
    let &YarnScaling {
        factor,
        original_max_position_embeddings: original_max,
        beta_fast,
        beta_slow,
        mscale,
        mscale_all_dim,
    } = scaling;
    let correction = |rotations: f64| {
        dims as f64 * (original_max / (rotations * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * (base as f64).ln())
    };
    let low = correction(beta_fast).floor().max(0.0);
    let high = correction(beta_slow).ceil().min(dims as f64 - 1.0);
    let span = if low == high { 0.001 } else { high - low };
    let get_mscale = |m: f64| {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * m * factor.ln() + 1.0
        }
    };
    let attn = (get_mscale(mscale) / get_mscale(mscale_all_dim)) as f32;
    let f = |v: f64| Array::from_f32(v as f32);
    let extra = power(
        Array::from_f32(base),
        &arange::<_, f32>(0, dims, 2)? / &f(dims as f64),
    )?;
    let inter = &f(factor) * &extra;
    let ramp = clip(
        &(&(&arange::<_, f32>(0, dims / 2, None)? - &f(low)) / &f(span)),
        (0.0f32, 1.0f32),
    )?;
    let mask = &f(1.0) - &ramp;
    let freqs = &(&inter * &extra) / &(&(&inter * &mask) + &(&extra * &(&f(1.0) - &mask)));
    Ok((freqs, attn))
}
