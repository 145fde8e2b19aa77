// The CPU quantized matmul as an MLX primitive, and its C interface.
//
// The primitive's eval_cpu allocates the output and queues the kernel on the
// CPU stream's command encoder, like MLX's own CPU primitives, so it runs in
// order with the rest of the graph on MLX's worker thread (which then shares
// the work with the kernel's helper threads).

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/private/array.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"

#include "mlx_bun_kernels.h"
#include "qmv.h"

namespace mx = mlx::core;

namespace mlx_bun {
namespace {

}  // namespace

thread_local std::string last_error;

// Copies the rows of a float32 array with any strides into a packed
// [rows, k] buffer.
void pack_rows(const mx::array& x, float* dst) {
  const auto& shape = x.shape();
  const auto& strides = x.strides();
  const int nd = static_cast<int>(shape.size());
  const int k = shape[nd - 1];
  const int64_t ks = strides[nd - 1];
  const size_t rows = x.size() / k;
  const float* src = x.data<float>();
  for (size_t r = 0; r < rows; ++r) {
    int64_t offset = 0;
    size_t rest = r;
    for (int d = nd - 2; d >= 0; --d) {
      offset += static_cast<int64_t>(rest % shape[d]) * strides[d];
      rest /= shape[d];
    }
    for (int i = 0; i < k; ++i) {
      dst[r * k + i] = src[offset + i * ks];
    }
  }
}

// y[i] += r[i] over r's elements in row-major order, r float32 with any strides.
void add_rows(const mx::array& r, float* y) {
  if (r.flags().row_contiguous) {
    const float* src = r.data<float>();
    for (size_t i = 0; i < r.size(); ++i) y[i] = y[i] + src[i];
    return;
  }
  std::vector<float> packed(r.size());
  pack_rows(r, packed.data());
  for (size_t i = 0; i < packed.size(); ++i) y[i] = y[i] + packed[i];
}

namespace {

// y = x @ dequantize(w).T, plus `residual` (a fifth input of y's shape) when
// the primitive has one: the residual stream's add in the same node, each
// value rounded as MLX's `Add` rounds it.
class CpuQuantizedMatmul : public mx::UnaryPrimitive {
 public:
  CpuQuantizedMatmul(mx::Stream stream, int group_size, int bits, bool residual)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits), residual_(residual) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto& x = inputs[0];
    const auto& w = inputs[1];
    const auto& scales = inputs[2];
    const auto& biases = inputs[3];
    for (const auto* a : {&w, &scales, &biases}) {
      if (!a->flags().row_contiguous) {
        throw std::runtime_error(
            "[mlx_bun_cpu_qmm] quantized weights, scales and biases must be contiguous");
      }
    }
    out.set_data(mx::allocator::malloc(out.nbytes()));
    const int k = x.shape(-1);
    const int n = w.shape(0);
    const int m = static_cast<int>(x.size() / k);
    if (m == 0 || n == 0) {
      return;
    }
    QmvArgs args{
        nullptr,
        w.data<uint32_t>(),
        scales.data<float>(),
        biases.data<float>(),
        out.data<float>(),
        m,
        n,
        k,
        group_size_,
        bits_};
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    std::optional<mx::array> residual;
    if (residual_) residual = mx::array::unsafe_weak_copy(inputs[4]);
    encoder.dispatch([args, x = mx::array::unsafe_weak_copy(x), residual]() mutable {
      std::vector<float> packed;
      if (x.flags().row_contiguous) {
        args.x = x.data<float>();
      } else {
        packed.resize(x.size());
        pack_rows(x, packed.data());
        args.x = packed.data();
      }
      qmv(args);
      if (residual) add_rows(*residual, args.y);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("[mlx_bun_cpu_qmm] runs on the CPU only");
  }

  // The gradient with respect to x, for adapters trained over quantized
  // layers: the cotangent times the (dequantized) weight, by MLX's op.
  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>&) override {
    std::vector<mx::array> grads;
    for (int arg : argnums) {
      if (arg == 4 && residual_) {
        grads.push_back(cotangents[0]);
        continue;
      }
      if (arg != 0) {
        throw std::invalid_argument(
            "[mlx_bun_cpu_qmm] gradients only with respect to the activations");
      }
      grads.push_back(mx::quantized_matmul(
          cotangents[0],
          primals[1],
          primals[2],
          primals[3],
          false,
          group_size_,
          bits_,
          "affine",
          stream()));
    }
    return grads;
  }

  const char* name() const override {
    return "MlxBunCpuQuantizedMatmul";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const CpuQuantizedMatmul&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_ && residual_ == o.residual_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    auto shape = inputs[0].shape();
    shape.back() = inputs[1].shape(0);
    return {shape};
  }

