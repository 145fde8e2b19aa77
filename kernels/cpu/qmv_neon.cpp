// The kernel for aarch64 (NEON is part of the base instruction set).

#if defined(__aarch64__)

#include <arm_neon.h>

#include "qmv_impl.h"

namespace mlx_bun {
namespace {

struct Neon {
  using reg = float32x4_t;
  static constexpr int LANES = 4;
  static constexpr bool kNibblePairs = false;
  static reg zero() { return vdupq_n_f32(0.0f); }
  static reg load(const float* p) { return vld1q_f32(p); }
  static reg set1(float v) { return vdupq_n_f32(v); }
  static void store(float* p, reg v) { vst1q_f32(p, v); }
  static reg fma(reg a, reg b, reg c) { return vfmaq_f32(c, a, b); }
  static float hsum(reg v) { return vaddvq_f32(v); }

  // Sixteen bytes, in order, to s * q + b.
  static void widen16(uint8x16_t bytes, reg s, reg b, reg out[4]) {
    const uint16x8_t lo = vmovl_u8(vget_low_u8(bytes));
    const uint16x8_t hi = vmovl_u8(vget_high_u8(bytes));
    out[0] = vfmaq_f32(b, vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), s);
    out[1] = vfmaq_f32(b, vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo))), s);
    out[2] = vfmaq_f32(b, vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), s);
    out[3] = vfmaq_f32(b, vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi))), s);
  }

  template <int BITS>
  static void dequant(const uint8_t* p, reg s, reg b, reg out[8]) {
    const uint8x16_t v = vld1q_u8(p);
    if constexpr (BITS == 4) {
      // Byte i holds element 2i in its low and 2i+1 in its high nibble.
      const uint8x16_t lo = vandq_u8(v, vdupq_n_u8(0x0F));
      const uint8x16_t hi = vshrq_n_u8(v, 4);
      widen16(vzip1q_u8(lo, hi), s, b, out);
      widen16(vzip2q_u8(lo, hi), s, b, out + 4);
    } else {
      widen16(v, s, b, out);
      widen16(vld1q_u8(p + 16), s, b, out + 4);
    }
  }
};

}  // namespace

void qmv_range_neon(const QmvArgs& a, int n0, int n1) {
  qmv_range_generic<Neon, 2>(a, n0, n1);
}

}  // namespace mlx_bun

#endif
