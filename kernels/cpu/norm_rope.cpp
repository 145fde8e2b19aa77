// RMSNorm and RoPE as single CPU primitives.
//
// MLX 0.32 has no CPU kernels for fast::rms_norm and fast::rope: on the CPU
// they expand into their fallback graphs, about 8 and 20 operations each, and
// at a few microseconds of bookkeeping per operation that costs more than
// the arithmetic of a decode step. These primitives compute the same
// formulas as those fallbacks (same operation order, float32) in one node.

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/private/array.h"
#include "mlx/fast.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"

#include "mlx_bun_kernels.h"
#include "rope.h"

namespace mx = mlx::core;

namespace mlx_bun {

extern thread_local std::string last_error;

namespace {

// Offset in elements of row `r` (all axes but the last) of `x`.
int64_t row_offset(const mx::array& x, size_t r) {
  const auto& shape = x.shape();
  const auto& strides = x.strides();
  int64_t offset = 0;
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    offset += static_cast<int64_t>(r % shape[d]) * strides[d];
    r /= shape[d];
  }
  return offset;
}

class CpuRmsNorm : public mx::UnaryPrimitive {
 public:
  CpuRmsNorm(mx::Stream stream, float eps) : mx::UnaryPrimitive(stream), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(inputs[0]);
    encoder.set_input_array(inputs[1]);
    encoder.set_output_array(out);
    encoder.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]),
                      w = mx::array::unsafe_weak_copy(inputs[1]),
                      y = out.data<float>(),
                      eps = eps_]() {
      const int d = x.shape(-1);
      const int64_t xs = x.strides().back();
      const int64_t ws = w.strides().back();
      const size_t rows = x.size() / d;
      const float* xp = x.data<float>();
      const float* wp = w.data<float>();
      // mean(x^2) as MLX's mean: the sum times 1/d.
      const float normalizer = static_cast<float>(1.0 / d);
      for (size_t r = 0; r < rows; ++r) {
        const float* row = xp + row_offset(x, r);
        float sum = 0.0f;
        for (int i = 0; i < d; ++i) {
          const float v = row[i * xs];
          sum += v * v;
        }
        const float n = 1.0f / std::sqrt(sum * normalizer + eps);
        float* dst = y + r * d;
        for (int i = 0; i < d; ++i) {
          dst[i] = wp[i * ws] * (row[i * xs] * n);
        }
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("[mlx_bun_cpu_rms_norm] runs on the CPU only");
  }

  // Gradients through MLX's own formulation.
  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>&) override {
    const float eps = eps_;
    auto s = stream();
    auto fun = [eps, s](const std::vector<mx::array>& in) {
      return std::vector<mx::array>{mx::fast::rms_norm(in[0], in[1], eps, s)};
    };
    auto grads = mx::vjp(fun, primals, cotangents).second;
    std::vector<mx::array> out;
    for (int a : argnums) out.push_back(grads[a]);
    return out;
  }

  const char* name() const override {
    return "MlxBunCpuRmsNorm";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const CpuRmsNorm&>(other).eps_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  float eps_;
};

