// New cache positions written into a KV cache's buffers as one CPU
// primitive: every buffer [B, heads, capacity, W] gets its update
// [B, heads, n, W] at positions [position, position + n). It stands for one
// slice_update per buffer (six for a quantized cache: packed values, scales
// and biases of keys and values) and, like slice_update, writes in place
// when MLX can donate a buffer, else into a copy.

#include <cstring>
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

// Writes `update` (any strides) into the row-contiguous `out` at `position`
// along axis 2.
void write_positions(const mx::array& update, mx::array& out, int position) {
  const size_t item = out.itemsize();
  const auto& shape = update.shape();
  const auto& strides = update.strides();
  const size_t row = static_cast<size_t>(shape[3]) * item;
  char* dst = out.data<char>();
  const char* src = update.data<char>();
  const size_t out_head = static_cast<size_t>(out.shape(2)) * row;
  const size_t out_batch = static_cast<size_t>(out.shape(1)) * out_head;
  for (int b = 0; b < shape[0]; ++b) {
    for (int h = 0; h < shape[1]; ++h) {
      for (int s = 0; s < shape[2]; ++s) {
        char* d = dst + b * out_batch + h * out_head + (position + s) * row;
        const char* from = src + (b * strides[0] + h * strides[1] + s * strides[2]) * item;
        if (strides[3] == 1) {
          std::memcpy(d, from, row);
        } else {
          for (int w = 0; w < shape[3]; ++w) {
            std::memcpy(d + w * item, from + w * strides[3] * item, item);
          }
        }
      }
    }
  }
}

class CpuKvWrite : public mx::Primitive {
 public:
  CpuKvWrite(mx::Stream stream, int position) : mx::Primitive(stream), position_(position) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const size_t count = outputs.size();
    auto& encoder = mx::cpu::get_command_encoder(stream());
    release_sibling_inputs(inputs, outputs);
    std::vector<bool> copy(count);
    for (size_t i = 0; i < count; ++i) {
      const auto& buffer = inputs[i];
      copy[i] = !(buffer.is_donatable() && buffer.flags().row_contiguous);
      if (copy[i]) {
        outputs[i].set_data(mx::allocator::malloc(outputs[i].nbytes()));
      } else {
        outputs[i].copy_shared_buffer(buffer);
      }
      encoder.set_input_array(buffer);
      encoder.set_input_array(inputs[count + i]);
      encoder.set_output_array(outputs[i]);
    }
    std::vector<mx::array> buffers, updates, outs;
    for (size_t i = 0; i < count; ++i) {
      buffers.push_back(mx::array::unsafe_weak_copy(inputs[i]));
      updates.push_back(mx::array::unsafe_weak_copy(inputs[count + i]));
      outs.push_back(mx::array::unsafe_weak_copy(outputs[i]));
    }
    encoder.dispatch([buffers = std::move(buffers),
                      updates = std::move(updates),
                      outs = std::move(outs),
                      copy = std::move(copy),
                      position = position_]() mutable {
      for (size_t i = 0; i < outs.size(); ++i) {
        if (copy[i]) {
          copy_whole(buffers[i], outs[i]);
        }
        write_positions(updates[i], outs[i], position);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("[mlx_bun_cpu_kv_write] runs on the CPU only");
  }

  // Gradients through MLX's slice_update, one per buffer (training runs
  // its forward pass through a cache too).
  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>&) override {
    const size_t count = primals.size() / 2;
    const int position = position_;
    auto s = stream();
    auto fun = [=](const std::vector<mx::array>& in) {
      std::vector<mx::array> out;
      for (size_t i = 0; i < count; ++i) {
        const auto& update = in[count + i];
        mx::Shape start{0, 0, position, 0};
        mx::Shape stop = update.shape();
        stop[2] += position;
        out.push_back(mx::slice_update(in[i], update, start, stop, s));
      }
      return out;
    };
    auto grads = mx::vjp(fun, primals, cotangents).second;
    std::vector<mx::array> result;
    for (int a : argnums) result.push_back(grads[a]);
    return result;
  }

  const char* name() const override {
    return "MlxBunCpuKvWrite";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    return position_ == static_cast<const CpuKvWrite&>(other).position_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    std::vector<mx::Shape> shapes;
    for (size_t i = 0; i < inputs.size() / 2; ++i) shapes.push_back(inputs[i].shape());
    return shapes;
  }

 private:
  // The buffer copied whole into the row-contiguous `out` (any strides).
  static void copy_whole(const mx::array& buffer, mx::array& out) {
    if (buffer.flags().row_contiguous) {
      std::memcpy(out.data<char>(), buffer.data<char>(), out.nbytes());
      return;
    }
    write_positions(buffer, out, 0);
  }

  // Every output of a primitive holds its own copy of the inputs, so a
  // buffer read by this node is never donatable while the other outputs
  // hold theirs. MLX evaluates through `inputs` (one output's); the others'
  // copies only matter to gradients, which tracers keep.
  static void release_sibling_inputs(
      const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
    for (auto& out : outputs) {
      if (out.is_tracer()) return;
    }
    for (auto& out : outputs) {
      if (&out.inputs() != &inputs) out.inputs().clear();
    }
  }

  int position_;
};

}  // namespace
}  // namespace mlx_bun

extern "C" int mlx_bun_cpu_kv_write(
    mlx_array* outs,
    const mlx_array* buffers,
    const mlx_array* updates,
    int count,
    int position) {
  try {
    std::vector<mx::array> inputs;
    std::vector<mx::Shape> shapes;
    std::vector<mx::Dtype> dtypes;
    for (int i = 0; i < count; ++i) {
      const auto& buffer = mlx_array_get_(buffers[i]);
      const auto& update = mlx_array_get_(updates[i]);
      const bool fits = buffer.ndim() == 4 && update.ndim() == 4 &&
                        buffer.dtype() == update.dtype() && position >= 0 &&
                        update.shape(0) == buffer.shape(0) &&
                        update.shape(1) == buffer.shape(1) &&
                        update.shape(3) == buffer.shape(3) &&
                        position + update.shape(2) <= buffer.shape(2);
      if (!fits) {
        throw std::invalid_argument(
            "[mlx_bun_cpu_kv_write] each update must be [B, heads, n, W] of its buffer's dtype, "
            "fitting at position " + std::to_string(position));
      }
      inputs.push_back(buffer);
      shapes.push_back(buffer.shape());
      dtypes.push_back(buffer.dtype());
    }
    for (int i = 0; i < count; ++i) inputs.push_back(mlx_array_get_(updates[i]));
    auto arrays = mx::array::make_arrays(
        std::move(shapes),
        dtypes,
        std::make_shared<mlx_bun::CpuKvWrite>(mx::default_stream(mx::Device::cpu), position),
        std::move(inputs));
    for (int i = 0; i < count; ++i) mlx_array_set_(outs[i], arrays[i]);
    return 0;
  } catch (const std::exception& e) {
    mlx_bun::last_error = e.what();
    return 1;
  }
}
