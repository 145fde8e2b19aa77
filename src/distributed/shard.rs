//! Splitting a loaded model across the ranks of a [`Group`].
//!
//! Tensor parallel (as mlx-lm's `shard`): q/k/v and gate/up are split along
//! their output rows (column-parallel), o/down along their input columns
//! (row-parallel, an `all_sum` after them); quantized weights split with
//! their scales and biases along whole groups. Heads are split by key/value
//! head, each rank keeping the query heads that share its key/value heads, so
//! uneven counts (9 heads, 3 KV heads on 2 ranks) split as 6+3. Mixtures
//! of experts keep the router whole and split every expert's intermediate
//! columns, with one `all_sum` of the block's output. Recurrent mixers split
//! by head (gated DeltaNet by key head, Mamba-2 by group, LFM2's short
//! convolution by channel), latent attention by query head, and norms over
//! all heads (OLMo 3's q/k norms, Granite 4's gated Mamba-2 norm) sum their
//! squares across ranks. Families whose layers cannot be split so are
//! refused with the reason; pipeline parallelism splits them.
//!
//! Pipeline parallel (as mlx-lm's `PipelineMixin`): each rank keeps a
//! contiguous range of layers, rank 0 the last ones; activations go from rank
//! r+1 to rank r by send/recv, and rank 0's output is gathered by every rank
//! so every rank computes the same logits.
//!
//! Reading only each rank's share: `Model::load` leaves MLX's safetensors
//! arrays unevaluated (nothing is read yet); this pass reads the shard of
//! every split tensor straight from its byte ranges in the file and drops the
//! unread full arrays, and pipeline ranks drop the layers they do not run.
//! Tensors every rank needs (embeddings, norms, head) are read whole.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use mlx_rs::ops::concatenate;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::Array;

use crate::collective::Group;
use crate::model::decoder::{Attention, Block, FeedForward, Mlp, QkNormSpan, Recurrent, Residual};
use crate::model::gated_delta::{GatedDeltaNet, InProj};
use crate::model::layers::{Linear, LinearWeight, Lora, RmsNorm};
use crate::model::lfm2::ShortConv;
use crate::model::mamba2::{Mamba2, NormAcrossRanks};
use crate::model::moe::{SparseMoe, SwitchLinear, SwitchWeight, EXPERT_PROJS};
use crate::model::nemotron_h::{ReluSquaredMlp, StackLayer};
use crate::model::nemotron_h_moe::ExpertsLayer;
use crate::model::pipeline::PipelineStage;
use crate::model::Model;
use crate::quant::QuantSpec;

/// How a model is split across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parallelism {
    /// Heads and MLP columns split across ranks (the default, as mlx-lm).
    Tensor,
    /// Layers split across ranks (`--pipeline`).
    Pipeline,
}

/// Splits `model` (as loaded by `Model::load`, before anything was
/// evaluated) across `group`. A group of one leaves the model as it is.
pub fn shard_model(model: &mut Model, group: &Group, mode: Parallelism) -> Result<()> {
    if group.size() < 2 {
        return Ok(());
    }
    check_family(&model.args.model_type)?;
    let files = TensorFiles::open(&model.path)?;
    match mode {
        Parallelism::Tensor => shard_tensor(model, group, &files),
        Parallelism::Pipeline => shard_pipeline(model, group),
    }
    .with_context(|| {
        format!(
            "sharding {} across {} ranks ({mode:?} parallel)",
            model.path.display(),
            group.size()
        )
    })
}

/// Families whose every layer `shard_tensor` splits (attention, latent
/// attention, dense MLPs, mixtures of experts, gated DeltaNet, short
/// convolutions, Mamba-2): both kinds of parallelism split them.
const TENSOR_FAMILIES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3_text",
    "phi3",
    "smollm3",
    "granite",
    "seed_oss",
    "exaone4",
    "ministral3",
    "llama4_text",
    "qwen3_moe",
    "mixtral",
    "gpt_oss",
    "glm4_moe",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "deepseek_v3",
    "kimi_k2",
    "lfm2",
    "olmo3",
    "nemotron_h",
    "granitemoehybrid",
];

/// Refuses a family that cannot be split, saying why.
fn check_family(model_type: &str) -> Result<()> {
    match model_type {
        t if TENSOR_FAMILIES.contains(&t) => Ok(()),
        "gemma4" | "gemma4_text" => Err(anyhow!(
            "sharding {model_type} models is not supported: its layers share keys and values \
             across layers in a forward pass of its own"
        )),
        other => Err(anyhow!(
            "sharding {other} models is not supported (supported: {})",
            TENSOR_FAMILIES.join(", ")
        )),
    }
}

/// The layer range rank `rank` of `size` runs: even split, lower ranks take
/// the extra layers, rank 0 the last layers.
pub(crate) fn pipeline_range(layers: usize, rank: usize, size: usize) -> Range<usize> {
    let split: Vec<usize> = (0..size)
        .map(|r| layers / size + usize::from(r < layers % size))
        .collect();
    let start: usize = split[rank + 1..].iter().sum();
    start..start + split[rank]
}

fn shard_pipeline(model: &mut Model, group: &Group) -> Result<()> {
    let n = model.decoder.layers.len();
    if n < group.size() {
        bail!("{n} layers cannot be split across {} ranks", group.size());
    }
    let range = pipeline_range(n, group.rank(), group.size());
    let kept: Vec<_> = model.decoder.layers.drain(..).collect();
    model.decoder.layers = kept
        .into_iter()
        .skip(range.start)
        .take(range.len())
        .collect();
    if !model.decoder.options.layer_windows.is_empty() {
        let windows = &model.decoder.options.layer_windows;
        model.decoder.options.layer_windows = windows[range].to_vec();
    }
    model.decoder.pipeline = Some(PipelineStage::new(group));
    Ok(())
}

