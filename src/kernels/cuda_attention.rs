//! One new token's attention on an NVIDIA GPU by one launch of mlx-bun's
//! kernel (`kernels/cuda/decode_attention.cu`): RoPE on the query and the
//! key, the key and value written into the cache's buffers in place, and the
//! query heads' attention over every cached position. MLX builds the same
//! from five or six nodes per layer (two RoPEs, two cache writes, the
//! attention), and a single sequence's decode step on a GPU is bound by the
//! host time each node costs (docs/gpu.md). It runs where
//! `MLX_BUN_CUDA_ATTENTION=1` asks for it (and in `bench attention`): it
//! has not been timed on a GPU yet, and its sums are ordered differently
//! from MLX's attention, so it changes the last bits. Its logic is checked
//! on the CPU (`tests/cuda_attention_emulated.rs`) and its source under
//! NVRTC (`tests/cuda_nvrtc.rs`).

use anyhow::{anyhow, bail, Result};
use mlx_rs::{Array, Dtype};

use super::cuda::{self, Kernel, KernelText};
use super::RopeParams;

const SOURCE: &str = include_str!("../../kernels/cuda/decode_attention.cu");
const WARPS: i32 = 8;

/// One attention block's heads, scale and RoPE.
#[derive(Clone, Copy)]
pub struct DecodeAttention<'a> {
    /// Query heads.
    pub heads: i32,
    /// Key and value heads (a divisor of `heads`).
    pub kv_heads: i32,
    /// Features per head.
    pub head_dim: i32,
    /// Multiplies the query-key products.
    pub scale: f32,
    /// RoPE over the whole head.
    pub rope: RopeParams<'a>,
}

/// Whether the kernel computes this block's step for queries `q` `[B,
/// heads, 1, head_dim]`: on a GPU where it is asked for, a half
/// dtype, head dim 64, 128 or 256 (adjacent-pair RoPE from 128), RoPE over
/// the whole head.
pub fn applies(q: &Array, layout: &DecodeAttention) -> bool {
    let d = layout.head_dim;
    let rope = &layout.rope;
    let rope_fits = rope.dims == d
        && (rope.base.is_some()
            || rope
                .freqs
                .is_some_and(|f| f.dtype() == Dtype::Float32 && f.size() as i32 == d / 2));
    crate::mlx_ext::on_gpu()
        && (crate::settings::get().cuda_attention || cuda::forced_everywhere())
        && q.ndim() == 4
        && q.shape()[1] == layout.heads
        && q.shape()[2] == 1
        && q.shape()[3] == d
        && matches!(q.dtype(), Dtype::Bfloat16 | Dtype::Float16)
        && matches!(d, 64 | 128 | 256)
        && (!rope.traditional || d >= 128)
        && layout.kv_heads > 0
        && layout.heads % layout.kv_heads == 0
        && rope_fits
}

/// The heads' outputs `[B, 1, heads × head_dim]` for `q`, `k` and `v`
/// `[B, heads or kv heads, 1, head_dim]` before RoPE, at position `offset`,
/// writing the rotated key and the value into `keys` and `values` `[B, kv
/// heads, capacity, head_dim]` at `offset` in place. The caller holds the
/// buffers alone and counts the position as written; the caller checks
/// [`applies`] first.
pub fn decode_attention(
    [q, k, v]: [&Array; 3],
    [keys, values]: [&Array; 2],
    offset: i32,
    layout: &DecodeAttention,
) -> Result<Array> {
    let (b, d) = (q.shape()[0], layout.head_dim);
    let cache_fits = keys.ndim() == 4
        && keys.shape() == values.shape()
        && keys.shape()[0] == b
        && keys.shape()[1] == layout.kv_heads
        && keys.shape()[2] > offset
        && keys.shape()[3] == d
        && keys.dtype() == q.dtype()
        && values.dtype() == q.dtype();
    let new_fits = [k, v]
        .iter()
        .all(|a| a.size() as i32 == b * layout.kv_heads * d && a.dtype() == q.dtype());
    if !cache_fits || !new_fits || offset < 0 {
        bail!("the decode attention kernel does not take these arrays");
    }
    let rope = &layout.rope;
    let offset = Array::from_slice(&[offset], &[1]);
    let params = Array::from_slice(
        &[layout.scale, rope.scale, rope.base.map_or(0.0, f32::log2)],
        &[3],
    );
    let freqs = rope.freqs.unwrap_or(&params);
    let ints = [
        d,
        WARPS,
        rope.traditional as i32,
        rope.freqs.is_some() as i32,
    ];
    cuda::run_kernel(
        kernel()?,
        &[q, k, v, keys, values, &offset, &params, freqs],
        &[(vec![b, 1, layout.heads * d], q.dtype())],
        &ints,
        &[q.dtype()],
        (WARPS * 32, layout.heads, b),
        (WARPS * 32, 1, 1),
    )?
    .pop()
    .ok_or_else(|| anyhow!("the decode attention kernel returned nothing"))
}

const BODY: &str = "mlx_bun_attention::decode_attention<T, D, WARPS, TRAD, FREQS>(\n\
    q, k, v, keys, keys_shape, values, offset, params, freqs, out);\n";
const INPUTS: [&str; 8] = ["q", "k", "v", "keys", "values", "offset", "params", "freqs"];

fn kernel() -> Result<&'static Kernel> {
    static KERNEL: std::sync::OnceLock<Result<Kernel, String>> = std::sync::OnceLock::new();
    KERNEL
        .get_or_init(|| {
            cuda::make_custom_kernel(&KernelText {
                name: "mlx_bun_decode_attention",
                header: &cuda::compact(SOURCE),
                body: BODY,
                inputs: &INPUTS,
                outputs: &["out"],
                int_params: &["D", "WARPS", "TRAD", "FREQS"],
                type_params: &["T"],
            })
            .map_err(|e| format!("{e:#}"))
        })
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_passes_every_input_and_the_output() {
        for input in INPUTS {
            assert!(BODY.contains(&format!("{input},")), "{input}");
        }
        assert!(BODY.contains("keys_shape") && BODY.contains("out)"));
        let text = cuda::compact(SOURCE);
        assert!(!text.contains("//"));
        assert!(text.contains("void decode_attention("));
    }
}
