// mlx-bun's matrix-vector kernel for MLX's affine-quantized weights on
// NVIDIA GPUs: y[m, n] = sum_k x[m, k] * (scale[n, g] * q[n, k] + bias[n, g]).
//
// Compiled at run time by MLX's custom-kernel API (NVRTC). The part above the
// BODY marker is the header; the part below is the kernel body, to which MLX
// adds the signature
//   (const T* x, const uint32_t* w, const S* scales, const S* biases, T* y)
// with x of any rank (rows = every axis but the last, K the last), and the
// compile-time constants T, S,
// MB (a bound on the rows of x: 1, 2, 4 or 8), GS (group size), BITS (4 or
// 8), WARPS (warps per block) and R (output columns per warp; N is a multiple
// of R). Shapes are read at run time, so one compiled kernel serves every
// layer of a model.
//
// One warp computes R consecutive output columns for all M rows of x. Lane l
// reads 16-byte chunks l, l + 32, ... of each of those weight rows, so a warp
// streams 512 contiguous bytes per row and step, with R loads in flight; the
// chunk of x is loaded, converted and summed once for the R rows. A chunk never straddles a quantization group
// (GS is a multiple of the values in a chunk). Each quantized value q is
// turned into the float 1 + q / 16 (4 bits) or 1 + q / 256 (8 bits) by
// placing its bits in the mantissa of 1.0f: two integer instructions instead
// of a quarter-rate integer-to-float conversion. Then
//   sum_k x_k q_k = D * (sum_k x_k f_k - sum_k x_k),  D = 16 or 256.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace mlx_bun_qmv {

template <typename T>
__device__ __forceinline__ float to_f(T v) {
  return static_cast<float>(v);
}

// Eight consecutive values of x starting at p (16-byte aligned for 16-bit
// types, 32-byte aligned for float).
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&out)[8]) {
  if constexpr (sizeof(T) == 2) {
    uint4 v = *reinterpret_cast<const uint4*>(p);
    const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      out[i] = to_f(h[i]);
    }
  } else {
    float4 a = *reinterpret_cast<const float4*>(p);
    float4 b = *reinterpret_cast<const float4*>(p + 4);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
  }
}

// The float 1 + q / 2^BITS for value j of a packed word.
template <int BITS>
__device__ __forceinline__ float unit_plus(uint32_t word, int j) {
  constexpr uint32_t mask = (1u << BITS) - 1u;
  uint32_t q = (word >> (BITS * j)) & mask;
  return __uint_as_float(0x3F800000u | (q << (23 - BITS)));
}

}  // namespace mlx_bun_qmv

// BODY
  using namespace mlx_bun_qmv;
  constexpr int PER_WORD = 32 / BITS;
  constexpr int PER_CHUNK = 4 * PER_WORD;  // values in 16 bytes of weights
  const int N = w_shape[0];
  const int K = w_shape[1] * PER_WORD;
  int M = 1;
  for (int d = 0; d + 1 < x_ndim; ++d) {
    M *= x_shape[d];
  }
  const int CHUNKS = K / PER_CHUNK;
  const int GROUPS = K / GS;
  constexpr float D = static_cast<float>(1 << BITS);
  const int lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * R;
  if (n0 >= N) {
    return;
  }
  const uint4* rows = reinterpret_cast<const uint4*>(w) + static_cast<size_t>(n0) * CHUNKS;
  const S* srows = scales + static_cast<size_t>(n0) * GROUPS;
  const S* brows = biases + static_cast<size_t>(n0) * GROUPS;
  float acc[R][MB];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < MB; ++m) {
      acc[r][m] = 0.0f;
    }
  }
#pragma unroll 2
  for (int c = lane; c < CHUNKS; c += 32) {
    uint4 packed[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      packed[r] = __ldg(rows + static_cast<size_t>(r) * CHUNKS + c);
    }
    const int g = (c * PER_CHUNK) / GS;
    float s[R];
    float b[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      s[r] = to_f(srows[r * GROUPS + g]);
      b[r] = to_f(brows[r * GROUPS + g]);
    }
#pragma unroll
    for (int m = 0; m < MB; ++m) {
      if (m >= M) {
        break;
      }
      const T* xc = x + static_cast<size_t>(m) * K + c * PER_CHUNK;
      float xs[PER_CHUNK];
#pragma unroll
      for (int v = 0; v < PER_CHUNK; v += 8) {
        float part[8];
        load8(xc + v, part);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          xs[v + i] = part[i];
        }
      }
      float sx = 0.0f;
#pragma unroll
      for (int i = 0; i < PER_CHUNK; ++i) {
        sx += xs[i];
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t words[4] = {packed[r].x, packed[r].y, packed[r].z, packed[r].w};
        float fx = 0.0f;
#pragma unroll
        for (int i = 0; i < PER_CHUNK; ++i) {
          fx = fmaf(xs[i], unit_plus<BITS>(words[i / PER_WORD], i % PER_WORD), fx);
        }
        acc[r][m] += s[r] * (D * (fx - sx)) + b[r] * sx;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < MB; ++m) {
      if (m >= M) {
        break;
      }
      float v = acc[r][m];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, off);
      }
      if (lane == 0) {
        y[static_cast<size_t>(m) * N + n0 + r] = static_cast<T>(v);
      }
    }
  }
