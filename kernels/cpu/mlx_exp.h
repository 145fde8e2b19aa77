// MLX's CPU exponential, shared by the primitives whose numbers follow
// MLX's softmax and logsumexp (defined in log_softmax.cpp, which is built so
// that it runs in SIMD lanes).

#pragma once

#include <cstdint>

namespace mlx_bun {

// out[i] = exp(x[i] - shift) as MLX 0.32's CPU `exp` computes it: 2^round(y)
// times a polynomial in the rest of y = (x[i] - shift) * log2(e), NaN kept,
// 0 below -88 and infinity above 88. `out` may be `x`.
void mlx_shifted_exp(const float* x, float shift, float* out, int64_t n);

}  // namespace mlx_bun
