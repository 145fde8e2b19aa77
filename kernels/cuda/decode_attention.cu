// mlx-bun's decode attention for NVIDIA GPUs: one new token of one sequence
// row, in one launch, does what MLX builds from five or six nodes per layer:
// RoPE on the query and the key, the key and value written into the cache's
// buffers at the token's position, and the query heads' attention over every
// position up to and including it.
//
// Compiled at run time by MLX's custom-kernel API (NVRTC); the body MLX wraps
// in a kernel signature is one call of decode_attention() below
// (src/kernels/cuda_attention.rs). Compile-time constants: T (bfloat16 or
// float16), D (head dim: 64, 128 or 256), WARPS (warps per block), TRAD (1:
// RoPE rotates adjacent pairs, 0: the two halves) and FREQS (1: per-pair
// frequencies given, 0: from the base).
//
// Inputs: q [B, 1, H * D], k and v [B, 1, Hkv * D] (before RoPE), the cache's
// buffers keys and values [B, Hkv, capacity, D] (positions before `offset`
// live), offset (int32 [1]: the new token's position), params (float32 [3]:
// the attention scale, RoPE's position scale, log2 of RoPE's base) and freqs
// (float32 [D / 2] when FREQS). Output: [B, 1, H * D], the heads' outputs in
// the layout the output projection takes.
//
// The cache's buffers are written in place, although MLX passes them as
// inputs: the caller owns them alone (src/cache/mod.rs) and counts the
// position as written. Only position `offset` is written, by one block per
// key head, and no block reads that position from memory (each takes the new
// key and value from its own registers), so blocks never race.
//
// One block per (query head, row). Lane l holds D / 32 features of a head
// vector: D / 64 consecutive ones in each half, so both members of every
// RoPE pair (rotate-half or, for D >= 128, adjacent) sit in one lane. Warp w
// takes positions w, w + WARPS, ... with an online softmax in base 2; the
// warps' partial sums are merged through shared memory.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace mlx_bun_attention {

constexpr float LOG2E = 1.4426950408889634f;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, off);
  }
  return v;
}

template <typename T, int P>
struct alignas(sizeof(T) * P) Pack {
  T v[P];
};

// A lane's D / 32 features of the head vector at `row`, as floats.
template <typename T, int D>
__device__ __forceinline__ void load(const T* row, int lane, float (&out)[D / 32]) {
  constexpr int P = D / 64;
  const Pack<T, P> lo = *reinterpret_cast<const Pack<T, P>*>(row + lane * P);
  const Pack<T, P> hi = *reinterpret_cast<const Pack<T, P>*>(row + D / 2 + lane * P);
#pragma unroll
  for (int j = 0; j < P; ++j) {
    out[j] = static_cast<float>(lo.v[j]);
    out[P + j] = static_cast<float>(hi.v[j]);
  }
}

template <typename T, int D>
__device__ __forceinline__ void store(T* row, int lane, const float (&in)[D / 32]) {
  constexpr int P = D / 64;
  Pack<T, P> lo;
  Pack<T, P> hi;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    lo.v[j] = static_cast<T>(in[j]);
    hi.v[j] = static_cast<T>(in[P + j]);
  }
  *reinterpret_cast<Pack<T, P>*>(row + lane * P) = lo;
  *reinterpret_cast<Pack<T, P>*>(row + D / 2 + lane * P) = hi;
}

// One RoPE pair rotated by the angle of frequency pair `i` at `position`,
// each result rounded to T: the arithmetic of MLX's fast::rope kernel.
template <typename T, bool FREQS>
__device__ __forceinline__ void rotate(float& x1, float& x2, int i, float half, float position,
                                       float log2_base, const float* freqs) {
  float inv_freq;
  if constexpr (FREQS) {
    inv_freq = static_cast<float>(1.0 / static_cast<double>(freqs[i]));
  } else {
    inv_freq = exp2f(-(static_cast<float>(i) / half) * log2_base);
  }
  const float theta = position * inv_freq;
  const float c = cosf(theta);
  const float s = sinf(theta);
  const float r1 = x1 * c - x2 * s;
  const float r2 = x1 * s + x2 * c;
  x1 = static_cast<float>(static_cast<T>(r1));
  x2 = static_cast<float>(static_cast<T>(r2));
}

template <typename T, int D, bool TRAD, bool FREQS>
__device__ __forceinline__ void rope(float (&x)[D / 32], int lane, float position, float log2_base,
                                     const float* freqs) {
  constexpr int P = D / 64;
  constexpr float HALF = D / 2;
  if constexpr (!TRAD) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      rotate<T, FREQS>(x[j], x[P + j], lane * P + j, HALF, position, log2_base, freqs);
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int j = 0; j < P; j += 2) {
        const int feature = h * (D / 2) + lane * P + j;
        rotate<T, FREQS>(x[h * P + j], x[h * P + j + 1], feature / 2, HALF, position, log2_base,
                         freqs);
      }
    }
  }
}

