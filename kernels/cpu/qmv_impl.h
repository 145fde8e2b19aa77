// The quantized matrix-vector kernel body, generic over a SIMD width.
//
// Included by one translation unit per instruction set (qmv_avx512.cpp,
// qmv_avx2.cpp, qmv_neon.cpp, qmv.cpp for scalar), each compiled with its own
// target flags. Everything here has internal linkage (an unnamed namespace),
// so instantiations built with different flags never merge at link time, and
// no standard-library templates are used for the same reason.
//
// A SIMD traits class V provides:
//   using reg;  static constexpr int LANES;   (LANES divides 32)
//   reg zero(); reg load(const float*); reg set1(float); void store(float*, reg);
//   reg fma(reg a, reg b, reg c);             a * b + c
//   float hsum(reg);
//   template <int BITS> void dequant(const uint8_t* chunk, reg s, reg b, reg out[32 / LANES]);
//     out = s * q + b for the 32 quantized values of one chunk, in order.
//   static constexpr bool kNibblePairs;
//     When true, V also provides
//       void dequant_pairs(const uint8_t* chunk, reg s, reg b, reg out[32 / LANES]);
//         the 4-bit chunk's even elements, then its odd ones (each byte's low
//         nibbles, then its high nibbles: cheaper to unpack), and
//       void split_pairs(const float* x, float* out, size_t chunks);
//         every chunk of 32 activations in that same order,
//     and every 4-bit product multiplies paired weights by paired
//     activations (QmvArgs::x_pairs when the caller has them).

#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "qmv.h"