/// Part `rank` of `n` units split in `size` near-equal contiguous parts.
fn part(n: i32, rank: usize, size: usize) -> Range<i32> {
    let (rank, size) = (rank as i64, size as i64);
    let start = (n as i64 * rank / size) as i32;
    let end = (n as i64 * (rank + 1) / size) as i32;
    start..end
}

fn scaled(r: &Range<i32>, k: i32) -> Range<i32> {
    r.start * k..r.end * k
}

/// `r` moved `by` units on (a part's rows inside a fused tensor).
fn shifted(r: &Range<i32>, by: i32) -> Range<i32> {
    r.start + by..r.end + by
}

/// How a family names the tensors of its layers.
struct LayerNames {
    /// q/k/v are rows of one `qkv_proj`, gate/up of one `gate_up_proj` (Phi-3).
    fused: bool,
    /// The attention's output projection.
    o_proj: &'static str,
    /// The feed-forward block.
    mlp: &'static str,
    /// The feed-forward's gate, up and down projections.
    mlp_projs: [&'static str; 3],
}

const STANDARD_NAMES: LayerNames = LayerNames {
    fused: false,
    o_proj: "o_proj",
    mlp: "mlp",
    mlp_projs: ["gate_proj", "up_proj", "down_proj"],
};

/// Granite 4's `shared_mlp`: gate and up as the halves of `input_linear`.
const FUSED_SHARED_MLP: LayerNames = LayerNames {
    fused: true,
    o_proj: "o_proj",
    mlp: "shared_mlp",
    mlp_projs: ["input_linear", "input_linear", "output_linear"],
};

fn layer_names(model_type: &str) -> LayerNames {
    match model_type {
        "phi3" => LayerNames {
            fused: true,
            mlp_projs: ["gate_up_proj", "gate_up_proj", "down_proj"],
            ..STANDARD_NAMES
        },
        "llama4_text" => LayerNames {
            mlp: "feed_forward",
            ..STANDARD_NAMES
        },
        "lfm2" => LayerNames {
            fused: false,
            o_proj: "out_proj",
            mlp: "feed_forward",
            mlp_projs: ["w1", "w3", "w2"],
        },
        _ => STANDARD_NAMES,
    }
}

fn shard_tensor(model: &mut Model, group: &Group, files: &TensorFiles) -> Result<()> {
    let model_type = model.args.model_type.as_str();
    let names = layer_names(model_type);
    let cut = Cut {
        files,
        dtype: model.dtype,
        group,
    };
    // Qwen3.5 keeps its decoder under `language_model.`.
    let root = match model_type {
        "qwen3_5" | "qwen3_5_moe" => "language_model.",
        _ => "",
    };
    if model_type == "nemotron_h" {
        return shard_stacked_layers(&mut model.decoder.layers, &cut);
    }
    for (i, layer) in model.decoder.layers.iter_mut().enumerate() {
        let p = format!("{root}model.layers.{i}");
        match layer.linear_attn.as_deref_mut() {
            Some(Recurrent::GatedDelta(delta)) => {
                cut.gated_delta(delta, &format!("{p}.linear_attn"))?
            }
            Some(Recurrent::ShortConv(conv)) => cut.short_conv(conv, &format!("{p}.conv"))?,
            Some(Recurrent::Mamba2(mamba)) => cut.mamba2(mamba, &format!("{p}.mamba"))?,
            None if layer.self_attn.latent.is_some() => {
                cut.latent_attention(&mut layer.self_attn, &format!("{p}.self_attn"))?
            }
            None => cut.attention(&mut layer.self_attn, &format!("{p}.self_attn"), &names)?,
        }
        match &mut layer.mlp {
            FeedForward::Dense(mlp) => {
                let (at, names) = cut.mlp_site(&p, &names);
                cut.mlp(mlp, &at, names)?
            }
            FeedForward::Sparse(moe) => cut.moe(moe, &p)?,
        }
    }
    Ok(())
}

/// Nemotron-H's blocks: each a mixer (Mamba-2 or attention) with the ReLU²
/// MLP layers around it, every one a layer `backbone.layers.{j}` of its own.
fn shard_stacked_layers(layers: &mut [Block], cut: &Cut) -> Result<()> {
    let mut j = 0;
    let mut next = || {
        j += 1;
        format!("backbone.layers.{}.mixer", j - 1)
    };
    for block in layers {
        let Residual::Stack(stack) = &mut block.residual else {
            bail!("a Nemotron-H block without its MLP layers");
        };
        for layer in &mut stack.before {
            cut.stack_layer(layer, &next())?;
        }
        let p = next();
        match block.linear_attn.as_deref_mut() {
            Some(Recurrent::Mamba2(mamba)) => cut.mamba2(mamba, &p)?,
            Some(_) => bail!("{p}: this recurrent layer is not split (use --pipeline)"),
            None => cut.attention(&mut block.self_attn, &p, &STANDARD_NAMES)?,
        }
        for layer in &mut stack.after {
            cut.stack_layer(layer, &next())?;
        }
    }
    Ok(())
}

/// Replaces a layer's tensors by this rank's slice, read from the files.
struct Cut<'a> {
    files: &'a TensorFiles,
    dtype: mlx_rs::Dtype,
    group: &'a Group,
}

