// The CPU quantized matmul as an MLX primitive, and its C interface.
//
// The primitive's eval_cpu allocates the output and queues the kernel on the
// CPU stream's command encoder, like MLX's own CPU primitives, so it runs in
// order with the rest of the graph on MLX's worker thread (which then shares
// the work with the kernel's helper threads).

#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/private/array.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

#include "mlx_bun_kernels.h"
#include "qmv.h"

namespace mx = mlx::core;

namespace mlx_bun {
namespace {

}  // namespace

thread_local std::string last_error;

namespace {

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

class CpuQuantizedMatmul : public mx::UnaryPrimitive {
 public:
  CpuQuantizedMatmul(mx::Stream stream, int group_size, int bits)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits) {}

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
    encoder.set_input_array(x);
    encoder.set_input_array(w);
    encoder.set_input_array(scales);
    encoder.set_input_array(biases);
    encoder.set_output_array(out);
    if (x.flags().row_contiguous) {
      args.x = x.data<float>();
      encoder.dispatch([args]() { qmv(args); });
    } else {
      encoder.dispatch([args, x = mx::array::unsafe_weak_copy(x)]() mutable {
        std::vector<float> packed(x.size());
        pack_rows(x, packed.data());
        args.x = packed.data();
        qmv(args);
      });
    }
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

mx::array cpu_qmm(
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
  auto shape = x.shape();
  shape.back() = w.shape(0);
  auto stream = mx::default_stream(mx::Device::cpu);
  return mx::array(
      std::move(shape),
      mx::float32,
      std::make_shared<CpuQuantizedMatmul>(stream, group_size, bits),
      {x, w, scales, biases});
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
            group_size,
            bits));
    return 0;
  } catch (const std::exception& e) {
    mlx_bun::last_error = e.what();
    return 1;
  }
}

extern "C" int mlx_bun_cpu_qmm_supported(int in_features, int group_size, int bits) {
  return mlx_bun::qmv_supported(in_features, group_size, bits) ? 1 : 0;
}

extern "C" void mlx_bun_cpu_configure(int threads, int spin_us, const char* isa) {
  mlx_bun::qmv_configure(threads, spin_us, isa);
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
