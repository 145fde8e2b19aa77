// Integer dot products with AVX-512 VNNI (vpdpbusd): 4- and 8-bit weights.
// Built with those target flags and entered only after a runtime check
// (see qmv.cpp).

#if defined(__x86_64__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)

#include "qmv_int8_impl.h"

namespace mlx_bun {
namespace {

struct Vnni {
  static __m512i dot(__m512i acc, __m512i u8, __m512i s8) {
    return _mm512_dpbusd_epi32(acc, u8, s8);
  }
};

}  // namespace

void qmv_range_int8_vnni(const QmvArgs& a, int n0, int n1) {
  int8_range<Vnni>(a, n0, n1);
}

void quantize_int8_vnni(const float* x, int m, int k, int group_size, bool paired, int8_t* xq,
                        float* scales, float* sums) {
  int8_quantize(x, m, k, group_size, paired, xq, scales, sums);
}

}  // namespace mlx_bun

#endif
