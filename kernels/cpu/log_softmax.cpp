// Log-probabilities over the last axis as one CPU primitive:
//
//   out = x - logsumexp(x)
//
// with the numbers of MLX 0.32's CPU `logsumexp` followed by its subtraction,
// bit for bit. On x86-64 MLX's CPU backend evaluates logsumexp one element
// at a time: its polynomial `exp` with a library call per `fma`, over every
// entry of the vocabulary, for every sampled token. Here the exponentials of
// a row are computed in SIMD lanes with the same operations (the same
// polynomial, each `fma` fused, each product and sum rounded on its own: this
// file is built without contraction), and only their sum runs in MLX's order,
// one element after another.

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/private/array.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"

#include "mlx_bun_kernels.h"
#include "mlx_exp.h"

namespace mx = mlx::core;

namespace mlx_bun {

extern thread_local std::string last_error;

namespace {

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define MLX_BUN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MLX_BUN_CLONES
#endif

// MLX's CPU `exp` of `v - shift`: 2^round(y) times a polynomial in the rest
// of y = (v - shift) * log2(e), with its handling of NaN and of |x| > 88.
MLX_BUN_CLONES void shifted_exp(const float* x, float shift, float* out, int64_t n) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] - shift;
    const float y = v * 1.442695f;
    // floor(y + 0.5) as MLX takes it (in double, so exactly): y - floor(y)
    // is exact in float, and so is its comparison with one half.
    const float below = std::floor(y);
    const float whole = y - below >= 0.5f ? below + 1.0f : below;
    const float part = y - whole;
    float p = 1.535336188319500e-4f;
    p = std::fma(p, part, 1.339887440266574e-3f);
    p = std::fma(p, part, 9.618437357674640e-3f);
    p = std::fma(p, part, 5.550332471162809e-2f);
    p = std::fma(p, part, 2.402264791363012e-1f);
    p = std::fma(p, part, 6.931472028550421e-1f);
    p = std::fma(p, part, 1.000000000000000f);
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(whole) + 127) << 23;
    float r = std::bit_cast<float>(bits) * p;
    r = v != v ? v : r;
    r = v > 88.0f ? inf : r;
    r = v < -88.0f ? 0.0f : r;
    out[i] = r;
  }
}

MLX_BUN_CLONES void subtract(const float* x, float c, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] - c;
}

// One row of `n` contiguous entries.
void log_softmax_row(const float* x, float* out, int64_t n, std::vector<float>& exps) {
  // The maximum as MLX's: the first NaN sticks.
  float maximum = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    nan |= x[i] != x[i];
    maximum = x[i] > maximum ? x[i] : maximum;
  }
  if (nan) maximum = std::numeric_limits<float>::quiet_NaN();
  exps.resize(n);
  shifted_exp(x, maximum, exps.data(), n);
  float normalizer = 0.0f;
  for (int64_t i = 0; i < n; ++i) normalizer += exps[i];
  const float lse = std::isinf(maximum) ? maximum : std::log(normalizer) + maximum;
  subtract(x, lse, out, n);
}

class CpuLogSoftmax : public mx::UnaryPrimitive {
 public:
  explicit CpuLogSoftmax(mx::Stream stream) : mx::UnaryPrimitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(inputs[0]);
    encoder.set_output_array(out);
    encoder.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]), y = out.data<float>()]() {
      const int64_t n = x.shape(-1);
      if (n == 0) return;
      const size_t rows = x.size() / n;
      const auto& shape = x.shape();
      const auto& strides = x.strides();
      thread_local std::vector<float> exps;
      thread_local std::vector<float> gathered;
      for (size_t r = 0; r < rows; ++r) {
        int64_t offset = 0;
        size_t rest = r;
        for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
          offset += static_cast<int64_t>(rest % shape[d]) * strides[d];
          rest /= shape[d];
        }
        const float* row = x.data<float>() + offset;
        if (strides.back() != 1) {
          gathered.resize(n);
          for (int64_t i = 0; i < n; ++i) gathered[i] = row[i * strides.back()];
          row = gathered.data();
        }
        log_softmax_row(row, y + r * n, n, exps);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("[mlx_bun_cpu_log_softmax] runs on the CPU only");
  }

  // Gradients through MLX's own formulation.
  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>&) override {
    auto s = stream();
    auto fun = [s](const std::vector<mx::array>& in) {
      return std::vector<mx::array>{
          mx::subtract(in[0], mx::logsumexp(in[0], -1, true, s), s)};
    };
    auto grads = mx::vjp(fun, primals, cotangents).second;
    std::vector<mx::array> result;
    for (int a : argnums) result.push_back(grads[a]);
    return result;
  }

  const char* name() const override {
    return "MlxBunCpuLogSoftmax";
  }
  bool is_equivalent(const mx::Primitive&) const override {
    return true;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }
};

}  // namespace

void mlx_shifted_exp(const float* x, float shift, float* out, int64_t n) {
  shifted_exp(x, shift, out, n);
}

}  // namespace mlx_bun

extern "C" int mlx_bun_cpu_log_softmax(mlx_array* res, mlx_array x) {
  try {
    const auto& xa = mlx_array_get_(x);
    if (xa.dtype() != mx::float32 || xa.ndim() < 1) {
      throw std::invalid_argument("[mlx_bun_cpu_log_softmax] needs float32 x [..., n]");
    }
    mlx_array_set_(
        *res,
        mx::array(
            xa.shape(),
            mx::float32,
            std::make_shared<mlx_bun::CpuLogSoftmax>(mx::default_stream(mx::Device::cpu)),
            {xa}));
    return 0;
  } catch (const std::exception& e) {
    mlx_bun::last_error = e.what();
    return 1;
  }
}
