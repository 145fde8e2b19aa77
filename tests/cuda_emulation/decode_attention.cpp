// Runs kernels/cuda/decode_attention.cu on the CPU (cuda_shim.h) for
// tests/cuda_attention_emulated.rs.
//
// Usage: decode_attention DIR B H HKV D CAPACITY POS TRAD FREQS SCALE
//        ROPE_SCALE LOG2_BASE
// DIR holds q, k, v, keys, values and freqs as float32 files (values that
// bfloat16 holds exactly); the run writes out, keys and values back there.

#include "cuda_shim.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "decode_attention.cu"

using T = __nv_bfloat16;
constexpr int WARPS = 8;

static std::vector<float> read_floats(const std::string& path, size_t n) {
  std::vector<float> f(n);
  FILE* file = std::fopen(path.c_str(), "rb");
  if (!file || std::fread(f.data(), sizeof(float), n, file) != n) {
    std::fprintf(stderr, "cannot read %zu floats from %s\n", n, path.c_str());
    std::exit(2);
  }
  std::fclose(file);
  return f;
}

static std::vector<T> read(const std::string& path, size_t n) {
  const std::vector<float> f = read_floats(path, n);
  return std::vector<T>(f.begin(), f.end());
}

static void write(const std::string& path, const std::vector<T>& values) {
  std::vector<float> f(values.begin(), values.end());
  FILE* file = std::fopen(path.c_str(), "wb");
  if (!file || std::fwrite(f.data(), sizeof(float), f.size(), file) != f.size()) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(2);
  }
  std::fclose(file);
}

template <int D, int TRAD, int FREQS>
static void launch(int b_rows, int heads, const T* q, const T* k, const T* v, const T* keys,
                   const std::array<int, 4>& keys_shape, const T* values, const int* offset,
                   const float* params, const float* freqs, T* out) {
  const dim3 grid = {1, static_cast<unsigned>(heads), static_cast<unsigned>(b_rows)};
  emulate_grid(grid, WARPS * 32, [&] {
    mlx_bun_attention::decode_attention<T, D, WARPS, TRAD, FREQS>(
        q, k, v, keys, keys_shape, values, offset, params, freqs, out);
  });
}

template <int D>
static void dispatch(bool trad, bool freqs_given, int b, int h, const T* q, const T* k,
                     const T* v, const T* keys, const std::array<int, 4>& shape,
                     const T* values, const int* offset, const float* params,
                     const float* freqs, T* out) {
  if (trad) {
    if constexpr (D >= 128) {
      if (freqs_given) {
        launch<D, 1, 1>(b, h, q, k, v, keys, shape, values, offset, params, freqs, out);
      } else {
        launch<D, 1, 0>(b, h, q, k, v, keys, shape, values, offset, params, freqs, out);
      }
      return;
    }
    std::fprintf(stderr, "adjacent-pair RoPE needs D >= 128\n");
    std::exit(2);
  }
  if (freqs_given) {
    launch<D, 0, 1>(b, h, q, k, v, keys, shape, values, offset, params, freqs, out);
  } else {
    launch<D, 0, 0>(b, h, q, k, v, keys, shape, values, offset, params, freqs, out);
  }
}

int main(int argc, char** argv) {
  if (argc != 13) {
    std::fprintf(stderr, "usage: decode_attention DIR B H HKV D CAPACITY POS TRAD FREQS "
                         "SCALE ROPE_SCALE LOG2_BASE\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int b = std::atoi(argv[2]), h = std::atoi(argv[3]), hkv = std::atoi(argv[4]);
  const int d = std::atoi(argv[5]), capacity = std::atoi(argv[6]), pos = std::atoi(argv[7]);
  const bool trad = std::atoi(argv[8]) != 0, freqs_given = std::atoi(argv[9]) != 0;
  const float params[3] = {std::strtof(argv[10], nullptr), std::strtof(argv[11], nullptr),
                           std::strtof(argv[12], nullptr)};
  auto q = read(dir + "/q", static_cast<size_t>(b) * h * d);
  auto k = read(dir + "/k", static_cast<size_t>(b) * hkv * d);
  auto v = read(dir + "/v", static_cast<size_t>(b) * hkv * d);
  const size_t cache = static_cast<size_t>(b) * hkv * capacity * d;
  auto keys = read(dir + "/keys", cache);
  auto values = read(dir + "/values", cache);
  std::vector<float> freqs(d / 2, 1.0f);
  if (freqs_given) {
    freqs = read_floats(dir + "/freqs", d / 2);
  }
  const int offset = pos;
  const std::array<int, 4> shape = {b, hkv, capacity, d};
  std::vector<T> out(static_cast<size_t>(b) * h * d);
  switch (d) {
    case 64:
      dispatch<64>(trad, freqs_given, b, h, q.data(), k.data(), v.data(), keys.data(), shape,
                   values.data(), &offset, params, freqs.data(), out.data());
      break;
    case 128:
      dispatch<128>(trad, freqs_given, b, h, q.data(), k.data(), v.data(), keys.data(), shape,
                    values.data(), &offset, params, freqs.data(), out.data());
      break;
    case 256:
      dispatch<256>(trad, freqs_given, b, h, q.data(), k.data(), v.data(), keys.data(), shape,
                    values.data(), &offset, params, freqs.data(), out.data());
      break;
    default:
      std::fprintf(stderr, "head dim %d: expected 64, 128 or 256\n", d);
      return 2;
  }
  write(dir + "/out", out);
  write(dir + "/keys", keys);
  write(dir + "/values", values);
  return 0;
}
