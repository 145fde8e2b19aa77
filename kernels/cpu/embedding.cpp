// Rows of an affine-quantized embedding table as one CPU primitive:
//
//   out[..., j] = scales[id, j / group_size] * q[id, j] + biases[id, j / group_size]
//
// for each token id, where q[id, j] is the j-th `bits`-wide field of row id
// of `w` (uint32 words, field f of a word in bits [f*bits, (f+1)*bits)).
// MLX 0.32 takes the three tables' rows and dequantizes them in about 35
// operations on the CPU (shifts, broadcasts, a concatenation, a multiply
// and an add); the numbers here are those, bit for bit: each product and
// sum rounded on its own (this file is built without contraction).

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/private/array.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

#include "mlx_bun_kernels.h"

namespace mx = mlx::core;

namespace mlx_bun {

extern thread_local std::string last_error;

namespace {

// The token id at flat position `i` of `ids` (any integer dtype, any
// strides), negative ids counted from the end as MLX's `take` does; -1 when
// it is outside the table.
int64_t token_id(const mx::array& ids, size_t i, int64_t rows) {
  int64_t offset = 0;
  size_t rest = i;
  for (int d = static_cast<int>(ids.ndim()) - 1; d >= 0; --d) {
    offset += static_cast<int64_t>(rest % ids.shape(d)) * ids.strides()[d];
    rest /= ids.shape(d);
  }
  int64_t id = 0;
  switch (ids.dtype()) {
    case mx::int32: id = ids.data<int32_t>()[offset]; break;
    case mx::uint32: id = ids.data<uint32_t>()[offset]; break;
    case mx::int64: id = ids.data<int64_t>()[offset]; break;
    case mx::uint64: id = static_cast<int64_t>(ids.data<uint64_t>()[offset]); break;
    default: return -1;
  }
  if (id < 0) id += rows;
  return id >= 0 && id < rows ? id : -1;
}

void dequantize_row(const uint32_t* w, const float* scales, const float* biases, int bits,
                    int group_size, int64_t k, float* out) {
  const int per_word = 32 / bits;
  const uint32_t mask = bits == 32 ? ~0u : (1u << bits) - 1u;
  for (int64_t j = 0; j < k; ++j) {
    const uint32_t word = w[j / per_word];
    const uint32_t q = (word >> ((j % per_word) * bits)) & mask;
    const float s = scales[j / group_size];
    const float b = biases[j / group_size];
    const float scaled = static_cast<float>(q) * s;
    out[j] = scaled + b;
  }
}

class CpuQuantizedEmbedding : public mx::UnaryPrimitive {
 public:
  CpuQuantizedEmbedding(mx::Stream stream, int group_size, int bits)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& in : inputs) encoder.set_input_array(in);
    encoder.set_output_array(out);
    encoder.dispatch([ids = mx::array::unsafe_weak_copy(inputs[0]),
                      w = mx::array::unsafe_weak_copy(inputs[1]),
                      scales = mx::array::unsafe_weak_copy(inputs[2]),
                      biases = mx::array::unsafe_weak_copy(inputs[3]), y = out.data<float>(),
                      group_size = group_size_, bits = bits_]() {
      const int64_t rows = w.shape(0);
      const int64_t k = static_cast<int64_t>(w.shape(1)) * 32 / bits;
      const int64_t groups = scales.shape(1);
      for (size_t i = 0; i < ids.size(); ++i) {
        float* row = y + i * k;
        const int64_t id = token_id(ids, i, rows);
        if (id < 0) {
          for (int64_t j = 0; j < k; ++j) row[j] = 0.0f;
          continue;
        }
        dequantize_row(w.data<uint32_t>() + id * w.shape(1), scales.data<float>() + id * groups,
                       biases.data<float>() + id * groups, bits, group_size, k, row);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("[mlx_bun_cpu_quantized_embedding] runs on the CPU only");
  }

  const char* name() const override {
    return "MlxBunCpuQuantizedEmbedding";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const CpuQuantizedEmbedding&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape shape = inputs[0].shape();
    shape.push_back(inputs[1].shape(1) * 32 / bits_);
    return {shape};
  }

 private:
  int group_size_;
  int bits_;
};

}  // namespace
}  // namespace mlx_bun

extern "C" int mlx_bun_cpu_quantized_embedding(
    mlx_array* res,
    mlx_array ids,
    mlx_array w,
    mlx_array scales,
    mlx_array biases,
    int group_size,
    int bits) {
  try {
    const auto& ia = mlx_array_get_(ids);
    const auto& wa = mlx_array_get_(w);
    const auto& sa = mlx_array_get_(scales);
    const auto& ba = mlx_array_get_(biases);
    const bool integer_ids = ia.dtype() == mx::int32 || ia.dtype() == mx::uint32 ||
                             ia.dtype() == mx::int64 || ia.dtype() == mx::uint64;
    const bool fits = integer_ids && wa.dtype() == mx::uint32 && wa.ndim() == 2 &&
                      sa.dtype() == mx::float32 && ba.dtype() == mx::float32 &&
                      sa.ndim() == 2 && sa.shape() == ba.shape() &&
                      sa.shape(0) == wa.shape(0) && (bits == 2 || bits == 4 || bits == 8) &&
                      group_size > 0 &&
                      static_cast<int64_t>(wa.shape(1)) * 32 / bits ==
                          static_cast<int64_t>(sa.shape(1)) * group_size;
    if (!fits) {
      throw std::invalid_argument(
          "[mlx_bun_cpu_quantized_embedding] needs integer ids, a uint32 table [rows, k * bits "
          "/ 32] and float32 scales and biases [rows, k / group_size], 2, 4 or 8 bits");
    }
    mx::Shape shape = ia.shape();
    shape.push_back(wa.shape(1) * 32 / bits);
    mlx_array_set_(
        *res,
        mx::array(
            std::move(shape),
            mx::float32,
            std::make_shared<mlx_bun::CpuQuantizedEmbedding>(
                mx::default_stream(mx::Device::cpu), group_size, bits),
            {ia, wa, sa, ba}));
    return 0;
  } catch (const std::exception& e) {
    mlx_bun::last_error = e.what();
    return 1;
  }
}
