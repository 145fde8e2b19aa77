// mlx-bun's matrix-vector kernel for MLX's affine-quantized weights on
// NVIDIA GPUs: y[m, n] = sum_k x[m, k] * (scale[n, g] * q[n, k] + bias[n, g]).
//
// Compiled at run time by MLX's custom-kernel API (NVRTC): this file is the
// kernel's header, and the body MLX wraps in a kernel signature is one call of
// qmv() below (src/kernels/cuda.rs). x has any rank (rows = every axis but
// the last, K the last). Compile-time constants: T (bfloat16 or float16), S
// (scale type), MB (a bound on the rows of x: 1, 2 or 4), GS (group size),
// BITS (4 or 8), WARPS (warps per block), R (output columns per warp; N is a
// multiple of R), KCAP (0, or a bound on K for which x fits in shared memory)
// and GLU (y = silu(x @ w.T) * (x @ w2.T), the gated MLP's first half, with
// MLX's rounding of each step). Shapes are read at run time, so one compiled
// kernel serves every layer of a model.
//
// One warp computes R consecutive output columns for all M rows of x. Lane l
// reads 16-byte chunks l, l + 32, ... of each of those weight rows, so a warp
// streams 512 contiguous bytes per row and step, with 8 chunks in flight per
// lane. A chunk never straddles a quantization group (GS is a multiple of the
// values in a chunk).
//
// Decode streams weights faster than an SM can unpack them one value at a
// time with 32-bit integer instructions (half-rate on Hopper), so values are
// unpacked two at a time into half2 lanes: OR-ing a 4-bit value q into the
// mantissa of the half 1024.0 gives 1024 + q exactly, one LOP3 for two values
// (8-bit: one byte permute), and one half2 FMA turns that exactly into q / D
// with D = 256 (4 bits) or 4096 (8 bits). x is converted once into half2
// pairs laid out to match (into shared memory for the whole block when KCAP
// > 0, else per chunk by each warp) together with each chunk's sum. A chunk's
// products are summed in half precision (at most 16 terms of size below
// |x| * 15/256, so no overflow for any x a half can hold), then in float:
//   sum_k x_k w_k = scale * D * sum_k x_k (q_k / D) + bias * sum_k x_k.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// Packed words whose products a lane sums in half precision before adding
// them into its float total: 4 (a whole 16-byte chunk, the fastest) or 1
// (each word's products, four times closer to a float sum).
#ifndef MLX_BUN_QMV_HALF_WORDS
#define MLX_BUN_QMV_HALF_WORDS 4
#endif

