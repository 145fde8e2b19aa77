/* C interface of mlx-bun's own kernels, over mlx-c's array handles. */

#ifndef MLX_BUN_KERNELS_H
#define MLX_BUN_KERNELS_H

#include <stdint.h>

#include "mlx/c/array.h"

#ifdef __cplusplus
extern "C" {
#endif

/* res = quantized_matmul(x, w, scales, biases, transpose=true, group_size,
 * bits) in MLX's affine mode, as a lazy array evaluated by mlx-bun's CPU
 * kernel on the CPU stream. x, scales and biases must be float32, w uint32.
 * Returns 0 on success; otherwise mlx_bun_last_error() says why. */
int mlx_bun_cpu_qmm(
    mlx_array* res,
    mlx_array x,
    mlx_array w,
    mlx_array scales,
    mlx_array biases,
    int group_size,
    int bits);

/* mlx_bun_cpu_qmm plus `residual` (float32, the product's shape), added in
 * the same node: x @ dequantize(w).T + residual. */
int mlx_bun_cpu_qmm_add(
    mlx_array* res,
    mlx_array x,
    mlx_array w,
    mlx_array scales,
    mlx_array biases,
    mlx_array residual,
    int group_size,
    int bits);

/* res = silu(x @ dequantize(gate).T) * (x @ dequantize(up).T), the gated
 * MLP's first half, for two affine-quantized layers of one shape, as one CPU
 * primitive (both products in one pass over the kernel's threads). */
int mlx_bun_cpu_silu_glu(
    mlx_array* res,
    mlx_array x,
    mlx_array gate_w,
    mlx_array gate_scales,
    mlx_array gate_biases,
    mlx_array up_w,
    mlx_array up_scales,
    mlx_array up_biases,
    int group_size,
    int bits);

/* res = fast::rms_norm(x, weight, eps) for float32 x [..., d] and weight
 * [d], as one CPU primitive (MLX 0.32 expands it into ~8 ops on the CPU). */
int mlx_bun_cpu_rms_norm(mlx_array* res, mlx_array x, mlx_array weight, float eps);

/* x - logsumexp(x) over the last axis of float32 x, bit for bit as MLX's CPU
   logsumexp and subtraction compute it. */
int mlx_bun_cpu_log_softmax(mlx_array* res, mlx_array x);

/* Rows `ids` (any integer dtype and shape) of an affine-quantized table:
 * res[..., j] = scales[id, j / group_size] * q[id, j] + biases[id, j / group_size]
 * in float32, bit for bit as MLX's take and dequantize compute it; `w` is
 * uint32 [rows, k * bits / 32], scales and biases float32 [rows, k / group_size]. */
int mlx_bun_cpu_quantized_embedding(
    mlx_array* res,
    mlx_array ids,
    mlx_array w,
    mlx_array scales,
    mlx_array biases,
    int group_size,
    int bits);

/* res = fast::rope(x, dims, traditional=false, base, scale, offset, freqs)
 * for float32 x [..., L, d], as one CPU primitive. `freqs` may be an empty
 * handle (ctx NULL); then `base` sets the frequencies. */
int mlx_bun_cpu_rope(
    mlx_array* res,
    mlx_array x,
    int dims,
    float base,
    float scale,
    int offset,
    mlx_array freqs,
    mlx_array offsets);

/* res = fast::scaled_dot_product_attention(q, k, v, scale, mask) transposed
 * to [B, L, heads * D], for float32 q [B, heads, L, D] and k, v [B, kv_heads,
 * S, D], as one CPU primitive. `causal` hides keys after each query's
 * position (S - L + l); `mask` may be an empty handle (ctx NULL), else a
 * boolean array broadcastable to [B, heads, L, S]. `positions` > 0 attends
 * only to the first that many of the S stored (a cache's buffers past its
 * length); S then means `positions` above. */
int mlx_bun_cpu_attention(
    mlx_array* res,
    mlx_array q,
    mlx_array k,
    mlx_array v,
    mlx_array mask,
    float scale,
    int causal,
    int positions);

/* mlx_bun_cpu_attention over a quantized KV cache: `keys` and `values` are
 * each three handles (packed uint32 [B, kv_heads, S, D * bits / 32], float32
 * scales and biases [B, kv_heads, S, D / group_size]), bits 2, 4 or 8.
 * `positions` > 0 attends only to the first that many of the S stored
 * (a cache's buffers past its length); the mask then covers those. */
int mlx_bun_cpu_quantized_attention(
    mlx_array* res,
    mlx_array q,
    const mlx_array* keys,
    const mlx_array* values,
    mlx_array mask,
    float scale,
    int causal,
    int bits,
    int group_size,
    int positions);

/* The attention block's inputs in one CPU primitive: q, k and v =
 * x @ dequantize(layer).T for three affine-quantized layers (each three
 * handles: packed uint32 weights [rows, k * bits / 32], float32 scales and
 * biases), q and k rotated by rotate-half RoPE (fast::rope's parameters; an
 * empty `freqs` handle: `rope_base` sets the frequencies; an empty `offsets`
 * handle: every row starts at `offset`, else int32 [B] per row), each written
 * as [B, heads, L, head_dim] for float32 x [B, L, k]. */
int mlx_bun_cpu_qkv_rope(
    mlx_array* q_out,
    mlx_array* k_out,
    mlx_array* v_out,
    mlx_array x,
    const mlx_array* q_layer,
    const mlx_array* k_layer,
    const mlx_array* v_layer,
    int group_size,
    int bits,
    int heads,
    int kv_heads,
    int head_dim,
    int rope_dims,
    float rope_base,
    float rope_scale,
    int offset,
    mlx_array freqs,
    mlx_array offsets);

/* 1 when the kernel handles this layer shape and quantization. */
int mlx_bun_cpu_qmm_supported(int in_features, int group_size, int bits);

/* Threads (0: the cores, at most 8), helper spin time in microseconds, the
 * widest instruction set ("" for any) and the most activation rows of a
 * product computed by integer dot products over activations quantized to
 * int8 (not MLX's arithmetic; 0: none); call before the first product. */
void mlx_bun_cpu_configure(int threads, int spin_us, const char* isa, int int8_rows);

/* The instruction set in use ("avx512", "avx2", "neon", "scalar"). */
const char* mlx_bun_cpu_isa(void);

/* The integer dot products in use ("avx512-vnni", "avx512bw"), or "". */
const char* mlx_bun_cpu_int8(void);

/* Threads the kernel splits one product over, the calling one included. */
int mlx_bun_cpu_threads(void);

/* Products computed so far at this bit width and the nanoseconds the CPU
 * stream spent in them. */
void mlx_bun_cpu_qmm_stats(int bits, uint64_t* calls, uint64_t* nanoseconds);

/* The message of the last failed call on this thread. */
const char* mlx_bun_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