 private:
  int group_size_;
  int bits_;
  bool residual_;
};

// silu(x @ gate.T) * (x @ up.T) for two quantized layers of the same shape:
// both products in one split over the kernel's threads, then the gate's
// activation, each value rounded as MLX's unfused ops round it
// (gate * sigmoid(gate), times up).
class CpuQuantizedSiluGlu : public mx::UnaryPrimitive {
 public:
  CpuQuantizedSiluGlu(mx::Stream stream, int group_size, int bits)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    for (size_t i = 1; i < inputs.size(); ++i) {
      if (!inputs[i].flags().row_contiguous) {
        throw std::runtime_error(
            "[mlx_bun_cpu_silu_glu] quantized weights, scales and biases must be contiguous");
      }
    }
    out.set_data(mx::allocator::malloc(out.nbytes()));
    const auto& x = inputs[0];
    const int k = x.shape(-1);
    const int n = inputs[1].shape(0);
    const int m = static_cast<int>(x.size() / k);
    if (m == 0 || n == 0) {
      return;
    }
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    auto args = [&](int first) {
      return QmvArgs{
          nullptr,
          inputs[first].data<uint32_t>(),
          inputs[first + 1].data<float>(),
          inputs[first + 2].data<float>(),
          nullptr,
          m,
          n,
          k,
          group_size_,
          bits_};
    };
    encoder.dispatch([gate = args(1),
                      up = args(4),
                      y = out.data<float>(),
                      x = mx::array::unsafe_weak_copy(x)]() mutable {
      std::vector<float> packed;
      if (x.flags().row_contiguous) {
        gate.x = x.data<float>();
      } else {
        packed.resize(x.size());
        pack_rows(x, packed.data());
        gate.x = packed.data();
      }
      up.x = gate.x;
      const size_t size = static_cast<size_t>(gate.m) * gate.n;
      std::vector<float> up_out(size);
      gate.y = y;
      up.y = up_out.data();
      qmv_pair(gate, up);
      for (size_t i = 0; i < size; ++i) {
        const float g = y[i];
        const float activated = g * (1.0f / (1.0f + std::exp(-g)));
        y[i] = activated * up_out[i];
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("[mlx_bun_cpu_silu_glu] runs on the CPU only");
  }

  // Gradients through MLX's own formulation.
  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>&) override {
    for (int a : argnums) {
      if (a != 0) {
        throw std::invalid_argument(
            "[mlx_bun_cpu_silu_glu] gradients only with respect to the activations");
      }
    }
    const int group_size = group_size_;
    const int bits = bits_;
    auto s = stream();
    auto fun = [=](const std::vector<mx::array>& in) {
      auto product = [&](int first) {
        return mx::quantized_matmul(
            in[0],
            primals[first],
            primals[first + 1],
            primals[first + 2],
            true,
            group_size,
            bits,
            "affine",
            s);
      };
      auto g = product(1);
      auto silu = mx::multiply(g, mx::sigmoid(g, s), s);
      return std::vector<mx::array>{mx::multiply(silu, product(4), s)};
    };
    auto grad = mx::vjp(fun, {primals[0]}, cotangents).second[0];
    return std::vector<mx::array>(argnums.size(), grad);
  }

  const char* name() const override {
    return "MlxBunCpuQuantizedSiluGlu";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const CpuQuantizedSiluGlu&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    auto shape = inputs[0].shape();
    shape.back() = inputs[1].shape(0);
    return {shape};
  }

 private:
  int group_size_;
  int bits_;
};

// Throws unless the kernel takes these operands.
void check_operands(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    int group_size,
    int bits) {
  if (!qmv_supported(x.ndim() > 0 ? x.shape(-1) : 0, group_size, bits)) {
    throw std::invalid_argument(
        "[mlx_bun_cpu_qmm] unsupported: bits " + std::to_string(bits) + ", group size " +
        std::to_string(group_size));
  }
  if (x.dtype() != mx::float32 || scales.dtype() != mx::float32 ||
      biases.dtype() != mx::float32 || w.dtype() != mx::uint32) {
    throw std::invalid_argument(
        "[mlx_bun_cpu_qmm] needs float32 activations, scales and biases and uint32 weights");
  }
  const int k = x.shape(-1);
  if (w.ndim() != 2 || w.shape(1) * 32 / bits != k) {
    throw std::invalid_argument("[mlx_bun_cpu_qmm] weight shape does not match the input");
  }
  const mx::Shape groups{w.shape(0), k / group_size};
  if (scales.shape() != groups || biases.shape() != groups) {
    throw std::invalid_argument("[mlx_bun_cpu_qmm] scales or biases have the wrong shape");
  }
}

mx::array cpu_qmm(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    const mx::array* residual,
    int group_size,
    int bits) {
  check_operands(x, w, scales, biases, group_size, bits);
  auto shape = x.shape();
  shape.back() = w.shape(0);
  std::vector<mx::array> inputs{x, w, scales, biases};
  if (residual != nullptr) {
    if (residual->dtype() != mx::float32 || residual->shape() != shape) {
      throw std::invalid_argument(
          "[mlx_bun_cpu_qmm] the residual must be float32 of the product's shape");
    }
    inputs.push_back(*residual);
  }
  auto stream = mx::default_stream(mx::Device::cpu);
  return mx::array(
      std::move(shape),
      mx::float32,
      std::make_shared<CpuQuantizedMatmul>(stream, group_size, bits, residual != nullptr),
      std::move(inputs));
}

}  // namespace
}  // namespace mlx_bun

