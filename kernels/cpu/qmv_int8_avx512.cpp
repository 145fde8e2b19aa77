// Integer dot products with AVX-512 BW alone (vpmaddubsw, then vpmaddwd):
// 4-bit weights only, whose byte products in pairs never saturate 16 bits
// (2 x 15 x 127). Built with those target flags and entered only after a
// runtime check (see qmv.cpp).

#if defined(__x86_64__) && defined(__AVX512BW__)

#include "qmv_int8_impl.h"

namespace mlx_bun {
namespace {

struct Avx512Bw {
  static __m512i dot(__m512i acc, __m512i u8, __m512i s8) {
    const __m512i pairs = _mm512_maddubs_epi16(u8, s8);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
  }
};

}  // namespace

void qmv_range_int8_avx512(const QmvArgs& a, int n0, int n1) {
  int8_range<Avx512Bw>(a, n0, n1);
}

void quantize_int8_avx512(const float* x, int m, int k, int group_size, bool paired, int8_t* xq,
                          float* scales, float* sums) {
  int8_quantize(x, m, k, group_size, paired, xq, scales, sums);
}

}  // namespace mlx_bun

#endif