namespace mlx_bun_qmv {

__device__ __forceinline__ __half2 as_half2(uint32_t u) {
  return *reinterpret_cast<__half2*>(&u);
}

__device__ __forceinline__ uint32_t as_bits(__half2 h) {
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ __half2 half2_bits(unsigned short bits) {
  __half h = __ushort_as_half(bits);
  return __halves2half2(h, h);
}

__device__ __forceinline__ uint32_t component(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The values of one packed word as half2 pairs (value p, value p + PAIRS),
// each q / D. 4 bits: 4 pairs, D = 256; 8 bits: 2 pairs, D = 4096.
template <int BITS>
__device__ __forceinline__ void unpack(uint32_t word, __half2 (&q)[16 / BITS]) {
  const __half2 mul_hi = half2_bits(0x0C00);   // 2^-12
  const __half2 add_hi = half2_bits(0xB400);   // -1/4
  if constexpr (BITS == 4) {
    const __half2 mul_lo = half2_bits(0x1C00); // 2^-8
    const __half2 add_lo = half2_bits(0xC400); // -4
    const uint32_t up = word >> 8;
    q[0] = __hfma2(as_half2((word & 0x000F000Fu) | 0x64006400u), mul_lo, add_lo);
    q[1] = __hfma2(as_half2((word & 0x00F000F0u) | 0x64006400u), mul_hi, add_hi);
    q[2] = __hfma2(as_half2((up & 0x000F000Fu) | 0x64006400u), mul_lo, add_lo);
    q[3] = __hfma2(as_half2((up & 0x00F000F0u) | 0x64006400u), mul_hi, add_hi);
  } else {
    q[0] = __hfma2(as_half2(__byte_perm(word, 0x64646464u, 0x4240)), mul_hi, add_hi);
    q[1] = __hfma2(as_half2(__byte_perm(word, 0x64646464u, 0x4341)), mul_hi, add_hi);
  }
}

// One chunk of x (the values matching 16 bytes of weights, 16-byte aligned)
// as the half2 pairs unpack() produces, four to a uint4; returns their sum.
// With a norm weight (the chunk's part of it), each value is first
// normalized as MLX's rms_norm does: x * scale rounded to T, times the
// weight, rounded to T.
template <typename T, int BITS>
__device__ __forceinline__ float convert_chunk(const T* xc, uint4 (&out)[16 / BITS],
                                               const T* norm = nullptr, float scale = 0.0f) {
  constexpr int PER_WORD = 32 / BITS;
  constexpr int PAIRS = PER_WORD / 2;
  constexpr int PER_CHUNK = 4 * PER_WORD;
  float xs[PER_CHUNK];
  float sum = 0.0f;
#pragma unroll
  for (int v = 0; v < PER_CHUNK; v += 8) {
    uint4 raw = *reinterpret_cast<const uint4*>(xc + v);
    const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      xs[v + i] = static_cast<float>(h[i]);
      if (norm != nullptr) {
        const T t = static_cast<T>(xs[v + i] * scale);
        xs[v + i] = static_cast<float>(
            static_cast<T>(static_cast<float>(norm[v + i]) * static_cast<float>(t)));
      }
      sum += xs[v + i];
    }
  }
  uint32_t pairs[4 * PAIRS];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) {
      pairs[u * PAIRS + p] =
          as_bits(__floats2half2_rn(xs[u * PER_WORD + p], xs[u * PER_WORD + p + PAIRS]));
    }
  }
#pragma unroll
  for (int i = 0; i < PAIRS; ++i) {
    out[i] = make_uint4(pairs[4 * i], pairs[4 * i + 1], pairs[4 * i + 2], pairs[4 * i + 3]);
  }
  return sum;
}

// Each row's RMS norm scale, 1 / sqrt(mean(x^2) + eps), summed in float
// over the whole block and written to scale[m] for every row m < M.
template <typename T, int MB, int WARPS>
__device__ __forceinline__ void rms_scales(const T* x, int M, int K, float eps, float* scale) {
  __shared__ float partial[MB][WARPS];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int m = 0; m < M; ++m) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < K; i += WARPS * 32) {
      const float v = static_cast<float>(x[static_cast<size_t>(m) * K + i]);
      s += v * v;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      s += __shfl_xor_sync(0xffffffffu, s, off);
    }
    if (lane == 0) {
      partial[m][warp] = s;
    }
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < M) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      s += partial[threadIdx.x][w];
    }
    scale[threadIdx.x] = rsqrtf(s / static_cast<float>(K) + eps);
  }
  __syncthreads();
}

// silu(g) * u as MLX computes it on T: sigmoid by 1 / (1 + exp(|g|)), then
// two products, each step rounded to T.
template <typename T>
__device__ __forceinline__ T silu_times(T g, T u) {
  const float gf = static_cast<float>(g);
  const T e = static_cast<T>(expf(fabsf(gf)));
  const T d = static_cast<T>(1.0f + static_cast<float>(e));
  const T inv = static_cast<T>(1.0f / static_cast<float>(d));
  const T sig = gf < 0.0f ? inv : static_cast<T>(1.0f - static_cast<float>(inv));
  const T silu = static_cast<T>(gf * static_cast<float>(sig));
  return static_cast<T>(static_cast<float>(silu) * static_cast<float>(u));
}

// residual: added to each output (rounded to T first, then the sum rounded,
// as MLX's separate add), or nullptr. block0: the first block of this
// product's grid (a launch may compute several products, one after another).
// norm: the weight of an RMS norm (eps) applied to x first, or nullptr; only
// with x in shared memory (KCAP > 0).
template <typename T, typename S, int MB, int GS, int BITS, int WARPS, int R, int KCAP,
          bool GLU, typename XShape, typename WShape>