// Non-traditional (rotate-half) RoPE over the last axis, positions along the
// second-to-last, starting at `offset`, or, with `per_row`, at each batch
// row's own offset (an int32 input [B] after `freqs`; x is [B, ..., L, d]).
// `inverse` rotates by -theta (the VJP). A row's numbers are the same
// whether it is rotated alone or in a batch.
class CpuRope : public mx::UnaryPrimitive {
 public:
  CpuRope(
      mx::Stream stream,
      int dims,
      float base,
      float scale,
      int offset,
      bool inverse,
      bool has_freqs,
      bool per_row)
      : mx::UnaryPrimitive(stream),
        dims_(dims),
        base_(base),
        scale_(scale),
        offset_(offset),
        inverse_(inverse),
        has_freqs_(has_freqs),
        per_row_(per_row) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    encoder.set_output_array(out);
    const bool has_freqs = has_freqs_;
    const bool per_row = per_row_;
    encoder.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]),
                      freqs = mx::array::unsafe_weak_copy(inputs[has_freqs ? 1 : 0]),
                      offsets = mx::array::unsafe_weak_copy(inputs[per_row ? inputs.size() - 1 : 0]),
                      has_freqs,
                      per_row,
                      y = out.data<float>(),
                      dims = dims_,
                      base = base_,
                      scale = scale_,
                      offset = offset_,
                      inverse = inverse_]() {
      const int nd = x.ndim();
      const int d = x.shape(-1);
      const int len = nd >= 2 ? x.shape(-2) : 1;
      const int half = dims / 2;
      // Starting position of each batch row (one shared offset unless per_row).
      const int batch = per_row ? x.shape(0) : 1;
      std::vector<int> starts(batch, offset);
      if (per_row) {
        const int32_t* o = offsets.data<int32_t>();
        const int64_t os = offsets.strides().back();
        for (int b = 0; b < batch; ++b) starts[b] = o[b * os];
      }
      std::vector<float> cs, sn;
      rope_tables(
          batch,
          len,
          starts.data(),
          dims,
          base,
          scale,
          has_freqs ? freqs.data<float>() : nullptr,
          has_freqs ? freqs.strides().back() : 0,
          cs,
          sn);
      const int64_t xs = x.strides().back();
      const float* xp = x.data<float>();
      const size_t rows = x.size() / d;
      const size_t rows_per_batch = rows / batch;
      for (size_t r = 0; r < rows; ++r) {
        const size_t table = (r / rows_per_batch) * len + r % len;
        rope_row(
            xp + row_offset(x, r),
            xs,
            cs.data() + table * half,
            sn.data() + table * half,
            dims,
            d,
            inverse,
            y + r * d);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("[mlx_bun_cpu_rope] runs on the CPU only");
  }

  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>&) override {
    std::vector<mx::array> grads;
    for (int a : argnums) {
      if (a != 0) {
        throw std::invalid_argument("[mlx_bun_cpu_rope] gradients only with respect to x");
      }
      std::vector<mx::array> in{cotangents[0]};
      for (size_t i = 1; i < primals.size(); ++i) in.push_back(primals[i]);
      grads.push_back(mx::array(
          cotangents[0].shape(),
          mx::float32,
          std::make_shared<CpuRope>(
              stream(), dims_, base_, scale_, offset_, !inverse_, has_freqs_, per_row_),
          std::move(in)));
    }
    return grads;
  }

  const char* name() const override {
    return "MlxBunCpuRope";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const CpuRope&>(other);
    return dims_ == o.dims_ && base_ == o.base_ && scale_ == o.scale_ &&
        offset_ == o.offset_ && inverse_ == o.inverse_ && has_freqs_ == o.has_freqs_ &&
        per_row_ == o.per_row_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  int dims_;
  float base_;
  float scale_;
  int offset_;
  bool inverse_;
  bool has_freqs_;
  bool per_row_;
};

}  // namespace
}  // namespace mlx_bun

extern "C" int mlx_bun_cpu_rms_norm(mlx_array* res, mlx_array x, mlx_array weight, float eps) {
  try {
    const auto& xa = mlx_array_get_(x);
    const auto& wa = mlx_array_get_(weight);
    if (xa.dtype() != mx::float32 || wa.dtype() != mx::float32 || xa.ndim() < 1 ||
        wa.ndim() != 1 || wa.shape(0) != xa.shape(-1)) {
      throw std::invalid_argument(
          "[mlx_bun_cpu_rms_norm] needs float32 x [..., d] and weight [d]");
    }
    mlx_array_set_(
        *res,
        mx::array(
            xa.shape(),
            mx::float32,
            std::make_shared<mlx_bun::CpuRmsNorm>(mx::default_stream(mx::Device::cpu), eps),
            {xa, wa}));
    return 0;
  } catch (const std::exception& e) {
    mlx_bun::last_error = e.what();
    return 1;
  }
}

extern "C" int mlx_bun_cpu_rope(
    mlx_array* res,
    mlx_array x,
    int dims,
    float base,
    float scale,
    int offset,
    mlx_array freqs,
    mlx_array offsets) {
  try {
    const auto& xa = mlx_array_get_(x);
    if (xa.dtype() != mx::float32 || xa.ndim() < 2 || dims <= 0 || dims % 2 != 0 ||
        dims > xa.shape(-1)) {
      throw std::invalid_argument(
          "[mlx_bun_cpu_rope] needs float32 x [..., L, d] and even dims <= d");
    }
    std::vector<mx::array> inputs{xa};
    const bool has_freqs = freqs.ctx != nullptr;
    if (has_freqs) {
      const auto& fa = mlx_array_get_(freqs);
      if (fa.dtype() != mx::float32 || fa.ndim() != 1 || fa.shape(0) != dims / 2) {
        throw std::invalid_argument("[mlx_bun_cpu_rope] freqs must be float32 [dims / 2]");
      }
      inputs.push_back(fa);
    }
    const bool per_row = offsets.ctx != nullptr;
    if (per_row) {
      const auto& oa = mlx_array_get_(offsets);
      if (oa.dtype() != mx::int32 || oa.ndim() != 1 || xa.ndim() < 3 ||
          oa.shape(0) != xa.shape(0)) {
        throw std::invalid_argument(
            "[mlx_bun_cpu_rope] per-row offsets must be int32 [B] for x [B, ..., L, d]");
      }
      inputs.push_back(oa);
    }
    mlx_array_set_(
        *res,
        mx::array(
            xa.shape(),
            mx::float32,
            std::make_shared<mlx_bun::CpuRope>(
                mx::default_stream(mx::Device::cpu),
                dims,
                base,
                scale,
                offset,
                false,
                has_freqs,
                per_row),
            std::move(inputs)));
    return 0;
  } catch (const std::exception& e) {
    mlx_bun::last_error = e.what();
    return 1;
  }
}