extern "C" int mlx_bun_cpu_qmm(
    mlx_array* res,
    mlx_array x,
    mlx_array w,
    mlx_array scales,
    mlx_array biases,
    int group_size,
    int bits) {
  try {
    mlx_array_set_(
        *res,
        mlx_bun::cpu_qmm(
            mlx_array_get_(x),
            mlx_array_get_(w),
            mlx_array_get_(scales),
            mlx_array_get_(biases),
            nullptr,
            group_size,
            bits));
    return 0;
  } catch (const std::exception& e) {
    mlx_bun::last_error = e.what();
    return 1;
  }
}

extern "C" int mlx_bun_cpu_qmm_add(
    mlx_array* res,
    mlx_array x,
    mlx_array w,
    mlx_array scales,
    mlx_array biases,
    mlx_array residual,
    int group_size,
    int bits) {
  try {
    const auto& r = mlx_array_get_(residual);
    mlx_array_set_(
        *res,
        mlx_bun::cpu_qmm(
            mlx_array_get_(x),
            mlx_array_get_(w),
            mlx_array_get_(scales),
            mlx_array_get_(biases),
            &r,
            group_size,
            bits));
    return 0;
  } catch (const std::exception& e) {
    mlx_bun::last_error = e.what();
    return 1;
  }
}

extern "C" int mlx_bun_cpu_silu_glu(
    mlx_array* res,
    mlx_array x,
    mlx_array gate_w,
    mlx_array gate_scales,
    mlx_array gate_biases,
    mlx_array up_w,
    mlx_array up_scales,
    mlx_array up_biases,
    int group_size,
    int bits) {
  try {
    const auto& xa = mlx_array_get_(x);
    std::vector<mx::array> inputs{
        xa,
        mlx_array_get_(gate_w),
        mlx_array_get_(gate_scales),
        mlx_array_get_(gate_biases),
        mlx_array_get_(up_w),
        mlx_array_get_(up_scales),
        mlx_array_get_(up_biases)};
    mlx_bun::check_operands(xa, inputs[1], inputs[2], inputs[3], group_size, bits);
    mlx_bun::check_operands(xa, inputs[4], inputs[5], inputs[6], group_size, bits);
    if (inputs[1].shape() != inputs[4].shape()) {
      throw std::invalid_argument("[mlx_bun_cpu_silu_glu] gate and up differ in shape");
    }
    auto shape = xa.shape();
    shape.back() = inputs[1].shape(0);
    mlx_array_set_(
        *res,
        mx::array(
            std::move(shape),
            mx::float32,
            std::make_shared<mlx_bun::CpuQuantizedSiluGlu>(
                mx::default_stream(mx::Device::cpu), group_size, bits),
            std::move(inputs)));
    return 0;
  } catch (const std::exception& e) {
    mlx_bun::last_error = e.what();
    return 1;
  }
}

extern "C" int mlx_bun_cpu_qmm_supported(int in_features, int group_size, int bits) {
  return mlx_bun::qmv_supported(in_features, group_size, bits) ? 1 : 0;
}

extern "C" void mlx_bun_cpu_configure(int threads, int spin_us, const char* isa, int int8_rows) {
  mlx_bun::qmv_configure(threads, spin_us, isa, int8_rows);
}

extern "C" const char* mlx_bun_cpu_int8(void) {
  return mlx_bun::qmv_int8();
}

extern "C" const char* mlx_bun_cpu_isa(void) {
  return mlx_bun::qmv_isa();
}

extern "C" int mlx_bun_cpu_threads(void) {
  return mlx_bun::qmv_threads();
}

extern "C" void mlx_bun_cpu_qmm_stats(int bits, uint64_t* calls, uint64_t* nanoseconds) {
  mlx_bun::qmv_stats(bits, calls, nanoseconds);
}

extern "C" const char* mlx_bun_last_error(void) {
  return mlx_bun::last_error.c_str();
}
