// The kernel for x86-64 with AVX-512 (F + BW + VL); built with those target
// flags and entered only after a runtime check (see qmv.cpp).

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__)

#include <immintrin.h>

#include "qmv_impl.h"

namespace mlx_bun {
namespace {

struct Avx512 {
  using reg = __m512;
  static constexpr int LANES = 16;
  static constexpr bool kNibblePairs = true;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static reg set1(float v) { return _mm512_set1_ps(v); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static float hsum(reg v) { return _mm512_reduce_add_ps(v); }

  static reg widen(__m128i bytes, reg s, reg b) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)), s, b);
  }

  template <int BITS>
  static void dequant(const uint8_t* p, reg s, reg b, reg out[2]) {
    if constexpr (BITS == 4) {
      // A 16-entry table of s * q + b, indexed by each nibble: the words are
      // spread so each lane holds the word of its element, shifted so the
      // nibble is in the lane's low four bits, the only bits vpermps reads.
      // Element j of a word sits in bits [4j, 4j + 4).
      const reg table = _mm512_fmadd_ps(
          _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), s, b);
      const __m512i words =
          _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      const __m512i shifts =
          _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
      const __m512i first = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
      const __m512i second = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
      out[0] = _mm512_permutexvar_ps(
          _mm512_srlv_epi32(_mm512_permutexvar_epi32(first, words), shifts), table);
      out[1] = _mm512_permutexvar_ps(
          _mm512_srlv_epi32(_mm512_permutexvar_epi32(second, words), shifts), table);
    } else {
      const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
      out[0] = widen(v0, s, b);
      out[1] = widen(v1, s, b);
    }
  }

  // One byte per lane; the table reads the low four bits of each lane, so
  // the low nibbles need no mask.
  static void dequant_pairs(const uint8_t* p, reg s, reg b, reg out[2]) {
    const reg table = _mm512_fmadd_ps(
        _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), s, b);
    const __m512i bytes =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    out[0] = _mm512_permutexvar_ps(bytes, table);
    out[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
  }

  static void split_pairs(const float* x, float* out, size_t chunks) {
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd =
        _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    for (size_t c = 0; c < chunks; ++c) {
      const reg lo = _mm512_loadu_ps(x + c * 32);
      const reg hi = _mm512_loadu_ps(x + c * 32 + 16);
      _mm512_storeu_ps(out + c * 32, _mm512_permutex2var_ps(lo, even, hi));
      _mm512_storeu_ps(out + c * 32 + 16, _mm512_permutex2var_ps(lo, odd, hi));
    }
  }
};

}  // namespace

void qmv_range_avx512(const QmvArgs& a, int n0, int n1) {
  qmv_range_generic<Avx512, 4>(a, n0, n1);
}

void split_pairs_avx512(const float* x, float* out, size_t chunks) {
  Avx512::split_pairs(x, out, chunks);
}

}  // namespace mlx_bun

#endif