template <typename T, int D, int WARPS, int TRAD, int FREQS, typename KShape>
__device__ __forceinline__ void decode_attention(
    const T* q, const T* k, const T* v, const T* keys, const KShape& keys_shape, const T* values,
    const int* offset, const float* params, const float* freqs, T* out) {
  static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");
  static_assert(!TRAD || D >= 128, "adjacent-pair RoPE needs two features per half and lane");
  constexpr int E = D / 32;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int heads = gridDim.y;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int kv_heads = keys_shape[1];
  const int capacity = keys_shape[2];
  const int group = heads / kv_heads;
  const int kvh = h / group;
  const int pos = offset[0];
  const float position = params[1] * static_cast<float>(pos);
  const float log2_base = params[2];

  float qf[E];
  float kn[E];
  float vn[E];
  load<T, D>(q + (static_cast<size_t>(b) * heads + h) * D, lane, qf);
  load<T, D>(k + (static_cast<size_t>(b) * kv_heads + kvh) * D, lane, kn);
  load<T, D>(v + (static_cast<size_t>(b) * kv_heads + kvh) * D, lane, vn);
  rope<T, D, TRAD != 0, FREQS != 0>(qf, lane, position, log2_base, freqs);
  rope<T, D, TRAD != 0, FREQS != 0>(kn, lane, position, log2_base, freqs);
  const float scale = params[0] * LOG2E;
#pragma unroll
  for (int j = 0; j < E; ++j) {
    qf[j] *= scale;
  }

  const size_t head_base = (static_cast<size_t>(b) * kv_heads + kvh) * capacity * D;
  if (h % group == 0 && warp == 0) {
    store<T, D>(const_cast<T*>(keys) + head_base + static_cast<size_t>(pos) * D, lane, kn);
    store<T, D>(const_cast<T*>(values) + head_base + static_cast<size_t>(pos) * D, lane, vn);
  }

  const float minus_infinity = __int_as_float(0xff800000);
  float m = minus_infinity;
  float l = 0.0f;
  float acc[E];
#pragma unroll
  for (int j = 0; j < E; ++j) {
    acc[j] = 0.0f;
  }
  auto take = [&](float score, const float (&vals)[E]) {
    const float m_new = fmaxf(m, score);
    const float factor = exp2f(m - m_new);
    const float p = exp2f(score - m_new);
    l = l * factor + p;
#pragma unroll
    for (int j = 0; j < E; ++j) {
      acc[j] = acc[j] * factor + p * vals[j];
    }
    m = m_new;
  };
  constexpr int U = 2;
  int s = warp;
  for (; s + (U - 1) * WARPS < pos; s += U * WARPS) {
    float kf[U][E];
    float vf[U][E];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      load<T, D>(keys + head_base + static_cast<size_t>(s + u * WARPS) * D, lane, kf[u]);
      load<T, D>(values + head_base + static_cast<size_t>(s + u * WARPS) * D, lane, vf[u]);
    }
    float score[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < E; ++j) {
        dot += qf[j] * kf[u][j];
      }
      score[u] = warp_sum(dot);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      take(score[u], vf[u]);
    }
  }
  for (; s < pos; s += WARPS) {
    float kf[E];
    float vf[E];
    load<T, D>(keys + head_base + static_cast<size_t>(s) * D, lane, kf);
    load<T, D>(values + head_base + static_cast<size_t>(s) * D, lane, vf);
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < E; ++j) {
      dot += qf[j] * kf[j];
    }
    take(warp_sum(dot), vf);
  }
  if (warp == pos % WARPS) {
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < E; ++j) {
      dot += qf[j] * kn[j];
    }
    take(warp_sum(dot), vn);
  }

  __shared__ float warp_m[WARPS];
  __shared__ float warp_l[WARPS];
  __shared__ float warp_acc[WARPS][D];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
  constexpr int P = D / 64;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    warp_acc[warp][lane * P + j] = acc[j];
    warp_acc[warp][D / 2 + lane * P + j] = acc[P + j];
  }
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += WARPS * 32) {
    float top = minus_infinity;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      top = fmaxf(top, warp_m[w]);
    }
    float sum = 0.0f;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float f = warp_l[w] > 0.0f ? exp2f(warp_m[w] - top) : 0.0f;
      sum += warp_l[w] * f;
      o += warp_acc[w][d] * f;
    }
    out[(static_cast<size_t>(b) * heads + h) * D + d] = static_cast<T>(o / sum);
  }
}

}  // namespace mlx_bun_attention
