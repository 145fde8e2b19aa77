// Quantized matrix times a few vectors by integer dot products: the
// activations are quantized to int8 per 16 elements, so the products are
// sums of (unsigned weight field) x (int8 activation), which AVX-512
// computes 64 at a time.
//
// For output row n, activation row m, weight group g with scale s and bias
// b, its activation groups c of 16 with scale d_c, and the exact activation
// sum X over g:
//
//   y[m, n] = sum_g ( s * sum_{c in g} d_c * sum_{k in c} q[n, k] * xq[m, k] + b * X[m, g] )
//
// This is not MLX's arithmetic (the activations lose precision to int8), so
// it runs only when the settings ask for it (qmv_configure's int8_rows).
//
// Included by one translation unit per instruction set (qmv_int8_vnni.cpp,
// qmv_int8_avx512.cpp); everything has internal linkage. A traits class D
// provides `static __m512i dot(__m512i acc, __m512i u8, __m512i s8)`: acc
// plus, per 32-bit lane, the sum of its four byte products.

#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "qmv.h"

namespace mlx_bun {
namespace {

#if defined(__clang__)
#define QMV_INT8_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define QMV_INT8_UNROLL _Pragma("GCC unroll 16")
#else
#define QMV_INT8_UNROLL
#endif

constexpr int kInt8RowsPerBlock = 4;
constexpr int kInt8MaxActivationRows = 4;

// A row count as a type, for the block lambdas (no standard-library
// templates here: see qmv_impl.h).
template <int N>
struct Int8Rows {
  static constexpr int value = N;
};

// The 64 weight fields of row `row` starting at element `element`, one
// unsigned byte each. 4-bit fields come as the low nibbles of 32 bytes
// (elements 0, 2, ..., 62) then their high nibbles (1, 3, ..., 63); the
// activations are stored in that order (int8_quantize with paired).
template <int BITS>
inline __m512i weight_bytes(const uint8_t* row, size_t element) {
  if constexpr (BITS == 4) {
    const __m512i bytes = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + element / 2)));
    const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    return _mm512_and_si512(_mm512_srlv_epi16(bytes, shifts), _mm512_set1_epi8(0x0F));
  } else {
    return _mm512_loadu_si512(row + element);
  }
}

// The outputs of a block: each accumulator's lanes summed, plus each group's
// bias times the activations' exact sum over it.
template <int NB, int MB>
inline void int8_finish(const QmvArgs& a, const __m512 (&acc)[NB][MB], int n0, int m0) {
  const int groups = a.k / a.group_size;
  QMV_INT8_UNROLL
  for (int i = 0; i < NB; ++i) {
    const float* b = a.biases + static_cast<size_t>(n0 + i) * groups;
    QMV_INT8_UNROLL
    for (int j = 0; j < MB; ++j) {
      const float* x_sums = a.x_sums + static_cast<size_t>(m0 + j) * groups;
      float offset = 0.0f;
      for (int g = 0; g < groups; ++g) offset += b[g] * x_sums[g];
      a.y[static_cast<size_t>(m0 + j) * a.n + n0 + i] = _mm512_reduce_add_ps(acc[i][j]) + offset;
    }
  }
}

template <int BITS>
inline __m512 spread_pair(const float* pair) {
  const __m512i lanes =
      BITS == 4 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1)
                : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m128 two = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(pair)));
  return _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(two));
}

// The four activation scales of a run of 64, each over the lanes that hold
// its 16 elements: with 4-bit weights each 16 is 8 low nibbles and 8 high
// ones (see weight_bytes).
template <int BITS>
inline __m512 spread_quad(const float* four) {
  const __m512i lanes =
      BITS == 4 ? _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3)
                : _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  return _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(_mm_loadu_ps(four)));
}

