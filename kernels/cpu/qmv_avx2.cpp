// The kernel for x86-64 with AVX2 and FMA; built with those target flags and
// entered only after a runtime check (see qmv.cpp).

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)

#include <immintrin.h>

#include "qmv_impl.h"

namespace mlx_bun {
namespace {

struct Avx2 {
  using reg = __m256;
  static constexpr int LANES = 8;
  static constexpr bool kNibblePairs = false;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static reg set1(float v) { return _mm256_set1_ps(v); }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum(reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }

  // Eight bytes (the low half of `bytes`) to s * q + b.
  static reg widen(__m128i bytes, reg s, reg b) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), s, b);
  }

  static void widen16(__m128i bytes, reg s, reg b, reg out[2]) {
    out[0] = widen(bytes, s, b);
    out[1] = widen(_mm_srli_si128(bytes, 8), s, b);
  }

  template <int BITS>
  static void dequant(const uint8_t* p, reg s, reg b, reg out[4]) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (BITS == 4) {
      // Byte i holds element 2i in its low and 2i+1 in its high nibble.
      const __m128i mask = _mm_set1_epi8(0x0F);
      const __m128i lo = _mm_and_si128(v, mask);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
      widen16(_mm_unpacklo_epi8(lo, hi), s, b, out);
      widen16(_mm_unpackhi_epi8(lo, hi), s, b, out + 2);
    } else {
      widen16(v, s, b, out);
      widen16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)), s, b, out + 2);
    }
  }
};

}  // namespace

void qmv_range_avx2(const QmvArgs& a, int n0, int n1) {
  qmv_range_generic<Avx2, 2>(a, n0, n1);
}

}  // namespace mlx_bun

#endif
