// Rotate-half RoPE arithmetic shared by the RoPE primitive and the fused
// attention-input primitive, so both give the same numbers: MLX's fallback
// formula for fast::rope, in float32, in its operation order.

#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mlx_bun {

// Cosines and sines of every (batch row, position, frequency): `cs` and `sn`
// [batch, len, dims / 2], positions `starts[b] + l` times `scale`.
// Frequencies are 1 / freqs[i] (stride `freq_stride`) when `freqs` is set,
// else base^(-i / half) as MLX forms them.
inline void rope_tables(
    int batch,
    int len,
    const int* starts,
    int dims,
    float base,
    float scale,
    const float* freqs,
    int64_t freq_stride,
    std::vector<float>& cs,
    std::vector<float>& sn) {
  const int half = dims / 2;
  std::vector<float> inv(half);
  if (freqs != nullptr) {
    for (int i = 0; i < half; ++i) inv[i] = 1.0f / freqs[i * freq_stride];
  } else {
    const float step = std::log(base) / static_cast<float>(half);
    for (int i = 0; i < half; ++i) inv[i] = std::exp(static_cast<float>(-i) * step);
  }
  cs.resize(static_cast<size_t>(batch) * len * half);
  sn.resize(cs.size());
  for (int b = 0; b < batch; ++b) {
    for (int l = 0; l < len; ++l) {
      const float pos = (static_cast<float>(l) + static_cast<float>(starts[b])) * scale;
      const size_t at = (static_cast<size_t>(b) * len + l) * half;
      for (int i = 0; i < half; ++i) {
        const float theta = pos * inv[i];
        cs[at + i] = std::cos(theta);
        sn[at + i] = std::sin(theta);
      }
    }
  }
}

// Rotates one row of `d` features (stride `xs`) by the table entries `c`, `s`
// into `dst` (contiguous); features past `dims` are copied. `inverse`
// rotates by -theta.
inline void rope_row(
    const float* row,
    int64_t xs,
    const float* c,
    const float* s,
    int dims,
    int d,
    bool inverse,
    float* dst) {
  const int half = dims / 2;
  for (int i = 0; i < half; ++i) {
    const float x1 = row[i * xs];
    const float x2 = row[(i + half) * xs];
    if (inverse) {
      dst[i] = x2 * s[i] + x1 * c[i];
      dst[i + half] = x2 * c[i] - x1 * s[i];
    } else {
      dst[i] = x1 * c[i] - x2 * s[i];
      dst[i + half] = x1 * s[i] + x2 * c[i];
    }
  }
  for (int i = dims; i < d; ++i) dst[i] = row[i * xs];
}

}  // namespace mlx_bun