impl Cut<'_> {
    fn read(
        &self,
        name: &str,
        rows: Option<Range<i32>>,
        cols: Option<Range<i32>>,
    ) -> Result<Array> {
        let a = self.files.read(name, rows, cols)?;
        crate::mlx_ext::cast_float(a, self.dtype)
    }

    /// The slice of `{prefix}.biases`, for the modes that store them.
    fn read_biases(
        &self,
        prefix: &str,
        spec: QuantSpec,
        rows: Option<Range<i32>>,
        cols: Option<Range<i32>>,
    ) -> Result<Option<Array>> {
        if !spec.mode.has_biases() {
            return Ok(None);
        }
        Ok(Some(self.read(&format!("{prefix}.biases"), rows, cols)?))
    }

    fn check_lora(lora: Option<&Lora>, prefix: &str) -> Result<()> {
        if lora.is_some() {
            bail!("{prefix} has a LoRA adapter; fuse it first (adapters are not sharded)");
        }
        Ok(())
    }

    /// This rank's part of `n` intermediate columns, in whole units of
    /// `unit` (the down projection's quantization group).
    fn intermediate(&self, n: i32, unit: i32, prefix: &str) -> Result<Range<i32>> {
        let size = self.group.size();
        if n % unit != 0 {
            bail!("{prefix}: {n} columns are not whole groups of {unit}");
        }
        if n / unit < size as i32 {
            bail!(
                "{prefix}: {n} intermediate columns are {} quantization group(s) of {unit}, \
                 which cannot be split across {size} ranks (use --pipeline)",
                n / unit
            );
        }
        Ok(scaled(&part(n / unit, self.group.rank(), size), unit))
    }

    /// Splits the heads by key/value head: q/k/v (and the query heads'
    /// sinks) by rows, o by columns.
    fn attention(&self, attn: &mut Attention, prefix: &str, names: &LayerNames) -> Result<()> {
        let (rank, size) = (self.group.rank(), self.group.size());
        if attn.latent.is_some() || matches!(attn.qk_norm_span, QkNormSpan::AllRanks { .. }) {
            bail!("{prefix}: latent or already split attention is not split by key/value head");
        }
        let (heads, kv_heads, d) = (attn.n_heads, attn.n_kv_heads, attn.head_dim);
        if kv_heads < size as i32 {
            bail!(
                "tensor parallelism splits key/value heads: {kv_heads} cannot be split across \
                 {size} ranks (use --pipeline)"
            );
        }
        let kv = part(kv_heads, rank, size);
        let q = scaled(&kv, heads / kv_heads);
        let (q_rows, kv_rows) = (scaled(&q, d), scaled(&kv, d));
        // With an output gate each head's rows are its query, then its gate.
        let q_proj_rows = scaled(&q, if attn.output_gate { 2 * d } else { d });
        let name = |n: &str| format!("{prefix}.{n}");
        if names.fused {
            let qkv = name("qkv_proj");
            self.rows(&mut attn.q_proj, &qkv, q_rows.clone())?;
            self.rows(&mut attn.k_proj, &qkv, shifted(&kv_rows, heads * d))?;
            self.rows(
                &mut attn.v_proj,
                &qkv,
                shifted(&kv_rows, (heads + kv_heads) * d),
            )?;
        } else {
            self.rows(&mut attn.q_proj, &name("q_proj"), q_proj_rows)?;
            self.rows(&mut attn.k_proj, &name("k_proj"), kv_rows.clone())?;
            self.rows(&mut attn.v_proj, &name("v_proj"), kv_rows)?;
        }
        self.columns(&mut attn.o_proj, &name(names.o_proj), q_rows.clone())?;
        if attn.sinks.is_some() {
            attn.sinks = Some(self.read(&name("sinks"), Some(q.clone()), None)?);
        }
        if matches!(attn.qk_norm_span, QkNormSpan::AllHeads) {
            self.norms_across_ranks(attn, &q_rows, &scaled(&kv, d));
        }
        attn.n_heads = q.len() as i32;
        attn.n_kv_heads = kv.len() as i32;
        Ok(())
    }

    /// Query/key norms over all heads at once (OLMo 3): each rank keeps
    /// its heads' part of the norm weights (`q_rows`, `kv_rows`) and sums
    /// its heads' squares with the other ranks'.
    fn norms_across_ranks(&self, attn: &mut Attention, q_rows: &Range<i32>, kv_rows: &Range<i32>) {
        let keep = |norm: &mut Option<RmsNorm>, r: &Range<i32>| {
            if let Some(norm) = norm {
                norm.weight = norm.weight.index(r.start..r.end);
            }
        };
        keep(&mut attn.q_norm, q_rows);
        keep(&mut attn.k_norm, kv_rows);
        attn.qk_norm_span = QkNormSpan::AllRanks {
            group: self.group.clone(),
            heads: attn.n_heads,
            kv_heads: attn.n_kv_heads,
        };
    }

    /// Splits a multi-head latent attention layer by query head (as mlx-lm's
    /// DeepSeek-V3 `shard`): `q_b_proj` (or the plain `q_proj`) by rows,
    /// each head's latent key and value projections with their heads,
    /// `o_proj` by columns. The latent, its norm and the shared rotary key
    /// stay whole, so every rank caches the same latent.
    fn latent_attention(&self, attn: &mut Attention, prefix: &str) -> Result<()> {
        let (rank, size) = (self.group.rank(), self.group.size());
        let heads = attn.n_heads;
        if heads < size as i32 {
            bail!("{prefix}: {heads} heads cannot be split across {size} ranks (use --pipeline)");
        }
        let h = part(heads, rank, size);
        let name = |n: &str| format!("{prefix}.{n}");
        let Some(latent) = attn.latent.as_deref_mut() else {
            bail!("{prefix}: not a latent attention layer");
        };
        let q_rows = scaled(&h, attn.head_dim);
        match &mut latent.q_lora {
            Some((_, _, q_b_proj)) => self.rows(q_b_proj, &name("q_b_proj"), q_rows)?,
            None => self.rows(&mut attn.q_proj, &name("q_proj"), q_rows)?,
        }
        let v_head_dim = multi_linear_shape(&latent.unembed_out.weight)[1];
        latent.embed_q.weight = heads_of(&latent.embed_q.weight, &h);
        latent.unembed_out.weight = heads_of(&latent.unembed_out.weight, &h);
        self.columns(&mut attn.o_proj, &name("o_proj"), scaled(&h, v_head_dim))?;
        attn.n_heads = h.len() as i32;
        Ok(())
    }

    /// Splits a gated DeltaNet layer by key head, each rank keeping the
    /// value heads of its key heads (as mlx-lm's Qwen3.5 `shard`): the input
    /// projections and the convolution's channels by rows (q, k and v
    /// segments each), the per-head decay parameters with their heads,
    /// `out_proj` by columns. The recurrent state then holds this rank's heads.
    fn gated_delta(&self, delta: &mut GatedDeltaNet, prefix: &str) -> Result<()> {
        let (rank, size) = (self.group.rank(), self.group.size());
        let d = delta.dims;
        if d.num_k_heads < size as i32 {
            bail!(
                "{prefix}: {} key heads cannot be split across {size} ranks (use --pipeline)",
                d.num_k_heads
            );
        }
        let per = d.num_v_heads / d.num_k_heads;
        let (dk, dv) = (d.head_k_dim, d.head_v_dim);
        let kh = part(d.num_k_heads, rank, size);
        let vh = scaled(&kh, per);
        let key_dim = d.num_k_heads * dk;
        // The convolution's channels, as q | k | v.
        let channels = [
            scaled(&kh, dk),
            shifted(&scaled(&kh, dk), key_dim),
            shifted(&scaled(&vh, dv), 2 * key_dim),
        ];
        let name = |n: &str| format!("{prefix}.{n}");
        match &mut delta.in_proj {
            // Rows grouped per key head: q, k, its value heads' v and z (b, a).
            InProj::Grouped(p) => {
                self.rows(
                    &mut p.qkvz,
                    &name("in_proj_qkvz"),
                    scaled(&kh, 2 * dk + 2 * per * dv),
                )?;
                self.rows(&mut p.ba, &name("in_proj_ba"), scaled(&kh, 2 * per))?;
            }
            InProj::Split(p) => {
                self.row_segments(&mut p.qkv, &name("in_proj_qkv"), &channels)?;
                self.rows(&mut p.z, &name("in_proj_z"), scaled(&vh, dv))?;
                self.rows(&mut p.b, &name("in_proj_b"), vh.clone())?;
                self.rows(&mut p.a, &name("in_proj_a"), vh.clone())?;
            }
        }
        // Small per-channel and per-head arrays: sliced as loaded.
        let conv: Vec<Array> = channels
            .iter()
            .map(|r| delta.conv1d.index(r.start..r.end))
            .collect();
        delta.conv1d = concatenate(&conv, 0)?;
        delta.dt_bias = delta.dt_bias.index(vh.start..vh.end);
        delta.a_log = delta.a_log.index(vh.start..vh.end);
        self.columns(&mut delta.out_proj, &name("out_proj"), scaled(&vh, dv))?;
        delta.dims.num_k_heads = kh.len() as i32;
        delta.dims.num_v_heads = vh.len() as i32;
        Ok(())
    }

    /// Splits LFM2's short convolution by channel: `in_proj`'s b, c and x
    /// rows of this rank's channels, the depthwise convolution (and its
    /// bias) with them, `out_proj` by columns.
    fn short_conv(&self, conv: &mut ShortConv, prefix: &str) -> Result<()> {
        let (hidden, _) = conv.out_proj.shape();
        let unit = linear_unit(&conv.out_proj);
        let channels = self.intermediate(hidden, unit, prefix)?;
        let thirds: Vec<_> = (0..3).map(|i| shifted(&channels, i * hidden)).collect();
        let name = |n: &str| format!("{prefix}.{n}");
        self.row_segments(&mut conv.in_proj, &name("in_proj"), &thirds)?;
        let range = channels.start..channels.end;
        conv.conv = conv.conv.index(range.clone());
        conv.conv_bias = conv.conv_bias.as_ref().map(|b| b.index(range));
        self.columns(&mut conv.out_proj, &name("out_proj"), channels)
    }

    /// Splits a Mamba-2 mixer by group, each rank keeping the heads of its
    /// groups (with fewer groups than ranks, a share of one group's heads and
    /// that group's B and C whole): `in_proj`'s gate, x, B, C and step-size rows of them, the
    /// convolution's x, B and C channels, the per-head parameters and the
    /// gated norm's scale with their heads, `out_proj` by columns. The scan
    /// state then holds this rank's heads.
    fn mamba2(&self, mamba: &mut Mamba2, prefix: &str) -> Result<()> {
        let (rank, size) = (self.group.rank(), self.group.size());
        let d = mamba.dims;
        let ranks = size as i32;
        let (g, h) = if d.groups % ranks == 0 {
            let g = part(d.groups, rank, size);
            let h = scaled(&g, d.heads / d.groups);
            (g, h)
        } else if ranks % d.groups == 0 && d.heads % ranks == 0 {
            // Fewer groups than ranks (Granite 4 has one): each rank takes
            // heads of one group and keeps that group's B and C whole.
            let h = part(d.heads, rank, size);
            let group = h.start / (d.heads / d.groups);
            (group..group + 1, h)
        } else {
            bail!(
                "{prefix}: {} Mamba-2 groups of {} heads cannot be split across {size} ranks \
                 (use --pipeline)",
                d.groups,
                d.heads
            );
        };
        // Nemotron-H normalizes each group apart, Granite 4 all channels at once.
        let norm_across_ranks = match mamba.norm_groups {
            1 => true,
            n if n == d.groups && d.groups % ranks == 0 => false,
            n => bail!(
                "{prefix}: the gated norm spans {n} group(s) of {} heads' groups, which a split \
                 of the heads changes (use --pipeline)",
                d.groups
            ),
        };
        let (hd, n) = (d.head_dim, d.state_size);
        let (inner, bc) = (d.inner(), d.groups * n);
        let channels = scaled(&h, hd);
        // The convolution's channels, as x | B | C.
        let conv = [
            channels.clone(),
            shifted(&scaled(&g, n), inner),
            shifted(&scaled(&g, n), inner + bc),
        ];
        // in_proj: z | x B C | dt.
        let mut rows = vec![channels.clone()];
        rows.extend(conv.iter().map(|r| shifted(r, inner)));
        rows.push(shifted(&h, inner + d.conv_dim()));
        let name = |part: &str| format!("{prefix}.{part}");
        self.row_segments(&mut mamba.in_proj, &name("in_proj"), &rows)?;
        let slice = |a: &Array, r: &Range<i32>| a.index(r.start..r.end);
        let channels_of = |a: &Array| -> Result<Array> {
            let parts: Vec<Array> = conv.iter().map(|r| slice(a, r)).collect();
            Ok(concatenate(&parts, 0)?)
        };
        mamba.conv1d = channels_of(&mamba.conv1d)?;
        mamba.conv_bias = mamba.conv_bias.as_ref().map(channels_of).transpose()?;
        mamba.dt_bias = slice(&mamba.dt_bias, &h);
        mamba.a_log = slice(&mamba.a_log, &h);
        mamba.d = slice(&mamba.d, &h);
        mamba.norm_weight = slice(&mamba.norm_weight, &channels);
        self.columns(&mut mamba.out_proj, &name("out_proj"), channels)?;
        mamba.dims.heads = h.len() as i32;
        mamba.dims.groups = g.len() as i32;
        if norm_across_ranks {
            mamba.norm_across_ranks = Some(NormAcrossRanks {
                group: self.group.clone(),
                width: inner,
            });
        } else {
            mamba.norm_groups = g.len() as i32;
        }
        Ok(())
    }

    /// Splits a Nemotron-H MLP or experts layer.
    fn stack_layer(&self, layer: &mut StackLayer, prefix: &str) -> Result<()> {
        match layer {
            StackLayer::Mlp(mlp) => self.relu_squared(mlp, prefix),
            StackLayer::Experts(experts) => self.nemotron_experts(experts, prefix),
        }
    }

    /// Splits a Nemotron-H experts layer as other mixtures of experts: the
    /// router whole, every expert's intermediate columns (`fc1` by rows,
    /// `fc2` by columns), the shared experts' likewise, and one sum across
    /// ranks of the layer's output. The latent projections stay whole; each
    /// rank projects its partial latent sum back, with the bias added once.
    fn nemotron_experts(&self, experts: &mut ExpertsLayer, mixer: &str) -> Result<()> {
        let count = experts.routing.experts;
        let source = |stacked: &str, hf: &str| {
            let prefix = format!("{mixer}.switch_mlp.{stacked}");
            match self.files.contains(&format!("{prefix}.weight")) {
                true => Experts::Stacked(prefix),
                false => Experts::Each(
                    (0..count)
                        .map(|e| format!("{mixer}.experts.{e}.{hf}"))
                        .collect(),
                ),
            }
        };
        let s = &mut experts.switch_mlp;
        let (_, inter, _) = s.fc1.shape();
        let cols = self.intermediate(inter, switch_unit(&s.fc2), mixer)?;
        self.expert_rows(&mut s.fc1, &source("fc1", "up_proj"), cols.clone())?;
        self.expert_columns(&mut s.fc2, &source("fc2", "down_proj"), cols)?;
        if let Some(shared) = &mut experts.shared_experts {
            let at = format!("{mixer}.shared_experts");
            let (inter, _) = shared.first.shape();
            let cols = self.intermediate(inter, linear_unit(&shared.second), &at)?;
            self.rows(&mut shared.first, &format!("{at}.up_proj"), cols.clone())?;
            self.columns(&mut shared.second, &format!("{at}.down_proj"), cols)?;
            shared.second.all_sum = None;
        }
        if let Some(latent) = experts.latent.as_mut().filter(|_| self.group.rank() != 0) {
            latent.second.bias = None;
        }
        experts.all_sum = Some(self.group.clone());
        Ok(())
    }

    /// Splits a ReLU² MLP layer's hidden columns: up by rows, down by columns.
    fn relu_squared(&self, mlp: &mut ReluSquaredMlp, prefix: &str) -> Result<()> {
        let (hidden, _) = mlp.up_proj.shape();
        let unit = linear_unit(&mlp.down_proj);
        let cols = self.intermediate(hidden, unit, prefix)?;
        self.rows(&mut mlp.up_proj, &format!("{prefix}.up_proj"), cols.clone())?;
        self.columns(&mut mlp.down_proj, &format!("{prefix}.down_proj"), cols)
    }

    /// Column-parallel over several row ranges of one tensor, concatenated.
    fn row_segments(&self, linear: &mut Linear, prefix: &str, parts: &[Range<i32>]) -> Result<()> {
        Self::check_lora(linear.lora.as_ref(), prefix)?;
        let read = |field: &str| -> Result<Array> {
            let pieces = parts
                .iter()
                .map(|r| self.read(&format!("{prefix}.{field}"), Some(r.clone()), None))
                .collect::<Result<Vec<_>>>()?;
            Ok(concatenate(&pieces, 0)?)
        };
        linear.weight = match &linear.weight {
            LinearWeight::Dense(_) => LinearWeight::Dense(read("weight")?),
            LinearWeight::Quantized { spec, .. } => LinearWeight::Quantized {
                weight: read("weight")?,
                scales: read("scales")?,
                biases: match spec.mode.has_biases() {
                    true => Some(read("biases")?),
                    false => None,
                },
                spec: *spec,
            },
        };
        if linear.bias.is_some() {
            linear.bias = Some(read("bias")?);
        }
        Ok(())
    }

    /// Where layer `layer`'s dense MLP is stored, and its names: Granite 4
    /// without experts keeps it as the fused `shared_mlp`.
    fn mlp_site<'n>(&self, layer: &str, names: &'n LayerNames) -> (String, &'n LayerNames) {
        let standard = format!("{layer}.{}", names.mlp);
        let fused = format!("{layer}.{}", FUSED_SHARED_MLP.mlp);
        let stored = |at: &str, proj: &str| self.files.contains(&format!("{at}.{proj}.weight"));
        if !stored(&standard, names.mlp_projs[0]) && stored(&fused, FUSED_SHARED_MLP.mlp_projs[0]) {
            return (fused, &FUSED_SHARED_MLP);
        }
        (standard, names)
    }

    /// Splits the intermediate columns: gate/up by rows, down by columns.
    fn mlp(&self, mlp: &mut Mlp, prefix: &str, names: &LayerNames) -> Result<()> {
        let (hidden, _) = mlp.gate_proj.shape();
        let unit = linear_unit(&mlp.down_proj);
        let cols = self.intermediate(hidden, unit, prefix)?;
        let name = |n: &str| format!("{prefix}.{n}");
        let [gate, up, down] = names.mlp_projs;
        if names.fused {
            let gate_up = name(gate);
            self.rows(&mut mlp.gate_proj, &gate_up, cols.clone())?;
            self.rows(&mut mlp.up_proj, &gate_up, shifted(&cols, hidden))?;
        } else {
            self.rows(&mut mlp.gate_proj, &name(gate), cols.clone())?;
            self.rows(&mut mlp.up_proj, &name(up), cols.clone())?;
        }
        self.columns(&mut mlp.down_proj, &name(down), cols)
    }

    /// As mlx-lm: the router whole, every expert's intermediate columns
    /// split (gate/up by rows, down by columns), shared experts as a dense
    /// MLP, and one sum across ranks of the block's output.
    fn moe(&self, moe: &mut SparseMoe, layer: &str) -> Result<()> {
        let parent = moe.router_key.rsplit_once('.').map_or("", |(p, _)| p);
        let stacked = format!("{layer}.{}", moe.experts_key);
        let count = moe.switch_mlp.gate_proj.shape().0;
        let source = |i: usize| {
            let prefix = format!("{stacked}.{}", EXPERT_PROJS[i]);
            if self.files.contains(&format!("{prefix}.weight")) {
                return Experts::Stacked(prefix);
            }
            let hf = moe.hf_names[i];
            Experts::Each(
                (0..count)
                    .map(|e| format!("{layer}.{parent}.experts.{e}.{hf}"))
                    .collect(),
            )
        };
        let [gate, up, down] = [source(0), source(1), source(2)];
        let s = &mut moe.switch_mlp;
        let (_, inter, _) = s.gate_proj.shape();
        let unit = switch_unit(&s.down_proj);
        let cols = self.intermediate(inter, unit, &stacked)?;
        self.expert_rows(&mut s.gate_proj, &gate, cols.clone())?;
        self.expert_rows(&mut s.up_proj, &up, cols.clone())?;
        self.expert_columns(&mut s.down_proj, &down, cols)?;
        if let Some(shared) = &mut moe.shared {
            // Their path inside the block (`mlp.shared_experts`, Qwen3-Next's
            // `mlp.shared_expert`).
            let key = match shared.key {
                "" => format!("{parent}.shared_experts"),
                key => key.to_string(),
            };
            let at = format!("{layer}.{key}");
            let names = match self.files.contains(&format!("{at}.input_linear.weight")) {
                true => &FUSED_SHARED_MLP,
                false => &STANDARD_NAMES,
            };
            self.mlp(&mut shared.mlp, &at, names)?;
            // Summed with the routed experts, once.
            shared.mlp.down_proj.all_sum = None;
        }
        moe.all_sum = Some(self.group.clone());
        Ok(())
    }

    /// `part` (`weight`, `scales`, …) of every expert, `rows` × `cols` of each.
    fn read_experts(
        &self,
        src: &Experts,
        part: &str,
        rows: Option<Range<i32>>,
        cols: Option<Range<i32>>,
    ) -> Result<Array> {
        match src {
            Experts::Stacked(prefix) => self.read(&format!("{prefix}.{part}"), rows, cols),
            Experts::Each(prefixes) => {
                let each = prefixes
                    .iter()
                    .map(|p| self.read(&format!("{p}.{part}"), rows.clone(), cols.clone()))
                    .collect::<Result<Vec<_>>>()?;
                Ok(mlx_rs::ops::stack(&each, 0)?)
            }
        }
    }

    /// Column-parallel: output rows `rows` (weight, scales, biases, bias).
    fn rows(&self, linear: &mut Linear, prefix: &str, rows: Range<i32>) -> Result<()> {
        Self::check_lora(linear.lora.as_ref(), prefix)?;
        let r = || Some(rows.clone());
        linear.weight = match &linear.weight {
            LinearWeight::Dense(_) => {
                LinearWeight::Dense(self.read(&format!("{prefix}.weight"), r(), None)?)
            }
            LinearWeight::Quantized { spec, .. } => LinearWeight::Quantized {
                weight: self.read(&format!("{prefix}.weight"), r(), None)?,
                scales: self.read(&format!("{prefix}.scales"), r(), None)?,
                biases: self.read_biases(prefix, *spec, r(), None)?,
                spec: *spec,
            },
        };
        if linear.bias.is_some() {
            linear.bias = Some(self.read(&format!("{prefix}.bias"), r(), None)?);
        }
        Ok(())
    }

    /// Row-parallel: input columns `cols`; the partial products are summed
    /// across ranks, and the bias is added once (by rank 0).
    fn columns(&self, linear: &mut Linear, prefix: &str, cols: Range<i32>) -> Result<()> {
        Self::check_lora(linear.lora.as_ref(), prefix)?;
        linear.weight = match &linear.weight {
            LinearWeight::Dense(_) => {
                LinearWeight::Dense(self.read(&format!("{prefix}.weight"), None, Some(cols))?)
            }
            LinearWeight::Quantized { spec, .. } => {
                let (packed, groups) = quantized_columns(prefix, *spec, &cols)?;
                LinearWeight::Quantized {
                    weight: self.read(&format!("{prefix}.weight"), None, Some(packed))?,
                    scales: self.read(&format!("{prefix}.scales"), None, Some(groups.clone()))?,
                    biases: self.read_biases(prefix, *spec, None, Some(groups))?,
                    spec: *spec,
                }
            }
        };
        if self.group.rank() != 0 {
            linear.bias = None;
        }
        linear.all_sum = Some(self.group.clone());
        Ok(())
    }

    /// Column-parallel experts: output rows `rows` of every expert
    /// (`[experts, out, in]`; the bias `[experts, out]` by its columns).
    fn expert_rows(
        &self,
        linear: &mut SwitchLinear,
        src: &Experts,
        rows: Range<i32>,
    ) -> Result<()> {
        Self::check_lora(linear.lora.as_ref(), src.name())?;
        let read = |part: &str| self.read_experts(src, part, Some(rows.clone()), None);
        linear.weight = match &linear.weight {
            SwitchWeight::Dense(_) => SwitchWeight::Dense(read("weight")?),
            SwitchWeight::Quantized { spec, .. } => SwitchWeight::Quantized {
                weight: read("weight")?,
                scales: read("scales")?,
                biases: spec.mode.has_biases().then(|| read("biases")).transpose()?,
                spec: *spec,
            },
        };
        if linear.bias.is_some() {
            let Experts::Stacked(prefix) = src else {
                bail!(
                    "{}: biases of experts stored one by one are not split",
                    src.name()
                );
            };
            linear.bias = Some(self.read(&format!("{prefix}.bias"), None, Some(rows))?);
        }
        Ok(())
    }

    /// Row-parallel experts: input columns `cols` of every expert; the
    /// bias is added once (by rank 0) before the block's sum.
    fn expert_columns(
        &self,
        linear: &mut SwitchLinear,
        src: &Experts,
        cols: Range<i32>,
    ) -> Result<()> {
        Self::check_lora(linear.lora.as_ref(), src.name())?;
        let read = |part: &str, cols: Range<i32>| self.read_experts(src, part, None, Some(cols));
        linear.weight = match &linear.weight {
            SwitchWeight::Dense(_) => SwitchWeight::Dense(read("weight", cols)?),
            SwitchWeight::Quantized { spec, .. } => {
                let (packed, groups) = quantized_columns(src.name(), *spec, &cols)?;
                SwitchWeight::Quantized {
                    weight: read("weight", packed)?,
                    scales: read("scales", groups.clone())?,
                    biases: spec
                        .mode
                        .has_biases()
                        .then(|| read("biases", groups))
                        .transpose()?,
                    spec: *spec,
                }
            }
        };
        if self.group.rank() != 0 {
            linear.bias = None;
        }
        Ok(())
    }
}

