//! A decoder layer's decode step as two compiled pieces, on a GPU.
//!
//! Building a step's lazy graph costs host time per node, and on a GPU a
//! single sequence's step is bound by that host time, not by the device
//! (docs/gpu.md). MLX's `compile` traces a function once per input shape
//! and then replays the traced nodes: no shape checks, dtype promotion or
//! kernel-source assembly per step, and chains of elementwise ops fused into
//! one kernel. A layer's step is cut around what changes from step to step
//! (the RoPE offset, the cache's length): before attention, the input norm
//! and the query/key/value projections; after it, the output projection, the
//! residual, the MLP's norm, the MLP and its residual. RoPE, the cache update
//! and the attention itself are built per step as before, or as one launch
//! of mlx-bun's decode attention kernel where it runs
//! (`kernels::cuda_attention`).

use std::sync::Mutex;

use anyhow::Result;
use mlx_rs::Array;

use super::decoder::{AttentionInputs, Block, FeedForward, QkNormSpan, Residual};
use super::layers::Linear;
use crate::mlx_closure::Closure;

/// Rows × positions a step may have to be compiled: decode and speculative
/// verification. Prompts (a new shape per length) are built node by node.
const MAX_STEP_TOKENS: i32 = 16;

/// The two compiled pieces of one layer.
pub(crate) struct StepPieces {
    /// `x -> q, k, v[, gate]` (before RoPE).
    before: Closure,
    /// `attention output, x[, gate] -> the layer's output`.
    after: Closure,
    /// The CUDA kernel's routing when traced: a trace bakes in which kernel
    /// each product takes.
    routing: u8,
}

/// A layer's compiled pieces, made on its first decode step. A copy of the
/// layer starts without them (its weights may be replaced).
#[derive(Default)]
pub(crate) struct CompiledSlot(Mutex<Option<StepPieces>>);

impl Clone for CompiledSlot {
    fn clone(&self) -> Self {
        Self::default()
    }
}

// SAFETY: the pieces are immutable MLX function objects plus Rust closures
// that only clone arrays of the layer they were made from. MLX calls a
// closure's Rust function only while tracing inside `apply`, and `apply`
// runs with the slot's lock held, so no two threads run it at once.
unsafe impl Send for CompiledSlot {}
unsafe impl Sync for CompiledSlot {}

/// Whether this process compiles decode steps: on a GPU unless the
/// settings say otherwise. On the CPU a step is bound by its arithmetic, not
/// by building the graph.
fn enabled() -> bool {
    crate::settings::get()
        .compile_step
        .unwrap_or_else(crate::mlx_ext::on_gpu)
}

/// Whether `x` `[B, L, hidden]` is a step this process compiles.
fn step_sized(x: &Array) -> bool {
    enabled() && x.ndim() == 3 && x.shape()[0] * x.shape()[1] <= MAX_STEP_TOKENS
}

fn plain(linear: &Linear) -> bool {
    linear.lora.is_none() && linear.all_sum.is_none()
}

/// Whether the layer is a pre-norm attention layer with a dense MLP and
/// plain projections (no adapters, no cross-rank sums): the layers the two
/// pieces cover.
fn compilable(block: &Block) -> bool {
    let attn = &block.self_attn;
    let FeedForward::Dense(mlp) = &block.mlp else {
        return false;
    };
    matches!(block.residual, Residual::PreNorm)
        && block.linear_attn.is_none()
        && attn.latent.is_none()
        && !matches!(attn.qk_norm_span, QkNormSpan::AllRanks { .. })
        && [
            &attn.q_proj,
            &attn.k_proj,
            &attn.v_proj,
            &attn.o_proj,
            &mlp.gate_proj,
            &mlp.up_proj,
            &mlp.down_proj,
        ]
        .into_iter()
        .all(plain)
}

impl StepPieces {
    fn new(block: &Block) -> Result<Self> {
        let norm = block.input_layernorm.clone();
        let attn = block.self_attn.clone();
        let before = Closure::new(move |inputs: &[Array]| {
            let AttentionInputs { q, k, v, gate } = attn.projections(&inputs[0], Some(&norm))?;
            Ok([q, k, v].into_iter().chain(gate).collect())
        });
        let attn = block.self_attn.clone();
        let norm = block.post_attention_layernorm.clone();
        let Some(mlp) = block.mlp.dense().cloned() else {
            anyhow::bail!("only layers with a dense MLP are compiled");
        };
        let after = Closure::new(move |inputs: &[Array]| {
            let h = attn.output(&inputs[0], inputs.get(2), Some(&inputs[1]))?;
            Ok(vec![mlp.forward_after_norm_plus(&norm, &h, &h)?])
        });
        Ok(Self {
            before: compiled(before)?,
            after: compiled(after)?,
            routing: crate::kernels::cuda::routing(),
        })
    }
}

fn compiled(closure: Closure) -> Result<Closure> {
    // SAFETY: `mlx_compile` fills the fresh handle from a live closure.
    closure.transformed("compile", |res, fun| unsafe {
        mlx_sys::mlx_compile(res, fun, false)
    })
}

/// The layer's output for `x` through its compiled pieces, or `None` where
/// this step or layer is not compiled.
pub(crate) fn forward(
    block: &Block,
    x: &Array,
    cache: &mut dyn crate::cache::KvCache,
) -> Result<Option<Array>> {
    if !step_sized(x) || !compilable(block) {
        return Ok(None);
    }
    let mut slot = block.compiled.0.lock().unwrap_or_else(|e| e.into_inner());
    let routing = crate::kernels::cuda::routing();
    if slot.as_ref().is_none_or(|p| p.routing != routing) {
        *slot = Some(StepPieces::new(block)?);
    }
    let pieces = slot.as_ref().expect("made above");
    let mut projected = pieces.before.apply(&[x])?.into_iter();
    let (Some(q), Some(k), Some(v)) = (projected.next(), projected.next(), projected.next()) else {
        anyhow::bail!("the compiled projections returned too few arrays");
    };
    let inputs = AttentionInputs {
        q,
        k,
        v,
        gate: projected.next(),
    };
    let positions = cache.positions();
    let attn = &block.self_attn;
    let (out, gate) = match attn.attend_in_place(&inputs, &positions, cache)? {
        Some(out) => (out, inputs.gate),
        None => {
            let AttentionInputs { q, k, v, gate } = attn.rotated(inputs, &positions)?;
            (attn.attend(q, k, v, &positions, cache)?, gate)
        }
    };
    let mut inputs = vec![&out, x];
    inputs.extend(gate.as_ref());
    let mut result = pieces.after.apply(&inputs)?;
    drop(slot);
    LAYER_STEPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    result
        .pop()
        .map(Some)
        .ok_or_else(|| anyhow::anyhow!("the compiled layer output is missing"))
}

static LAYER_STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many layer steps this process has run through compiled pieces (the
/// tests check that the compiled path ran).
pub fn layer_steps() -> u64 {
    LAYER_STEPS.load(std::sync::atomic::Ordering::Relaxed)
}