namespace mlx_bun {
namespace {

// Output rows computed together: their dequantized chunks are used for every
// activation row while in registers.
constexpr int kRowsPerBlock = 4;

// The block loops must unroll fully so the accumulators live in registers.
#if defined(__clang__)
#define QMV_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define QMV_UNROLL _Pragma("GCC unroll 32")
#else
#define QMV_UNROLL
#endif

// A row count as a type, for the block lambdas.
template <int N>
struct Rows {
  static constexpr int value = N;
};

// NB output rows starting at n0 times MB activation rows starting at m0.
// Accumulates in float32 over the whole row, like MLX's CPU kernel.
// With PAIRED, a.x holds the activations in V::split_pairs order and the
// weights are unpacked in the same order. CHUNKS is the chunks of 32 per
// group, a constant so the group's loop unrolls.
template <class V, int BITS, int NB, int MB, bool PAIRED, int CHUNKS>
inline void qmv_block(const QmvArgs& a, int n0, int m0) {
  constexpr int kVecs = 32 / V::LANES;
  constexpr int kChunkBytes = 32 * BITS / 8;
  const int groups = a.k / a.group_size;
  constexpr int chunks_per_group = CHUNKS;
  const size_t row_bytes = static_cast<size_t>(a.k) * BITS / 8;
  const uint8_t* w = reinterpret_cast<const uint8_t*>(a.w);
  const float* x = a.x + static_cast<size_t>(m0) * a.k;

  typename V::reg acc[NB][MB];
  QMV_UNROLL
  for (int i = 0; i < NB; ++i) {
    QMV_UNROLL
    for (int j = 0; j < MB; ++j) {
      acc[i][j] = V::zero();
    }
  }
  for (int g = 0; g < groups; ++g) {
    QMV_UNROLL
    for (int cc = 0; cc < chunks_per_group; ++cc) {
      const int c = g * chunks_per_group + cc;
      QMV_UNROLL
      for (int i = 0; i < NB; ++i) {
        const size_t n = static_cast<size_t>(n0 + i);
        typename V::reg d[kVecs];
        const uint8_t* chunk = w + n * row_bytes + static_cast<size_t>(c) * kChunkBytes;
        prefetch_row<BITS>(chunk);
        if (cc == 0) {
          prefetch_group_params<BITS>(a.scales + n * groups, a.biases + n * groups, g,
                                      a.group_size);
        }
        const typename V::reg s = V::set1(a.scales[n * groups + g]);
        const typename V::reg b = V::set1(a.biases[n * groups + g]);
        if constexpr (PAIRED) {
          V::dequant_pairs(chunk, s, b, d);
        } else {
          V::template dequant<BITS>(chunk, s, b, d);
        }
        QMV_UNROLL
        for (int j = 0; j < MB; ++j) {
          const float* xc = x + static_cast<size_t>(j) * a.k + c * 32;
          QMV_UNROLL
          for (int l = 0; l < kVecs; ++l) {
            acc[i][j] = V::fma(d[l], V::load(xc + l * V::LANES), acc[i][j]);
          }
        }
      }
    }
  }
  QMV_UNROLL
  for (int i = 0; i < NB; ++i) {
    QMV_UNROLL
    for (int j = 0; j < MB; ++j) {
      a.y[static_cast<size_t>(m0 + j) * a.n + n0 + i] = V::hsum(acc[i][j]);
    }
  }
}

// Dequantizes NB output rows starting at n0, all of k, into buf ([NB][k]):
// the values qmv_block computes in registers, for blocks of many activation
// rows to read instead of dequantizing the same weights again per block.
template <class V, int BITS, int NB, bool PAIRED>
inline void dequant_rows(const QmvArgs& a, int n0, float* buf) {
  constexpr int kVecs = 32 / V::LANES;
  constexpr int kChunkBytes = 32 * BITS / 8;
  const int groups = a.k / a.group_size;
  const int chunks_per_group = a.group_size / 32;
  const size_t row_bytes = static_cast<size_t>(a.k) * BITS / 8;
  const uint8_t* w = reinterpret_cast<const uint8_t*>(a.w);
  for (int i = 0; i < NB; ++i) {
    const size_t n = static_cast<size_t>(n0 + i);
    float* out = buf + static_cast<size_t>(i) * a.k;
    for (int g = 0; g < groups; ++g) {
      const typename V::reg s = V::set1(a.scales[n * groups + g]);
      const typename V::reg b = V::set1(a.biases[n * groups + g]);
      for (int cc = 0; cc < chunks_per_group; ++cc) {
        const int c = g * chunks_per_group + cc;
        typename V::reg d[kVecs];
        const uint8_t* chunk = w + n * row_bytes + static_cast<size_t>(c) * kChunkBytes;
        if constexpr (PAIRED) {
          V::dequant_pairs(chunk, s, b, d);
        } else {
          V::template dequant<BITS>(chunk, s, b, d);
        }
        QMV_UNROLL
        for (int l = 0; l < kVecs; ++l) {
          V::store(out + c * 32 + l * V::LANES, d[l]);
        }
      }
    }
  }
}

// qmv_block over weights dequantized by dequant_rows: the same products
// accumulated in the same order, so the same results.
template <class V, int NB, int MB>
inline void qmv_block_dequantized(const QmvArgs& a, const float* buf, int n0, int m0) {
  constexpr int kVecs = 32 / V::LANES;
  const float* x = a.x + static_cast<size_t>(m0) * a.k;
  typename V::reg acc[NB][MB];
  QMV_UNROLL
  for (int i = 0; i < NB; ++i) {
    QMV_UNROLL
    for (int j = 0; j < MB; ++j) {
      acc[i][j] = V::zero();
    }
  }
  const int chunks = a.k / 32;
  for (int c = 0; c < chunks; ++c) {
    QMV_UNROLL
    for (int l = 0; l < kVecs; ++l) {
      typename V::reg d[NB];
      QMV_UNROLL
      for (int i = 0; i < NB; ++i) {
        d[i] = V::load(buf + static_cast<size_t>(i) * a.k + c * 32 + l * V::LANES);
      }
      QMV_UNROLL
      for (int j = 0; j < MB; ++j) {
        const typename V::reg xv = V::load(x + static_cast<size_t>(j) * a.k + c * 32 + l * V::LANES);
        QMV_UNROLL
        for (int i = 0; i < NB; ++i) {
          acc[i][j] = V::fma(d[i], xv, acc[i][j]);
        }
      }
    }
  }
  QMV_UNROLL
  for (int i = 0; i < NB; ++i) {
    QMV_UNROLL
    for (int j = 0; j < MB; ++j) {
      a.y[static_cast<size_t>(m0 + j) * a.n + n0 + i] = V::hsum(acc[i][j]);
    }
  }
}

// A buffer of this thread's, one per SLOT, grown as needed; null when
// memory runs out.
enum BufferSlot { kDequantizedRows, kPairedActivations };

template <BufferSlot SLOT>
inline float* thread_buffer(size_t floats) {
  static thread_local float* buf = nullptr;
  static thread_local size_t capacity = 0;
  if (floats > capacity) {
    std::free(buf);
    buf = static_cast<float*>(std::malloc(floats * sizeof(float)));
    capacity = buf == nullptr ? 0 : floats;
  }
  return buf;
}

template <class V, int BITS, int NB, int MBMAX, bool PAIRED>
inline void qmv_rows(const QmvArgs& a, int n0) {
  // More activation rows than one block takes: dequantize once for all.
  float* buf =
      a.m > MBMAX ? thread_buffer<kDequantizedRows>(static_cast<size_t>(NB) * a.k) : nullptr;
  if (buf != nullptr) {
    dequant_rows<V, BITS, NB, PAIRED>(a, n0, buf);
  }
  auto block = [&](auto mb, int m0) {
    constexpr int MB = decltype(mb)::value;
    if (buf != nullptr) {
      qmv_block_dequantized<V, NB, MB>(a, buf, n0, m0);
    } else {
      switch (a.group_size) {
        case 32:
          qmv_block<V, BITS, NB, MB, PAIRED, 1>(a, n0, m0);
          break;
        case 64:
          qmv_block<V, BITS, NB, MB, PAIRED, 2>(a, n0, m0);
          break;
        default:
          qmv_block<V, BITS, NB, MB, PAIRED, 4>(a, n0, m0);
          break;
      }
    }
  };
  int m0 = 0;
  for (; m0 + MBMAX <= a.m; m0 += MBMAX) {
    block(Rows<MBMAX>{}, m0);
  }
  switch (a.m - m0) {
    case 1:
      block(Rows<1>{}, m0);
      break;
    case 2:
      if constexpr (MBMAX > 2) block(Rows<2>{}, m0);
      break;
    case 3:
      if constexpr (MBMAX > 3) block(Rows<3>{}, m0);
      break;
    default:
      break;
  }
}

template <class V, int BITS, int MBMAX, bool PAIRED>
inline void qmv_range_rows(const QmvArgs& a, int n0, int n1) {
  int n = n0;
  for (; n + kRowsPerBlock <= n1; n += kRowsPerBlock) {
    qmv_rows<V, BITS, kRowsPerBlock, MBMAX, PAIRED>(a, n);
  }
  for (; n < n1; ++n) {
    qmv_rows<V, BITS, 1, MBMAX, PAIRED>(a, n);
  }
}

template <class V, int BITS, int MBMAX>
inline void qmv_range_bits(const QmvArgs& a, int n0, int n1) {
  if constexpr (BITS == 4 && V::kNibblePairs) {
    const float* paired = a.x_pairs;
    if (paired == nullptr) {
      const size_t floats = static_cast<size_t>(a.m) * a.k;
      float* split = thread_buffer<kPairedActivations>(floats);
      if (split != nullptr) V::split_pairs(a.x, split, floats / 32);
      paired = split;
    }
    if (paired != nullptr) {
      QmvArgs with_pairs = a;
      with_pairs.x = paired;
      qmv_range_rows<V, BITS, MBMAX, true>(with_pairs, n0, n1);
      return;
    }
  }
  qmv_range_rows<V, BITS, MBMAX, false>(a, n0, n1);
}

template <class V, int MBMAX>
inline void qmv_range_generic(const QmvArgs& a, int n0, int n1) {
  if (a.bits == 4) {
    qmv_range_bits<V, 4, MBMAX>(a, n0, n1);
  } else {
    qmv_range_bits<V, 8, MBMAX>(a, n0, n1);
  }
}

}  // namespace
}  // namespace mlx_bun