/// The columns a row-parallel split must keep together: a quantization
/// group, or one column.
fn linear_unit(linear: &Linear) -> i32 {
    match &linear.weight {
        LinearWeight::Quantized { spec, .. } => spec.group_size,
        LinearWeight::Dense(_) => 1,
    }
}

/// `linear_unit` for stacked experts.
fn switch_unit(linear: &SwitchLinear) -> i32 {
    match &linear.weight {
        SwitchWeight::Quantized { spec, .. } => spec.group_size,
        SwitchWeight::Dense(_) => 1,
    }
}

/// The shape of a stacked per-head weight `[heads, out, in]` as stored
/// (packed columns when quantized).
fn multi_linear_shape(weight: &LinearWeight) -> Vec<i32> {
    match weight {
        LinearWeight::Dense(w) | LinearWeight::Quantized { weight: w, .. } => w.shape().to_vec(),
    }
}

/// Heads `heads` of a stacked per-head weight `[heads, out, in]`, sliced as
/// loaded (with their scales and biases when quantized).
fn heads_of(weight: &LinearWeight, heads: &Range<i32>) -> LinearWeight {
    weight.map_arrays(|a| a.index(heads.start..heads.end))
}

/// Where one projection of every expert lies in the files.
enum Experts {
    /// Stacked `[experts, …]` under one prefix (mlx-lm's layout).
    Stacked(String),
    /// One tensor per expert, by prefix (Hugging Face's layout).
    Each(Vec<String>),
}