__device__ __forceinline__ void qmv(
    const T* x, const XShape& x_shape, int x_ndim, const uint32_t* w, const WShape& w_shape,
    const S* scales, const S* biases, const uint32_t* w2, const S* scales2, const S* biases2,
    T* y, const T* residual, int block0, const T* norm = nullptr, float eps = 0.0f) {
  constexpr int PER_WORD = 32 / BITS;
  constexpr int PAIRS = PER_WORD / 2;
  constexpr int PER_CHUNK = 4 * PER_WORD;  // values in 16 bytes of weights
  constexpr float D = BITS == 4 ? 256.0f : 4096.0f;
  constexpr int RR = GLU ? 2 * R : R;        // weight rows per warp
  constexpr int UNROLL = RR >= 8 ? 1 : 8 / RR;
  constexpr int KCH = KCAP / PER_CHUNK;    // chunks of x held in shared memory
  const int N = w_shape[0];
  const int K = w_shape[1] * PER_WORD;
  int M = 1;
  for (int d = 0; d + 1 < x_ndim; ++d) {
    M *= x_shape[d];
  }
  const int CHUNKS = K / PER_CHUNK;
  const int GROUPS = K / GS;
  __shared__ uint4 x_pairs[KCAP > 0 ? MB * PAIRS * KCH : 1];
  __shared__ float x_sums[KCAP > 0 ? MB * KCH : 1];
  if constexpr (KCAP > 0) {
    __shared__ float x_scales[MB];
    if (norm != nullptr) {
      rms_scales<T, MB, WARPS>(x, M, K, eps, x_scales);
    }
    for (int i = threadIdx.x; i < M * CHUNKS; i += blockDim.x) {
      const int m = i / CHUNKS;
      const int c = i - m * CHUNKS;
      uint4 t[PAIRS];
      x_sums[m * KCH + c] = convert_chunk<T, BITS>(
          x + static_cast<size_t>(m) * K + c * PER_CHUNK, t,
          norm == nullptr ? nullptr : norm + c * PER_CHUNK, norm == nullptr ? 0.0f : x_scales[m]);
#pragma unroll
      for (int j = 0; j < PAIRS; ++j) {
        x_pairs[(m * PAIRS + j) * KCH + c] = t[j];
      }
    }
    __syncthreads();
  }
  const int lane = threadIdx.x & 31;
  const int n0 = ((static_cast<int>(blockIdx.x) - block0) * WARPS + (threadIdx.x >> 5)) * R;
  if (n0 >= N) {
    return;
  }
  const uint4* wrow[RR];
  const S* srow[RR];
  const S* brow[RR];
  float acc[RR][MB];
#pragma unroll
  for (int r = 0; r < RR; ++r) {
    const bool second = GLU && r >= R;
    const size_t n = n0 + (second ? r - R : r);
    wrow[r] = reinterpret_cast<const uint4*>(second ? w2 : w) + n * CHUNKS;
    srow[r] = (second ? scales2 : scales) + n * GROUPS;
    brow[r] = (second ? biases2 : biases) + n * GROUPS;
#pragma unroll
    for (int m = 0; m < MB; ++m) {
      acc[r][m] = 0.0f;
    }
  }
  for (int c0 = lane; c0 < CHUNKS; c0 += 32 * UNROLL) {
    // Every load of this step is issued before any of its arithmetic.
    uint4 packed[UNROLL][RR];
    float s[UNROLL][RR];
    float b[UNROLL][RR];
#pragma unroll
    for (int i = 0; i < UNROLL; ++i) {
      const int c = c0 + 32 * i;
      if (c < CHUNKS) {
        const int g = (c * PER_CHUNK) / GS;
#pragma unroll
        for (int r = 0; r < RR; ++r) {
          packed[i][r] = __ldg(wrow[r] + c);
          s[i][r] = D * static_cast<float>(srow[r][g]);
          b[i][r] = static_cast<float>(brow[r][g]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < UNROLL; ++i) {
      const int c = c0 + 32 * i;
      if (c >= CHUNKS) {
        break;
      }
      uint4 xq[MB][PAIRS];
      float sx[MB];
#pragma unroll
      for (int m = 0; m < MB; ++m) {
        if constexpr (KCAP > 0) {
#pragma unroll
          for (int j = 0; j < PAIRS; ++j) {
            xq[m][j] = x_pairs[(m * PAIRS + j) * KCH + c];
          }
          sx[m] = x_sums[m * KCH + c];
        } else {
          sx[m] = m < M ? convert_chunk<T, BITS>(x + static_cast<size_t>(m) * K + c * PER_CHUNK, xq[m]) : 0.0f;
        }
      }
#pragma unroll
      for (int r = 0; r < RR; ++r) {
        const uint32_t words[4] = {packed[i][r].x, packed[i][r].y, packed[i][r].z, packed[i][r].w};
        constexpr int HW = MLX_BUN_QMV_HALF_WORDS;
        __half2 dot[MB];
        float dotf[MB];
#pragma unroll
        for (int m = 0; m < MB; ++m) {
          dot[m] = half2_bits(0);
          dotf[m] = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          __half2 q[PAIRS];
          unpack<BITS>(words[u], q);
#pragma unroll
          for (int m = 0; m < MB; ++m) {
#pragma unroll
            for (int p = 0; p < PAIRS; ++p) {
              const int j = u * PAIRS + p;
              dot[m] = __hfma2(as_half2(component(xq[m][j / 4], j % 4)), q[p], dot[m]);
            }
            if ((u + 1) % HW == 0) {
              const float2 f = __half22float2(dot[m]);
              dotf[m] += f.x + f.y;
              dot[m] = half2_bits(0);
            }
          }
        }
#pragma unroll
        for (int m = 0; m < MB; ++m) {
          acc[r][m] += s[i][r] * dotf[m] + b[i][r] * sx[m];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RR; ++r) {
#pragma unroll
    for (int m = 0; m < MB; ++m) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], off);
      }
    }
  }
  if (lane != 0) {
    return;
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < MB; ++m) {
      if (m < M) {
        const size_t at = static_cast<size_t>(m) * N + n0 + r;
        T out = GLU ? silu_times(static_cast<T>(acc[r][m]), static_cast<T>(acc[R + r][m]))
                    : static_cast<T>(acc[r][m]);
        if (residual != nullptr) {
          out = static_cast<T>(static_cast<float>(out) + static_cast<float>(residual[at]));
        }
        y[at] = out;
      }
    }
  }
}

// The query, key and value projections of one x in one launch: the grid's
// first blocks compute y = x @ w.T, the next yk, the last yv (of x after an
// RMS norm with weight norm, when given).
template <typename T, typename S, int MB, int GS, int BITS, int WARPS, int R, int KCAP,
          typename XShape, typename WShape>
__device__ __forceinline__ void qkv(
    const T* x, const XShape& x_shape, int x_ndim,
    const uint32_t* w, const WShape& w_shape, const S* scales, const S* biases,
    const uint32_t* wk, const WShape& wk_shape, const S* sk, const S* bk,
    const uint32_t* wv, const WShape& wv_shape, const S* sv, const S* bv,
    T* y, T* yk, T* yv, const T* norm = nullptr, float eps = 0.0f) {
  const int q_blocks = (w_shape[0] / R + WARPS - 1) / WARPS;
  const int k_blocks = (wk_shape[0] / R + WARPS - 1) / WARPS;
  const int b = static_cast<int>(blockIdx.x);
  if (b < q_blocks) {
    qmv<T, S, MB, GS, BITS, WARPS, R, KCAP, false>(
        x, x_shape, x_ndim, w, w_shape, scales, biases, w, scales, biases, y, nullptr, 0, norm, eps);
  } else if (b < q_blocks + k_blocks) {
    qmv<T, S, MB, GS, BITS, WARPS, R, KCAP, false>(
        x, x_shape, x_ndim, wk, wk_shape, sk, bk, wk, sk, bk, yk, nullptr, q_blocks, norm, eps);
  } else {
    qmv<T, S, MB, GS, BITS, WARPS, R, KCAP, false>(
        x, x_shape, x_ndim, wv, wv_shape, sv, bv, wv, sv, bv, yv, nullptr, q_blocks + k_blocks, norm, eps);
  }
}

}  // namespace mlx_bun_qmv
