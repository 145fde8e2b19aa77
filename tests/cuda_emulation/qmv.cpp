// Runs kernels/cuda/qmv.cu on the CPU (cuda_shim.h) for
// tests/cuda_qmv_emulated.rs.
//
// Usage: qmv DIR CASE M K N [NK NV]
// CASE picks one instantiation and entry point (see CASES below). DIR holds
// x, scales, biases (and scales2, biases2, residual, sk, bk, sv, bv) as
// float32 files of values the activation or scale type holds exactly, and
// w (w2, wk, wv) as the packed uint32 words; the run writes y (yk, yv). The
// "-norm" cases read an RMS norm weight (norm) and apply it with EPS first.

#include "cuda_shim.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "qmv.cu"

using T = __nv_bfloat16;
using S = __nv_bfloat16;
using Shape2 = std::array<int, 2>;
constexpr int GS = 64;
constexpr int WARPS = 4;
constexpr float EPS = 1e-5f;

static std::string dir;

template <typename V>
static std::vector<V> read(const std::string& name, size_t n) {
  std::vector<float> f(n);
  std::vector<V> out(n);
  const std::string path = dir + "/" + name;
  FILE* file = std::fopen(path.c_str(), "rb");
  const size_t got = file ? std::fread(f.data(), 4, n, file) : 0;
  if (got != n) {
    std::fprintf(stderr, "cannot read %zu values from %s\n", n, path.c_str());
    std::exit(2);
  }
  std::fclose(file);
  if constexpr (std::is_same_v<V, uint32_t>) {
    std::memcpy(out.data(), f.data(), n * 4);
  } else {
    for (size_t i = 0; i < n; ++i) {
      out[i] = V(f[i]);
    }
  }
  return out;
}

static void write(const std::string& name, const std::vector<T>& values) {
  std::vector<float> f(values.begin(), values.end());
  const std::string path = dir + "/" + name;
  FILE* file = std::fopen(path.c_str(), "wb");
  if (!file || std::fwrite(f.data(), 4, f.size(), file) != f.size()) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(2);
  }
  std::fclose(file);
}

static void launch(int blocks, const std::function<void()>& thread_body) {
  emulate_grid({static_cast<unsigned>(blocks), 1, 1}, WARPS * 32, thread_body);
}

struct Layer {
  std::vector<uint32_t> w;
  std::vector<S> scales, biases;
  Shape2 shape;
};

template <int BITS>
static Layer layer(const std::string& w, const std::string& s, const std::string& b, int n,
                   int k) {
  const int per_word = 32 / BITS;
  return {read<uint32_t>(w, static_cast<size_t>(n) * k / per_word),
          read<S>(s, static_cast<size_t>(n) * k / GS), read<S>(b, static_cast<size_t>(n) * k / GS),
          {n, k / per_word}};
}

static int blocks_for(int n, int r) { return (n / r + WARPS - 1) / WARPS; }

static std::vector<T> norm_weight(bool norm, int k) {
  return norm ? read<T>("norm", static_cast<size_t>(k)) : std::vector<T>();
}

// MB, BITS, R, KCAP, GLU of a plain, fused-MLP or residual product.
template <int MB, int BITS, int R, int KCAP, bool GLU, bool RESIDUAL, bool NORM = false>
static void product(int m, int k, int n) {
  const auto x = read<T>("x", static_cast<size_t>(m) * k);
  const Shape2 x_shape = {m, k};
  const Layer first = layer<BITS>("w", "scales", "biases", n, k);
  const Layer second = GLU ? layer<BITS>("w2", "scales2", "biases2", n, k) : first;
  const auto residual = RESIDUAL ? read<T>("residual", static_cast<size_t>(m) * n)
                                 : std::vector<T>();
  const auto norm = norm_weight(NORM, k);
  std::vector<T> y(static_cast<size_t>(m) * n);
  launch(blocks_for(n, R), [&] {
    mlx_bun_qmv::qmv<T, S, MB, GS, BITS, WARPS, R, KCAP, GLU>(
        x.data(), x_shape, 2, first.w.data(), first.shape, first.scales.data(),
        first.biases.data(), second.w.data(), second.scales.data(), second.biases.data(),
        y.data(), RESIDUAL ? residual.data() : nullptr, 0, NORM ? norm.data() : nullptr, EPS);
  });
  write("y", y);
}

template <int MB, int BITS, int R, int KCAP, bool NORM = false>
static void qkv(int m, int k, int n, int nk, int nv) {
  const auto x = read<T>("x", static_cast<size_t>(m) * k);
  const Shape2 x_shape = {m, k};
  const Layer q = layer<BITS>("w", "scales", "biases", n, k);
  const Layer kl = layer<BITS>("wk", "sk", "bk", nk, k);
  const Layer v = layer<BITS>("wv", "sv", "bv", nv, k);
  const auto norm = norm_weight(NORM, k);
  std::vector<T> y(static_cast<size_t>(m) * n), yk(static_cast<size_t>(m) * nk),
      yv(static_cast<size_t>(m) * nv);
  launch(blocks_for(n, R) + blocks_for(nk, R) + blocks_for(nv, R), [&] {
    mlx_bun_qmv::qkv<T, S, MB, GS, BITS, WARPS, R, KCAP>(
        x.data(), x_shape, 2, q.w.data(), q.shape, q.scales.data(), q.biases.data(),
        kl.w.data(), kl.shape, kl.scales.data(), kl.biases.data(), v.w.data(), v.shape,
        v.scales.data(), v.biases.data(), y.data(), yk.data(), yv.data(),
        NORM ? norm.data() : nullptr, EPS);
  });
  write("y", y);
  write("yk", yk);
  write("yv", yv);
}

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: qmv DIR CASE M K N [NK NV]\n");
    return 2;
  }
  dir = argv[1];
  const std::string which = argv[2];
  const int m = std::atoi(argv[3]), k = std::atoi(argv[4]), n = std::atoi(argv[5]);
  if (k > 1024) {
    std::fprintf(stderr, "K up to 1024 (the shared-memory cases hold 1024)\n");
    return 2;
  }
  // CASES: one row with x in shared memory; four rows, x per warp; 8 bits;
  // the fused MLP; a residual; q, k and v in one launch; the last two after
  // an RMS norm in the same launch (one row and three).
  if (which == "plain-1") {
    product<1, 4, 4, 1024, false, false>(m, k, n);
  } else if (which == "plain-4") {
    product<4, 4, 2, 0, false, false>(m, k, n);
  } else if (which == "plain-8bit") {
    product<2, 8, 1, 0, false, false>(m, k, n);
  } else if (which == "glu") {
    product<1, 4, 2, 1024, true, false>(m, k, n);
  } else if (which == "residual") {
    product<1, 4, 4, 0, false, true>(m, k, n);
  } else if (which == "glu-norm") {
    product<1, 4, 2, 1024, true, false, true>(m, k, n);
  } else if (which == "qkv" && argc == 8) {
    qkv<1, 4, 1, 1024>(m, k, n, std::atoi(argv[6]), std::atoi(argv[7]));
  } else if (which == "qkv-norm" && argc == 8) {
    qkv<4, 4, 1, 1024, true>(m, k, n, std::atoi(argv[6]), std::atoi(argv[7]));
  } else {
    std::fprintf(stderr, "unknown case %s\n", which.c_str());
    return 2;
  }
  return 0;
}