impl Experts {
    /// A name for errors: the stacked prefix, or the first expert's.
    fn name(&self) -> &str {
        match self {
            Experts::Stacked(prefix) => prefix,
            Experts::Each(prefixes) => prefixes.first().map_or("", String::as_str),
        }
    }
}

/// The packed `uint32` columns and the groups of input columns `cols` of a
/// quantized weight, which must fall on whole groups.
fn quantized_columns(
    prefix: &str,
    spec: QuantSpec,
    cols: &Range<i32>,
) -> Result<(Range<i32>, Range<i32>)> {
    let gs = spec.group_size;
    if cols.start % gs != 0 || cols.end % gs != 0 || 32 % spec.bits != 0 {
        bail!(
            "{prefix}: columns {cols:?} do not fall on quantization groups of {gs} ({} bits)",
            spec.bits
        );
    }
    let per_word = 32 / spec.bits;
    Ok((
        cols.start / per_word..cols.end / per_word,
        cols.start / gs..cols.end / gs,
    ))
}

/// Where each tensor of a model directory lies in its safetensors files.
struct TensorFiles {
    tensors: HashMap<String, (PathBuf, TensorInfo)>,
}

#[derive(serde::Deserialize)]
struct TensorInfo {
    dtype: String,
    shape: Vec<i64>,
    data_offsets: [u64; 2],
    #[serde(skip)]
    data_start: u64,
}

