// The attention block's inputs as one CPU primitive: the query, key and value
// projections of one input (affine-quantized, one split over the kernel's
// threads), rotate-half RoPE on queries and keys, each written in the
// [B, heads, L, head_dim] layout attention reads. Replaces three products,
// three reshapes, three transposes and two RoPE nodes with the same numbers.

#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/private/array.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

#include "mlx_bun_kernels.h"
#include "qmv.h"
#include "rope.h"

namespace mx = mlx::core;

namespace mlx_bun {

extern thread_local std::string last_error;
void pack_rows(const mx::array& x, float* dst);

namespace {

struct QkvShape {
  int heads;
  int kv_heads;
  int head_dim;
};

struct RopeConfig {
  int dims;
  float base;
  float scale;
  int offset;
  bool has_freqs;
  bool per_row;
};

// Inputs: x [B, L, k]; then (w, scales, biases) of q, k and v; then freqs
// [dims / 2] when has_freqs, then int32 offsets [B] when per_row.
class CpuQkvRope : public mx::Primitive {
 public:
  CpuQkvRope(mx::Stream stream, int group_size, int bits, QkvShape shape, RopeConfig rope)
      : mx::Primitive(stream),
        group_size_(group_size),
        bits_(bits),
        shape_(shape),
        rope_(rope) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (size_t i = 1; i < 10; ++i) {
      if (!inputs[i].flags().row_contiguous) {
        throw std::runtime_error(
            "[mlx_bun_cpu_qkv_rope] quantized weights, scales and biases must be contiguous");
      }
    }
    for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
    const auto& x = inputs[0];
    const int k = x.shape(-1);
    const int m = static_cast<int>(x.size() / k);
    if (m == 0) {
      return;
    }
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    for (auto& a : outputs) encoder.set_output_array(a);
    auto args = [&](int first) {
      return QmvArgs{
          nullptr,
          inputs[first].data<uint32_t>(),
          inputs[first + 1].data<float>(),
          inputs[first + 2].data<float>(),
          nullptr,
          m,
          inputs[first].shape(0),
          k,
          group_size_,
          bits_};
    };
    const size_t freqs_at = 10;
    const size_t offsets_at = inputs.size() - 1;
    encoder.dispatch([q = args(1),
                      kk = args(4),
                      v = args(7),
                      x = mx::array::unsafe_weak_copy(x),
                      freqs = mx::array::unsafe_weak_copy(inputs[rope_.has_freqs ? freqs_at : 0]),
                      offsets = mx::array::unsafe_weak_copy(inputs[rope_.per_row ? offsets_at : 0]),
                      yq = outputs[0].data<float>(),
                      yk = outputs[1].data<float>(),
                      yv = outputs[2].data<float>(),
                      shape = shape_,
                      rope = rope_]() mutable {
      std::vector<float> packed;
      if (x.flags().row_contiguous) {
        q.x = x.data<float>();
      } else {
        packed.resize(x.size());
        pack_rows(x, packed.data());
        q.x = packed.data();
      }
      kk.x = q.x;
      v.x = q.x;
      const int m = q.m;
      std::vector<float> products(static_cast<size_t>(m) * (q.n + kk.n + v.n));
      q.y = products.data();
      kk.y = q.y + static_cast<size_t>(m) * q.n;
      v.y = kk.y + static_cast<size_t>(m) * kk.n;
      const QmvArgs* all[] = {&q, &kk, &v};
      qmv_products(all, 3);

      const int batch = x.shape(0);
      const int len = x.shape(1);
      std::vector<int> starts(batch, rope.offset);
      if (rope.per_row) {
        const int32_t* o = offsets.data<int32_t>();
        const int64_t os = offsets.strides().back();
        for (int b = 0; b < batch; ++b) starts[b] = o[b * os];
      }
      std::vector<float> cs, sn;
      rope_tables(
          batch,
          len,
          starts.data(),
          rope.dims,
          rope.base,
          rope.scale,
          rope.has_freqs ? freqs.data<float>() : nullptr,
          rope.has_freqs ? freqs.strides().back() : 0,
          cs,
          sn);
      const int d = shape.head_dim;
      const int half = rope.dims / 2;
      // Row (b, l) of a product holds every head's features; head h of it
      // goes to [b, h, l] of the output.
      auto scatter = [&](const float* y, int heads, float* out, bool rotate) {
        for (int b = 0; b < batch; ++b) {
          for (int l = 0; l < len; ++l) {
            const size_t row = static_cast<size_t>(b) * len + l;
            const float* c = cs.data() + row * half;
            const float* s = sn.data() + row * half;
            for (int h = 0; h < heads; ++h) {
              const float* src = y + row * heads * d + static_cast<size_t>(h) * d;
              float* dst = out + ((static_cast<size_t>(b) * heads + h) * len + l) * d;
              if (rotate) {
                rope_row(src, 1, c, s, rope.dims, d, false, dst);
              } else {
                for (int i = 0; i < d; ++i) dst[i] = src[i];
              }
            }
          }
        }
      };
      scatter(q.y, shape.heads, yq, true);
      scatter(kk.y, shape.kv_heads, yk, true);
      scatter(v.y, shape.kv_heads, yv, false);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("[mlx_bun_cpu_qkv_rope] runs on the CPU only");
  }

  std::vector<mx::array> vjp(
      const std::vector<mx::array>&,
      const std::vector<mx::array>&,
      const std::vector<int>&,
      const std::vector<mx::array>&) override {
    throw std::invalid_argument(
        "[mlx_bun_cpu_qkv_rope] inference only: training runs the unfused layers");
  }

  const char* name() const override {
    return "MlxBunCpuQkvRope";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const CpuQkvRope&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_ && shape_.heads == o.shape_.heads &&
        shape_.kv_heads == o.shape_.kv_heads && shape_.head_dim == o.shape_.head_dim &&
        rope_.dims == o.rope_.dims && rope_.base == o.rope_.base &&
        rope_.scale == o.rope_.scale && rope_.offset == o.rope_.offset &&
        rope_.has_freqs == o.rope_.has_freqs && rope_.per_row == o.rope_.per_row;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return shapes(inputs[0], shape_);
  }

  static std::vector<mx::Shape> shapes(const mx::array& x, QkvShape s) {
    const int b = x.shape(0);
    const int l = x.shape(1);
    return {{b, s.heads, l, s.head_dim}, {b, s.kv_heads, l, s.head_dim}, {b, s.kv_heads, l, s.head_dim}};
  }

 private:
  int group_size_;
  int bits_;
  QkvShape shape_;
  RopeConfig rope_;
};

void check_layer(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const mx::array& biases,
    int rows,
    int group_size,
    int bits) {
  const int k = x.shape(-1);
  if (!qmv_supported(k, group_size, bits) || w.dtype() != mx::uint32 ||
      scales.dtype() != mx::float32 || biases.dtype() != mx::float32 || w.ndim() != 2 ||
      w.shape(0) != rows || w.shape(1) != k * bits / 32) {
    throw std::invalid_argument(
        "[mlx_bun_cpu_qkv_rope] each projection must be affine-quantized [heads * head_dim, k] "
        "with float32 scales and biases, 4 or 8 bits");
  }
}

}  // namespace
}  // namespace mlx_bun

extern "C" int mlx_bun_cpu_qkv_rope(
    mlx_array* q_out,
    mlx_array* k_out,
    mlx_array* v_out,
    mlx_array x,
    const mlx_array* q_layer,
    const mlx_array* k_layer,
    const mlx_array* v_layer,
    int group_size,
    int bits,
    int heads,
    int kv_heads,
    int head_dim,
    int rope_dims,
    float rope_base,
    float rope_scale,
    int offset,
    mlx_array freqs,
    mlx_array offsets) {
  try {
    const auto& xa = mlx_array_get_(x);
    if (xa.dtype() != mx::float32 || xa.ndim() != 3 || heads <= 0 || kv_heads <= 0 ||
        head_dim <= 0 || rope_dims <= 0 || rope_dims % 2 != 0 || rope_dims > head_dim) {
      throw std::invalid_argument(
          "[mlx_bun_cpu_qkv_rope] needs float32 x [B, L, k], positive head counts and even "
          "rope dims <= head_dim");
    }
    std::vector<mx::array> inputs{xa};
    const mlx_array* layers[] = {q_layer, k_layer, v_layer};
    const int rows[] = {heads * head_dim, kv_heads * head_dim, kv_heads * head_dim};
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) inputs.push_back(mlx_array_get_(layers[i][j]));
      mlx_bun::check_layer(
          xa, inputs[1 + 3 * i], inputs[2 + 3 * i], inputs[3 + 3 * i], rows[i], group_size, bits);
    }
    const bool has_freqs = freqs.ctx != nullptr;
    if (has_freqs) {
      const auto& fa = mlx_array_get_(freqs);
      if (fa.dtype() != mx::float32 || fa.ndim() != 1 || fa.shape(0) != rope_dims / 2) {
        throw std::invalid_argument("[mlx_bun_cpu_qkv_rope] freqs must be float32 [dims / 2]");
      }
      inputs.push_back(fa);
    }
    const bool per_row = offsets.ctx != nullptr;
    if (per_row) {
      const auto& oa = mlx_array_get_(offsets);
      if (oa.dtype() != mx::int32 || oa.ndim() != 1 || oa.shape(0) != xa.shape(0)) {
        throw std::invalid_argument(
            "[mlx_bun_cpu_qkv_rope] per-row offsets must be int32 [B] for x [B, L, k]");
      }
      inputs.push_back(oa);
    }
    const mlx_bun::QkvShape shape{heads, kv_heads, head_dim};
    auto outs = mx::array::make_arrays(
        mlx_bun::CpuQkvRope::shapes(xa, shape),
        {mx::float32, mx::float32, mx::float32},
        std::make_shared<mlx_bun::CpuQkvRope>(
            mx::default_stream(mx::Device::cpu),
            group_size,
            bits,
            shape,
            mlx_bun::RopeConfig{rope_dims, rope_base, rope_scale, offset, has_freqs, per_row}),
        std::move(inputs));
    mlx_array_set_(*q_out, outs[0]);
    mlx_array_set_(*k_out, outs[1]);
    mlx_array_set_(*v_out, outs[2]);
    return 0;
  } catch (const std::exception& e) {
    mlx_bun::last_error = e.what();
    return 1;
  }
}