// NB output rows from n0 times MB activation rows from m0. Each run of 64
// weights holds four groups of 16 activations, each with its own scale, so
// every run's integer sums are scaled lane by lane: by the activations'
// four scales, and by the two weight groups' scales with groups of 32
// (GROUPS32), else by the one group's.
template <class D, int BITS, bool GROUPS32, int NB, int MB>
inline void int8_block(const QmvArgs& a, int n0, int m0) {
  const int groups = a.k / a.group_size;
  const int x_groups = a.k / kInt8ActivationGroup;
  const size_t row_bytes = static_cast<size_t>(a.k) * BITS / 8;
  const uint8_t* w = reinterpret_cast<const uint8_t*>(a.w);
  const uint8_t* rows[NB];
  QMV_INT8_UNROLL
  for (int i = 0; i < NB; ++i) rows[i] = w + static_cast<size_t>(n0 + i) * row_bytes;

  __m512 acc[NB][MB];
  QMV_INT8_UNROLL
  for (int i = 0; i < NB; ++i) {
    QMV_INT8_UNROLL
    for (int j = 0; j < MB; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (int element = 0; element < a.k; element += 64) {
    const int x_group = element / kInt8ActivationGroup;
    __m512i xv[MB];
    __m512 xs[MB];
    QMV_INT8_UNROLL
    for (int j = 0; j < MB; ++j) {
      xv[j] = _mm512_loadu_si512(a.xq + static_cast<size_t>(m0 + j) * a.k + element);
      xs[j] = spread_quad<BITS>(a.xq_scales + static_cast<size_t>(m0 + j) * x_groups + x_group);
    }
    QMV_INT8_UNROLL
    for (int i = 0; i < NB; ++i) {
      const __m512i wv = weight_bytes<BITS>(rows[i], element);
      const float* row_scales = a.scales + static_cast<size_t>(n0 + i) * groups;
      prefetch_row<BITS>(rows[i] + element * BITS / 8);
      if (element % a.group_size == 0) {
        prefetch_group_params<BITS>(row_scales, a.biases + static_cast<size_t>(n0 + i) * groups,
                                    element / a.group_size, a.group_size);
      }
      const __m512 ws = GROUPS32 ? spread_pair<BITS>(row_scales + element / 32)
                                 : _mm512_set1_ps(row_scales[element / a.group_size]);
      QMV_INT8_UNROLL
      for (int j = 0; j < MB; ++j) {
        const __m512 sums = _mm512_cvtepi32_ps(D::dot(_mm512_setzero_si512(), wv, xv[j]));
        acc[i][j] = _mm512_fmadd_ps(_mm512_mul_ps(sums, ws), xs[j], acc[i][j]);
      }
    }
  }
  int8_finish<NB, MB>(a, acc, n0, m0);
}

// Activation rows in steps of MBMAX, then the remainder.
template <int MBMAX, class Block>
inline void activation_blocks(int m, Block block) {
  int m0 = 0;
  for (; m0 + MBMAX <= m; m0 += MBMAX) block(Int8Rows<MBMAX>{}, m0);
  switch (m - m0) {
    case 1:
      block(Int8Rows<1>{}, m0);
      break;
    case 2:
      if constexpr (MBMAX > 2) block(Int8Rows<2>{}, m0);
      break;
    case 3:
      if constexpr (MBMAX > 3) block(Int8Rows<3>{}, m0);
      break;
    default:
      break;
  }
}

template <class D, int BITS, int NB>
inline void int8_rows(const QmvArgs& a, int n0) {
  if (a.group_size == 32) {
    activation_blocks<kInt8MaxActivationRows>(a.m, [&](auto mb, int m0) {
      int8_block<D, BITS, true, NB, decltype(mb)::value>(a, n0, m0);
    });
  } else {
    activation_blocks<kInt8MaxActivationRows>(a.m, [&](auto mb, int m0) {
      int8_block<D, BITS, false, NB, decltype(mb)::value>(a, n0, m0);
    });
  }
}

template <class D, int BITS>
inline void int8_range_bits(const QmvArgs& a, int n0, int n1) {
  int n = n0;
  for (; n + kInt8RowsPerBlock <= n1; n += kInt8RowsPerBlock) {
    int8_rows<D, BITS, kInt8RowsPerBlock>(a, n);
  }
  for (; n < n1; ++n) int8_rows<D, BITS, 1>(a, n);
}

template <class D>
inline void int8_range(const QmvArgs& a, int n0, int n1) {
  if (a.bits == 4) {
    int8_range_bits<D, 4>(a, n0, n1);
  } else {
    int8_range_bits<D, 8>(a, n0, n1);
  }
}

// Quantizes x [m, k] to int8 per kInt8ActivationGroup elements, with one
// scale each (the largest magnitude maps to 127, rounding to nearest even),
// and sums each group of `group_size` (32 or a multiple of 64) exactly as
// given. With `paired`, each run of 64 is stored in the 4-bit weights' order
// (evens, then odds).
inline void int8_quantize(const float* x, int m, int k, int group_size, bool paired, int8_t* xq,
                          float* scales, float* sums) {
  const int groups = k / group_size;
  const int x_groups = k / kInt8ActivationGroup;
  const __m512i even =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd =
      _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int r = 0; r < m; ++r) {
    const float* xr = x + static_cast<size_t>(r) * k;
    float* rs = scales + static_cast<size_t>(r) * x_groups;
    for (int g = 0; g < groups; ++g) {
      __m512 total = _mm512_setzero_ps();
      for (int i = 0; i < group_size; i += 16) {
        total = _mm512_add_ps(total, _mm512_loadu_ps(xr + static_cast<size_t>(g) * group_size + i));
      }
      sums[static_cast<size_t>(r) * groups + g] = _mm512_reduce_add_ps(total);
    }
    for (int c = 0; c < x_groups; ++c) {
      __m512 amax = _mm512_setzero_ps();
      for (int i = 0; i < kInt8ActivationGroup; i += 16) {
        const __m512 v = _mm512_loadu_ps(xr + static_cast<size_t>(c) * kInt8ActivationGroup + i);
        amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
      }
      rs[c] = _mm512_reduce_max_ps(amax) / 127.0f;
    }
    int8_t* out = xq + static_cast<size_t>(r) * k;
    auto quantized = [&](int element) {
      const float d = rs[element / kInt8ActivationGroup];
      const __m512 inverse = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
      return _mm512_mul_ps(_mm512_loadu_ps(xr + element), inverse);
    };
    auto store = [&](__m512 v, int element) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + element),
                       _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
    };
    for (int e = 0; e < k; e += 64) {
      const __m512 v0 = quantized(e);
      const __m512 v1 = quantized(e + 16);
      const __m512 v2 = quantized(e + 32);
      const __m512 v3 = quantized(e + 48);
      if (paired) {
        store(_mm512_permutex2var_ps(v0, even, v1), e);
        store(_mm512_permutex2var_ps(v2, even, v3), e + 16);
        store(_mm512_permutex2var_ps(v0, odd, v1), e + 32);
        store(_mm512_permutex2var_ps(v2, odd, v3), e + 48);
      } else {
        store(v0, e);
        store(v1, e + 16);
        store(v2, e + 32);
        store(v3, e + 48);
      }
    }
  }
}

}  // namespace
}  // namespace mlx_bun