impl TensorFiles {
    fn open(dir: &Path) -> Result<Self> {
        let mut tensors = HashMap::new();
        for path in crate::model::weights::weight_files(dir)? {
            let file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
            let mut len = [0u8; 8];
            file.read_exact_at(&mut len, 0)
                .with_context(|| format!("reading the header of {}", path.display()))?;
            let n = u64::from_le_bytes(len);
            if n > 100 << 20 {
                bail!("{}: safetensors header of {n} bytes", path.display());
            }
            let mut header = vec![0u8; n as usize];
            file.read_exact_at(&mut header, 8)
                .with_context(|| format!("reading the header of {}", path.display()))?;
            let mut map: HashMap<String, serde_json::Value> = serde_json::from_slice(&header)
                .with_context(|| format!("parsing the header of {}", path.display()))?;
            map.remove("__metadata__");
            for (name, v) in map {
                let mut info: TensorInfo = serde_json::from_value(v)
                    .with_context(|| format!("{}: tensor {name}", path.display()))?;
                info.data_start = 8 + n;
                tensors.insert(name, (path.clone(), info));
            }
        }
        Ok(Self { tensors })
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Reads `rows` × `cols` of the last two axes of a 1-, 2- or 3-D tensor
    /// (a 1-D tensor's axis is its rows; a 3-D one keeps every matrix of
    /// its first axis, e.g. every expert); `None`: all of that axis.
    fn read(
        &self,
        name: &str,
        rows: Option<Range<i32>>,
        cols: Option<Range<i32>>,
    ) -> Result<Array> {
        let (path, info) = self
            .tensors
            .get(name)
            .ok_or_else(|| anyhow!("tensor {name} is not in the weight files"))?;
        let (item, dtype) =
            dtype_of(&info.dtype).with_context(|| format!("{}: tensor {name}", path.display()))?;
        let (batch, n_rows, n_cols) = match info.shape[..] {
            [r] => (1, r, 1),
            [r, c] => (1, r, c),
            [b, r, c] => (b, r, c),
            _ => bail!("{}: tensor {name} is not 1-, 2- or 3-D", path.display()),
        };
        let rows = rows.map_or(0..n_rows, |r| r.start as i64..r.end as i64);
        let cols = cols.map_or(0..n_cols, |c| c.start as i64..c.end as i64);
        if rows.end > n_rows || cols.end > n_cols || rows.is_empty() || cols.is_empty() {
            bail!(
                "{}: tensor {name} {:?} has no slice rows {rows:?} × columns {cols:?}",
                path.display(),
                info.shape
            );
        }
        let expected = (batch * n_rows * n_cols) as u64 * item as u64;
        if info.data_offsets[1] - info.data_offsets[0] != expected {
            bail!(
                "{}: tensor {name} has the wrong number of bytes",
                path.display()
            );
        }
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let base = info.data_start + info.data_offsets[0];
        let row_bytes = (cols.end - cols.start) as usize * item;
        let matrix_bytes = (rows.end - rows.start) as usize * row_bytes;
        let mut data = vec![0u8; batch as usize * matrix_bytes];
        let at =
            |b: i64, r: i64| base + ((b * n_rows + r) * n_cols + cols.start) as u64 * item as u64;
        data.chunks_mut(matrix_bytes)
            .zip(0..batch)
            .try_for_each(|(matrix, b)| {
                if cols.start == 0 && cols.end == n_cols {
                    return file.read_exact_at(matrix, at(b, rows.start));
                }
                matrix
                    .chunks_mut(row_bytes)
                    .zip(rows.clone())
                    .try_for_each(|(out, r)| file.read_exact_at(out, at(b, r)))
            })
            .with_context(|| format!("reading tensor {name} from {}", path.display()))?;
        let (r, c) = (
            (rows.end - rows.start) as i32,
            (cols.end - cols.start) as i32,
        );
        let shape: Vec<i32> = match info.shape.len() {
            1 => vec![r],
            2 => vec![r, c],
            _ => vec![batch as i32, r, c],
        };
        // SAFETY: `data` holds exactly product(shape) elements of `dtype`;
        // MLX copies it into a new array.
        Ok(unsafe {
            Array::from_ptr(mlx_sys::mlx_array_new_data(
                data.as_ptr().cast(),
                shape.as_ptr(),
                shape.len() as i32,
                dtype,
            ))
        })
    }
}

fn dtype_of(name: &str) -> Result<(usize, mlx_sys::mlx_dtype)> {
    Ok(match name {
        "F32" => (4, mlx_sys::mlx_dtype__MLX_FLOAT32),
        "F16" => (2, mlx_sys::mlx_dtype__MLX_FLOAT16),
        "BF16" => (2, mlx_sys::mlx_dtype__MLX_BFLOAT16),
        "U32" => (4, mlx_sys::mlx_dtype__MLX_UINT32),
        "I32" => (4, mlx_sys::mlx_dtype__MLX_INT32),
        "U8" => (1, mlx_sys::mlx_dtype__MLX_UINT8),
        "I8" => (1, mlx_sys::mlx_dtype__MLX_INT8),
        other => bail!("dtype {other} cannot be sharded"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipeline_ranges_cover_the_layers_with_rank_zero_last() {
        assert_eq!(pipeline_range(30, 0, 2), 15..30);
        assert_eq!(pipeline_range(30, 1, 2), 0..15);
        assert_eq!(pipeline_range(7, 0, 3), 4..7);
        assert_eq!(pipeline_range(7, 1, 3), 2..4);
        assert_eq!(pipeline_range(7, 2, 3), 0..2);
    }

    #[test]
    fn uneven_parts_are_contiguous() {
        assert_eq!(part(3, 0, 2), 0..1);
        assert_eq!(part(3, 1, 2), 1..3);
        assert_eq!(part(48, 1, 2), 24..48);
    }
}
