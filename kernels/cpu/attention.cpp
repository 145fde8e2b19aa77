// Attention of queries over a KV cache as one CPU primitive.
//
// MLX 0.32 has no CPU kernel for fast::scaled_dot_product_attention: on the
// CPU it expands into about a dozen operations per layer (scale, the grouped
// heads' reshapes and broadcasts, two matmuls, softmax, then the caller's
// transpose and reshape back to [B, L, heads * D]). For decoding, where the
// arithmetic is small, that bookkeeping costs more than the work; for a
// prompt, the scores it materializes ([B, H, L, S], three copies alive at
// once) cost memory with the square of the prompt. This primitive computes
// the same formula in one node, writing [B, L, H * D], in tiles of queries
// whose scores stay small:
//
//   out[b, l, h, :] = softmax(scale * q[b, h, l] . k[b, h / rep, s]) @ v[b, h / rep]
//
// over the visible keys s (causal: s <= S - L + l; a boolean mask, broadcast
// to [B, H, L, S], where given). Same operation order as the fallback: the
// queries are scaled first, then the products, softmax by the maximum (with
// MLX's own exponential) and the reciprocal of the sum, and the
// probability-weighted sum of values. Over a quantized cache the
// dequantization is folded into the products instead (see
// `quant_key_scores`), which rounds slightly differently.

#include <cmath>
#include <limits>
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
#include "mlx_exp.h"
#include "qmv.h"

namespace mx = mlx::core;

namespace mlx_bun {

extern thread_local std::string last_error;

namespace {

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define MLX_BUN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MLX_BUN_CLONES
#endif

constexpr int kLanes = 16;

#define MLX_BUN_INLINE inline __attribute__((always_inline))

typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));
typedef float Half __attribute__((vector_size(kLanes / 2 * sizeof(float))));
typedef float Quarter __attribute__((vector_size(kLanes / 4 * sizeof(float))));

MLX_BUN_INLINE float dot(const float* a, const float* b, int n) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      acc[j] += a[i + j] * b[i + j];
    }
  }
  float sum = 0.0f;
  for (; i < n; ++i) {
    sum += a[i] * b[i];
  }
  for (int j = 0; j < kLanes; ++j) {
    sum += acc[j];
  }
  return sum;
}

// Where `scores[j * keys + s]` is 0 (key s visible to query vector j) it
// becomes the product of query j and key row s; -inf stays.
MLX_BUN_CLONES void key_scores(const float* queries, int n, int d, const float* k,
                               int64_t k_stride, int keys, float* scores) {
  for (int s = 0; s < keys; ++s) {
    const float* key = k + s * k_stride;
    for (int j = 0; j < n; ++j) {
      float* score = scores + static_cast<int64_t>(j) * keys + s;
      if (*score == 0.0f) *score = dot(queries + static_cast<int64_t>(j) * d, key, d);
    }
  }
}

// Keys transposed per tile, one key per lane.
constexpr int kKeyTile = kLanes;
// From this many query vectors, transposing a tile costs less than it saves.
constexpr int kTiledFrom = 8;

// `key_scores` for many query vectors (a prompt's): kKeyTile keys at a time,
// transposed into `tile` (D * kKeyTile floats) so that each lane holds one
// key and no sum crosses lanes. Every score is summed in `dot`'s order (a
// partial sum per feature modulo kLanes, then the tail, then the partial
// sums in turn), so the results are the same bits as `key_scores`.
MLX_BUN_CLONES void key_scores_tiled(const float* queries, int n, int d, const float* k,
                                     int64_t k_stride, int keys, float* scores, float* tile) {
  const int whole = d - d % kLanes;
  for (int s0 = 0; s0 < keys; s0 += kKeyTile) {
    const int width = keys - s0 < kKeyTile ? keys - s0 : kKeyTile;
    for (int c = 0; c < kKeyTile; ++c) {
      const float* key = k + (s0 + (c < width ? c : 0)) * k_stride;
      for (int i = 0; i < d; ++i) tile[i * kKeyTile + c] = key[i];
    }
    for (int j = 0; j < n; ++j) {
      float* row = scores + static_cast<int64_t>(j) * keys + s0;
      bool seen = false;
      for (int c = 0; c < width; ++c) seen |= row[c] == 0.0f;
      if (!seen) continue;
      const float* q = queries + static_cast<int64_t>(j) * d;
      Lanes part[kLanes];
      for (int l = 0; l < kLanes; ++l) part[l] = Lanes{};
      for (int i = 0; i < whole; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) {
          Lanes t;
          __builtin_memcpy(&t, tile + (i + l) * kKeyTile, sizeof(t));
          part[l] += q[i + l] * t;
        }
      }
      Lanes sum = {};
      for (int i = whole; i < d; ++i) {
        Lanes t;
        __builtin_memcpy(&t, tile + i * kKeyTile, sizeof(t));
        sum += q[i] * t;
      }
      for (int l = 0; l < kLanes; ++l) sum += part[l];
      for (int c = 0; c < width; ++c) {
        if (row[c] == 0.0f) row[c] = sum[c];
      }
    }
  }
}

// `out = sum_s weights[s] * v[s]` in key order, skipping zero weights; the
// sum of a head of D features stays in registers.
template <int D>
MLX_BUN_INLINE void weighted_sum(const float* weights, int keys, const float* v, int64_t v_stride,
                                 float* out) {
  float acc[D];
  for (int i = 0; i < D; ++i) acc[i] = 0.0f;
  for (int s = 0; s < keys; ++s) {
    const float w = weights[s];
    if (w == 0.0f) continue;
    const float* row = v + s * v_stride;
    for (int i = 0; i < D; ++i) acc[i] += w * row[i];
  }
  for (int i = 0; i < D; ++i) out[i] = acc[i];
}

MLX_BUN_INLINE void weighted_sum_any(const float* weights, int keys, const float* v,
                                     int64_t v_stride, int d, float* out) {
  for (int i = 0; i < d; ++i) out[i] = 0.0f;
  for (int s = 0; s < keys; ++s) {
    const float w = weights[s];
    if (w == 0.0f) continue;
    const float* row = v + s * v_stride;
    for (int i = 0; i < d; ++i) out[i] += w * row[i];
  }
}

// The probability-weighted values of each of `n` query vectors, into `outs[j]`.
MLX_BUN_CLONES void weighted_values(const float* weights, int n, int keys, const float* v,
                                    int64_t v_stride, int d, float* const* outs) {
  for (int j = 0; j < n; ++j) {
    const float* w = weights + static_cast<int64_t>(j) * keys;
    if (d == 64) {
      weighted_sum<64>(w, keys, v, v_stride, outs[j]);
    } else if (d == 128) {
      weighted_sum<128>(w, keys, v, v_stride, outs[j]);
    } else {
      weighted_sum_any(w, keys, v, v_stride, d, outs[j]);
    }
  }
}

// Rows 0..count of one head as a base pointer and a row stride.
struct RowSpan {
  const float* base;
  int64_t stride;
};

// A [B, heads, rows, D] float32 operand read through its strides.
struct Operand {
  const float* data;
  int64_t stride[4];

  const float* at(int b, int h, int r) const {
    return data + b * stride[0] + h * stride[1] + r * stride[2];
  }
};

Operand operand(const mx::array& a) {
  return {a.data<float>(), {a.strides()[0], a.strides()[1], a.strides()[2], a.strides()[3]}};
}

// A boolean mask broadcast to [B, H, L, S]: stride 0 along its size-1 axes.
struct MaskView {
  const bool* data = nullptr;
  int64_t stride[4] = {0, 0, 0, 0};

  bool visible(int b, int h, int l, int s) const {
    return data[b * stride[0] + h * stride[1] + l * stride[2] + s * stride[3]];
  }
};

MaskView mask_view(const mx::array& m) {
  MaskView view;
  view.data = m.data<bool>();
  const int lead = 4 - static_cast<int>(m.ndim());
  for (int d = 0; d < static_cast<int>(m.ndim()); ++d) {
    view.stride[lead + d] = m.shape(d) == 1 ? 0 : m.strides()[d];
  }
  return view;
}

// `out[i] = scale * q_i` over the `n` fields of a packed group.
template <int BITS>
MLX_BUN_INLINE void unpack_scaled(const uint8_t* bytes, int n, float scale, float* out) {
  if constexpr (BITS == 8) {
    for (int i = 0; i < n; ++i) out[i] = scale * static_cast<float>(bytes[i]);
  } else if constexpr (BITS == 4) {
    for (int i = 0; i < n / 2; ++i) {
      out[2 * i] = scale * static_cast<float>(bytes[i] & 0x0F);
      out[2 * i + 1] = scale * static_cast<float>(bytes[i] >> 4);
    }
  } else {
    for (int i = 0; i < n / 4; ++i) {
      for (int j = 0; j < 4; ++j) {
        out[4 * i + j] = scale * static_cast<float>((bytes[i] >> (2 * j)) & 0x03);
      }
    }
  }
}

// One head's packed rows with their groups' scales and biases: row s's
// bytes at `bytes + s * row_bytes`, its scales at `scales + s * scale_stride`,
// its biases likewise.
struct PackedHead {
  const uint8_t* bytes;
  int64_t row_bytes;
  const float* scales;
  int64_t scale_stride;
  const float* biases;
  int64_t bias_stride;
  int group_size;
};

// `dot` with its lanes summed pairwise: shorter dependency chains than its
// running sum, and a different rounding.

MLX_BUN_INLINE float dot_pairwise(const float* a, const float* b, int n) {
  Lanes acc = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Lanes x, y;
    __builtin_memcpy(&x, a + i, sizeof(x));
    __builtin_memcpy(&y, b + i, sizeof(y));
    acc += x * y;
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  const Half h = __builtin_shufflevector(acc, acc, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15);
  const Quarter q = __builtin_shufflevector(h, h, 0, 1, 2, 3) +
                    __builtin_shufflevector(h, h, 4, 5, 6, 7);
  return ((q[0] + q[2]) + (q[1] + q[3])) + tail;
}

// Row s of a packed head without its biases: `row[i] = scale_g * q_i`.
template <int BITS>
MLX_BUN_INLINE void scaled_row(const PackedHead& h, int s, int d, float* row) {
  const int gs = h.group_size;
  const int group_bytes = gs * BITS / 8;
  const uint8_t* bytes = h.bytes + s * h.row_bytes;
  const float* sc = h.scales + s * h.scale_stride;
  for (int g = 0; g * gs < d; ++g) {
    unpack_scaled<BITS>(bytes + g * group_bytes, gs, sc[g], row + g * gs);
  }
}

// `key_scores` over quantized keys, the biases folded into the products:
// with each query's per-group sums,
// x . (scale * q + bias) = x . (scale * q) + sum_g bias_g * sum_{i in g} x_i.
template <int BITS>
MLX_BUN_INLINE void quant_key_scores_of(const float* queries, const float* sums, int n, int d,
                                        const PackedHead& k, int keys, float* row,
                                        float* scores) {
  const int groups = d / k.group_size;
  for (int s = 0; s < keys; ++s) {
    bool seen = false;
    for (int j = 0; j < n; ++j) seen |= scores[static_cast<int64_t>(j) * keys + s] == 0.0f;
    if (!seen) continue;
    scaled_row<BITS>(k, s, d, row);
    const float* bi = k.biases + s * k.bias_stride;
    for (int j = 0; j < n; ++j) {
      float* score = scores + static_cast<int64_t>(j) * keys + s;
      if (*score != 0.0f) continue;
      const float* sum = sums + static_cast<int64_t>(j) * groups;
      float offset = 0.0f;
      for (int g = 0; g < groups; ++g) offset += bi[g] * sum[g];
      *score = dot_pairwise(queries + static_cast<int64_t>(j) * d, row, d) + offset;
    }
  }
}

MLX_BUN_CLONES void quant_key_scores(const float* queries, const float* sums, int n, int d,
                                     const PackedHead& k, int bits, int keys, float* row,
                                     float* scores) {
  switch (bits) {
    case 8:
      quant_key_scores_of<8>(queries, sums, n, d, k, keys, row, scores);
      break;
    case 4:
      quant_key_scores_of<4>(queries, sums, n, d, k, keys, row, scores);
      break;
    default:
      quant_key_scores_of<2>(queries, sums, n, d, k, keys, row, scores);
      break;
  }
}

// `weighted_sum` over quantized values for J query vectors at once, each
// row unpacked once for all of them, the biases folded out of the sum:
// sum_s w_s (scale_s * q_s + bias_s) = sum_s w_s (scale_s * q_s) + sum_s w_s bias_s
// per group. `row` holds D floats, `offsets` J * D / group_size.
template <int D, int J, int BITS>
MLX_BUN_INLINE void quant_weighted_sums(const float* const* weights, int keys,
                                        const PackedHead& v, float* row, float* offsets,
                                        float* const* outs) {
  const int gs = v.group_size;
  const int groups = D / gs;
  float acc[J][D];
  for (int j = 0; j < J; ++j) {
    for (int i = 0; i < D; ++i) acc[j][i] = 0.0f;
  }
  for (int g = 0; g < J * groups; ++g) offsets[g] = 0.0f;
  for (int s = 0; s < keys; ++s) {
    bool seen = false;
    for (int j = 0; j < J; ++j) seen |= weights[j][s] != 0.0f;
    if (!seen) continue;
    scaled_row<BITS>(v, s, D, row);
    const float* bi = v.biases + s * v.bias_stride;
    for (int j = 0; j < J; ++j) {
      const float w = weights[j][s];
      for (int g = 0; g < groups; ++g) offsets[j * groups + g] += w * bi[g];
      for (int i = 0; i < D; ++i) acc[j][i] += w * row[i];
    }
  }
  for (int j = 0; j < J; ++j) {
    for (int g = 0; g < groups; ++g) {
      const float offset = offsets[j * groups + g];
      for (int i = g * gs; i < (g + 1) * gs; ++i) outs[j][i] = acc[j][i] + offset;
    }
  }
}

// Any head size: one query vector at a time, the sums in `out`.
template <int BITS>
MLX_BUN_INLINE void quant_weighted_sum_any(const float* weights, int keys, const PackedHead& v,
                                           int d, float* row, float* offsets, float* out) {
  const int gs = v.group_size;
  const int groups = d / gs;
  for (int i = 0; i < d; ++i) out[i] = 0.0f;
  for (int g = 0; g < groups; ++g) offsets[g] = 0.0f;
  for (int s = 0; s < keys; ++s) {
    const float w = weights[s];
    if (w == 0.0f) continue;
    scaled_row<BITS>(v, s, d, row);
    const float* bi = v.biases + s * v.bias_stride;
    for (int g = 0; g < groups; ++g) offsets[g] += w * bi[g];
    for (int i = 0; i < d; ++i) out[i] += w * row[i];
  }
  for (int g = 0; g < groups; ++g) {
    for (int i = g * gs; i < (g + 1) * gs; ++i) out[i] += offsets[g];
  }
}

// Query vectors in blocks of up to J (accumulators of J * D floats in
// registers), each block reading the rows once.
template <int D, int J, int BITS>
MLX_BUN_INLINE void quant_weighted_blocks(const float* weights, int n, int keys,
                                          const PackedHead& v, float* row, float* offsets,
                                          float* const* outs) {
  if constexpr (J > 0) {
    for (; n >= J; n -= J, weights += static_cast<int64_t>(J) * keys, outs += J) {
      const float* w[J];
      for (int t = 0; t < J; ++t) w[t] = weights + static_cast<int64_t>(t) * keys;
      quant_weighted_sums<D, J, BITS>(w, keys, v, row, offsets, outs);
    }
    quant_weighted_blocks<D, J - 1, BITS>(weights, n, keys, v, row, offsets, outs);
  }
}

template <int BITS>
MLX_BUN_INLINE void quant_weighted_values_of(const float* weights, int n, int keys,
                                             const PackedHead& v, int d, float* row,
                                             float* offsets, float* const* outs) {
  if (d == 64) {
    quant_weighted_blocks<64, 4, BITS>(weights, n, keys, v, row, offsets, outs);
  } else if (d == 128) {
    quant_weighted_blocks<128, 2, BITS>(weights, n, keys, v, row, offsets, outs);
  } else {
    for (int j = 0; j < n; ++j) {
      quant_weighted_sum_any<BITS>(weights + static_cast<int64_t>(j) * keys, keys, v, d, row,
                                   offsets, outs[j]);
    }
  }
}

MLX_BUN_CLONES void quant_weighted_values(const float* weights, int n, int keys,
                                          const PackedHead& v, int bits, int d, float* row,
                                          float* offsets, float* const* outs) {
  switch (bits) {
    case 8:
      quant_weighted_values_of<8>(weights, n, keys, v, d, row, offsets, outs);
      break;
    case 4:
      quant_weighted_values_of<4>(weights, n, keys, v, d, row, offsets, outs);
      break;
    default:
      quant_weighted_values_of<2>(weights, n, keys, v, d, row, offsets, outs);
      break;
  }
}

// Keys or values stored as float32 [B, kv_heads, S, D].
struct FloatRows {
  Operand a;

  // Row s of head h: in place when its features are contiguous, else
  // gathered into `scratch` (D floats).
  const float* row(int b, int h, int s, int d, float* scratch) const {
    const float* r = a.at(b, h, s);
    if (a.stride[3] == 1) return r;
    for (int i = 0; i < d; ++i) scratch[i] = r[i * a.stride[3]];
    return scratch;
  }

  // Rows 0..count of head h: in place when their features are contiguous,
  // else gathered into `scratch`.
  RowSpan rows(int b, int h, int count, int d, std::vector<float>& scratch) const {
    if (a.stride[3] == 1) return {a.at(b, h, 0), a.stride[2]};
    scratch.resize(static_cast<size_t>(count) * d);
    for (int s = 0; s < count; ++s) row(b, h, s, d, scratch.data() + static_cast<size_t>(s) * d);
    return {scratch.data(), d};
  }

  void scores(int b, int h, const float* queries, int n, int d, int keys, float* out,
              std::vector<float>& scratch) const {
    const RowSpan k = rows(b, h, keys, d, scratch);
    if (n < kTiledFrom) {
      key_scores(queries, n, d, k.base, k.stride, keys, out);
      return;
    }
    thread_local std::vector<float> tile;
    tile.resize(static_cast<size_t>(d) * kKeyTile);
    key_scores_tiled(queries, n, d, k.base, k.stride, keys, out, tile.data());
  }

  void values(int b, int h, const float* weights, int n, int d, int keys, float* const* outs,
              std::vector<float>& scratch) const {
    const RowSpan v = rows(b, h, keys, d, scratch);
    weighted_values(weights, n, keys, v.base, v.stride, d, outs);
  }
};

// Keys or values in MLX's affine quantized layout, as a quantized KV cache
// keeps them: packed uint32 [B, kv_heads, S, D * bits / 32] with float32
// scales and biases [B, kv_heads, S, D / group_size]; each value is
// scale * q + bias (element j of a word in bits [j * bits, (j + 1) * bits),
// so on a little-endian machine the fields run in byte order).
struct QuantRows {
  const uint32_t* packed;
  const float* scales;
  const float* biases;
  int64_t packed_stride[3];
  int64_t scale_stride[3];
  int64_t bias_stride[3];
  int bits;
  int group_size;

  PackedHead head(int b, int h) const {
    return {reinterpret_cast<const uint8_t*>(packed + b * packed_stride[0] + h * packed_stride[1]),
            packed_stride[2] * 4,
            scales + b * scale_stride[0] + h * scale_stride[1],
            scale_stride[2],
            biases + b * bias_stride[0] + h * bias_stride[1],
            bias_stride[2],
            group_size};
  }

  void scores(int b, int h, const float* queries, int n, int d, int keys, float* out,
              std::vector<float>& scratch) const {
    const int groups = d / group_size;
    scratch.resize(d + static_cast<size_t>(n) * groups);
    float* row = scratch.data();
    float* sums = row + d;
    for (int j = 0; j < n; ++j) {
      const float* x = queries + static_cast<int64_t>(j) * d;
      for (int g = 0; g < groups; ++g) {
        float sum = 0.0f;
        for (int i = g * group_size; i < (g + 1) * group_size; ++i) sum += x[i];
        sums[j * groups + g] = sum;
      }
    }
    quant_key_scores(queries, sums, n, d, head(b, h), bits, keys, row, out);
  }

  void values(int b, int h, const float* weights, int n, int d, int keys, float* const* outs,
              std::vector<float>& scratch) const {
    scratch.resize(d + static_cast<size_t>(n) * (d / group_size));
    quant_weighted_values(weights, n, keys, head(b, h), bits, d, scratch.data(),
                          scratch.data() + d, outs);
  }
};

template <class Rows>
struct Problem {
  Operand q;
  Rows k, v;
  MaskView mask;
  bool has_mask;
  bool causal;
  float scale;
  int batch, heads, kv_heads, queries, keys, dims;
  float* out;  // [B, L, H * D], row-contiguous
};

// Queries per task: a prompt's are split into tiles of this many, so that
// a task's scores stay small and a causal tile reads only the keys it sees.
constexpr int kQueryTile = 16;

// One (batch row, key head, query tile): every query of the tile in each
// query head that shares that key head, so each key and value row is read
// (and, quantized, dequantized) once for all of them.
template <class Rows>
void attend(const Problem<Rows>& p, int task) {
  const int tiles = (p.queries + kQueryTile - 1) / kQueryTile;
  const int b = task / (p.kv_heads * tiles);
  const int kh = task / tiles % p.kv_heads;
  const int l0 = task % tiles * kQueryTile;
  const int count = p.queries - l0 < kQueryTile ? p.queries - l0 : kQueryTile;
  // Causal: the tile's last query sees the most keys.
  const int seen_by_last = p.keys - p.queries + l0 + count;
  const int keys = !p.causal ? p.keys : seen_by_last < 0 ? 0 : seen_by_last;
  const int repeats = p.heads / p.kv_heads;
  const int d = p.dims;
  const int n = repeats * count;  // query vectors, head-major
  thread_local std::vector<float> scores;
  thread_local std::vector<float> queries;
  thread_local std::vector<float> key_rows;
  thread_local std::vector<float> value_rows;
  thread_local std::vector<float*> outputs;
  scores.resize(static_cast<size_t>(n) * keys);
  queries.resize(static_cast<size_t>(n) * d);
  outputs.resize(n);
  const float minus_inf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < repeats; ++r) {
    for (int t = 0; t < count; ++t) {
      const float* q = p.q.at(b, kh * repeats + r, l0 + t);
      float* dst = queries.data() + static_cast<size_t>(r * count + t) * d;
      for (int i = 0; i < d; ++i) dst[i] = p.scale * q[i * p.q.stride[3]];
    }
  }
  for (int j = 0; j < n; ++j) {
    const int h = kh * repeats + j / count;
    const int l = l0 + j % count;
    const int last = p.causal ? p.keys - p.queries + l : p.keys - 1;
    float* row = scores.data() + static_cast<size_t>(j) * keys;
    for (int s = 0; s < keys; ++s) {
      const bool seen = s <= last && (!p.has_mask || p.mask.visible(b, h, l, s));
      row[s] = seen ? 0.0f : minus_inf;
    }
  }
  p.k.scores(b, kh, queries.data(), n, d, keys, scores.data(), key_rows);
  // Softmax per query vector; a query that sees no key gets zeros.
  for (int j = 0; j < n; ++j) {
    float* row = scores.data() + static_cast<size_t>(j) * keys;
    float max = minus_inf;
    for (int s = 0; s < keys; ++s) max = row[s] > max ? row[s] : max;
    if (max == minus_inf) {
      for (int s = 0; s < keys; ++s) row[s] = 0.0f;
      continue;
    }
    mlx_shifted_exp(row, max, row, keys);
    float sum = 0.0f;
    for (int s = 0; s < keys; ++s) sum += row[s];
    const float normalizer = 1.0f / sum;
    for (int s = 0; s < keys; ++s) row[s] *= normalizer;
  }
  for (int j = 0; j < n; ++j) {
    const int h = kh * repeats + j / count;
    const int l = l0 + j % count;
    outputs[j] = p.out + ((static_cast<int64_t>(b) * p.queries + l) * p.heads + h) * d;
  }
  p.v.values(b, kh, scores.data(), n, d, keys, outputs.data(), value_rows);
}

template <class Rows>
void attend_task(void* ctx, int task) {
  attend(*static_cast<const Problem<Rows>*>(ctx), task);
}

template <class Rows>
void run(const Problem<Rows>& p) {
  const int tiles = (p.queries + kQueryTile - 1) / kQueryTile;
  const int tasks = p.batch * p.kv_heads * tiles;
  const int64_t work = static_cast<int64_t>(p.batch) * p.heads * p.queries * p.keys * p.dims;
  // Below this much work a wake-up of the helper threads costs more.
  if (work < (1 << 16) || tasks == 1) {
    for (int t = 0; t < tasks; ++t) attend(p, t);
  } else {
    parallel_tasks(tasks, attend_task<Rows>, const_cast<Problem<Rows>*>(&p));
  }
}

QuantRows quant_rows(const mx::array& packed, const mx::array& scales, const mx::array& biases,
                     int bits, int group_size) {
  for (const auto* a : {&packed, &scales, &biases}) {
    if (a->strides().back() != 1) {
      throw std::runtime_error("[mlx_bun_cpu_attention] quantized rows must be contiguous");
    }
  }
  QuantRows r{packed.data<uint32_t>(), scales.data<float>(), biases.data<float>(),
              {}, {}, {}, bits, group_size};
  for (int i = 0; i < 3; ++i) {
    r.packed_stride[i] = packed.strides()[i];
    r.scale_stride[i] = scales.strides()[i];
    r.bias_stride[i] = biases.strides()[i];
  }
  return r;
}

class CpuAttention : public mx::UnaryPrimitive {
 public:
  // `bits` 0: float32 keys and values; else quantized with that many bits.
  // `keys`: the positions attended, the first of the keys' and values'.
  CpuAttention(mx::Stream stream, float scale, bool causal, bool has_mask, int bits, int group_size,
               int keys)
      : mx::UnaryPrimitive(stream),
        scale_(scale),
        causal_(causal),
        has_mask_(has_mask),
        bits_(bits),
        group_size_(group_size),
        keys_(keys) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    const auto& q = inputs[0];
    const auto& k = inputs[1];
    const int operands = bits_ == 0 ? 3 : 7;
    auto problem = [&](auto keys, auto values) {
      return Problem<decltype(keys)>{
          operand(q),
          keys,
          values,
          has_mask_ ? mask_view(inputs[operands]) : MaskView{},
          has_mask_,
          causal_,
          scale_,
          q.shape(0),
          q.shape(1),
          k.shape(1),
          q.shape(2),
          keys_,
          q.shape(3),
          out.data<float>()};
    };
    if (bits_ == 0) {
      auto p = problem(FloatRows{operand(k)}, FloatRows{operand(inputs[2])});
      encoder.dispatch([p]() { run(p); });
    } else {
      auto p = problem(
          quant_rows(inputs[1], inputs[2], inputs[3], bits_, group_size_),
          quant_rows(inputs[4], inputs[5], inputs[6], bits_, group_size_));
      encoder.dispatch([p]() { run(p); });
    }
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("[mlx_bun_cpu_attention] runs on the CPU only");
  }

  // Gradients through MLX's own formulation.
  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>&) override {
    if (bits_ != 0) {
      throw std::invalid_argument(
          "[mlx_bun_cpu_attention] no gradient through a quantized KV cache");
    }
    const float scale = scale_;
    const bool causal = causal_;
    const bool has_mask = has_mask_;
    auto s = stream();
    std::optional<mx::array> mask;
    if (has_mask) mask = primals[3];
    auto fun = [=](const std::vector<mx::array>& in) {
      auto o = mx::fast::scaled_dot_product_attention(
          in[0], in[1], in[2], scale, causal ? "causal" : (has_mask ? "array" : ""), mask, {},
          false, s);
      o = mx::transpose(o, {0, 2, 1, 3}, s);
      return std::vector<mx::array>{
          mx::reshape(o, {o.shape(0), o.shape(1), o.shape(2) * o.shape(3)}, s)};
    };
    auto attended = [&](const mx::array& a) {
      if (a.shape(2) == keys_) return a;
      return mx::slice(a, {0, 0, 0, 0}, {a.shape(0), a.shape(1), keys_, a.shape(3)}, s);
    };
    const std::vector<mx::array> operands{primals[0], attended(primals[1]), attended(primals[2])};
    auto grads = mx::vjp(fun, operands, cotangents).second;
    std::vector<mx::array> result;
    for (int a : argnums) {
      if (a > 2) {
        throw std::invalid_argument("[mlx_bun_cpu_attention] no gradient with respect to the mask");
      }
      const auto& primal = primals[a];
      if (a > 0 && primal.shape(2) > keys_) {
        // Positions past the attended ones do not reach the output.
        const auto& g = grads[a];
        auto rest = mx::zeros(
            {g.shape(0), g.shape(1), primal.shape(2) - keys_, g.shape(3)}, g.dtype(), s);
        result.push_back(mx::concatenate({g, rest}, 2, s));
      } else {
        result.push_back(grads[a]);
      }
    }
    return result;
  }

  const char* name() const override {
    return "MlxBunCpuAttention";
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const CpuAttention&>(other);
    return scale_ == o.scale_ && causal_ == o.causal_ && has_mask_ == o.has_mask_ &&
           bits_ == o.bits_ && group_size_ == o.group_size_ && keys_ == o.keys_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const auto& q = inputs[0];
    return {{q.shape(0), q.shape(2), q.shape(1) * q.shape(3)}};
  }

 private:
  float scale_;
  bool causal_;
  bool has_mask_;
  int bits_;
  int group_size_;
  int keys_;
};

}  // namespace
}  // namespace mlx_bun

namespace mlx_bun {
namespace {

// The attention node over `kv` (keys then values: two float32 arrays, or
// two quantized triples) of `keys` positions in `kv_heads` heads.
mx::array make_attention(
    const mx::array& q,
    std::vector<mx::array> kv,
    int kv_heads,
    int keys,
    mlx_array mask,
    float scale,
    bool causal,
    int bits,
    int group_size) {
  if (q.dtype() != mx::float32 || q.ndim() != 4) {
    throw std::invalid_argument("[mlx_bun_cpu_attention] needs float32 queries [B, heads, L, D]");
  }
  const int heads = q.shape(1);
  if (kv_heads == 0 || heads % kv_heads != 0) {
    throw std::invalid_argument(
        "[mlx_bun_cpu_attention] the key heads must divide the query heads");
  }
  if (causal && q.shape(2) > keys) {
    throw std::invalid_argument("[mlx_bun_cpu_attention] more causal queries than keys");
  }
  std::vector<mx::array> inputs{q};
  for (auto& a : kv) inputs.push_back(std::move(a));
  const bool has_mask = mask.ctx != nullptr;
  if (has_mask) {
    const auto& ma = mlx_array_get_(mask);
    const int lead = 4 - static_cast<int>(ma.ndim());
    const int want[4] = {q.shape(0), heads, q.shape(2), keys};
    bool fits = ma.dtype() == mx::bool_ && lead >= 0;
    for (int d = 0; fits && d < static_cast<int>(ma.ndim()); ++d) {
      fits = ma.shape(d) == 1 || ma.shape(d) == want[lead + d];
    }
    if (!fits) {
      throw std::invalid_argument(
          "[mlx_bun_cpu_attention] the mask must be boolean, broadcastable to [B, heads, L, S]");
    }
    inputs.push_back(ma);
  }
  mx::Shape shape{q.shape(0), q.shape(2), heads * q.shape(3)};
  return mx::array(
      std::move(shape),
      mx::float32,
      std::make_shared<CpuAttention>(
          mx::default_stream(mx::Device::cpu), scale, causal, has_mask, bits, group_size, keys),
      std::move(inputs));
}

}  // namespace
}  // namespace mlx_bun

extern "C" int mlx_bun_cpu_attention(
    mlx_array* res,
    mlx_array q,
    mlx_array k,
    mlx_array v,
    mlx_array mask,
    float scale,
    int causal,
    int attended) {
  try {
    const auto& qa = mlx_array_get_(q);
    const auto& ka = mlx_array_get_(k);
    const auto& va = mlx_array_get_(v);
    for (const auto* a : {&ka, &va}) {
      if (a->dtype() != mx::float32 || a->ndim() != 4) {
        throw std::invalid_argument(
            "[mlx_bun_cpu_attention] needs float32 keys and values [B, kv_heads, S, D]");
      }
    }
    if (ka.shape() != va.shape() || qa.ndim() != 4 || ka.shape(0) != qa.shape(0) ||
        ka.shape(3) != qa.shape(3)) {
      throw std::invalid_argument(
          "[mlx_bun_cpu_attention] keys and values must be [B, kv_heads, S, D] like the queries");
    }
    if (attended > ka.shape(2)) {
      throw std::invalid_argument("[mlx_bun_cpu_attention] more keys than the cache holds");
    }
    const int positions = attended > 0 ? attended : ka.shape(2);
    mlx_array_set_(
        *res,
        mlx_bun::make_attention(
            qa, {ka, va}, ka.shape(1), positions, mask, scale, causal != 0, 0, 0));
    return 0;
  } catch (const std::exception& e) {
    mlx_bun::last_error = e.what();
    return 1;
  }
}

extern "C" int mlx_bun_cpu_quantized_attention(
    mlx_array* res,
    mlx_array q,
    const mlx_array* keys,
    const mlx_array* values,
    mlx_array mask,
    float scale,
    int causal,
    int bits,
    int group_size,
    int attended) {
  try {
    const auto& qa = mlx_array_get_(q);
    if (bits != 2 && bits != 4 && bits != 8) {
      throw std::invalid_argument("[mlx_bun_cpu_attention] quantized keys of 2, 4 or 8 bits only");
    }
    if (qa.ndim() != 4 || group_size <= 0 || qa.shape(3) % group_size != 0 ||
        group_size * bits % 32 != 0) {
      throw std::invalid_argument(
          "[mlx_bun_cpu_attention] the head size must be a multiple of the group size");
    }
    std::vector<mx::array> kv;
    for (const auto* triple : {keys, values}) {
      const auto& packed = mlx_array_get_(triple[0]);
      const auto& scales = mlx_array_get_(triple[1]);
      const auto& biases = mlx_array_get_(triple[2]);
      const mx::Shape want_packed{qa.shape(0), packed.ndim() == 4 ? packed.shape(1) : 0,
                                  packed.ndim() == 4 ? packed.shape(2) : 0,
                                  qa.shape(3) * bits / 32};
      const mx::Shape want_groups{want_packed[0], want_packed[1], want_packed[2],
                                  qa.shape(3) / group_size};
      if (packed.dtype() != mx::uint32 || scales.dtype() != mx::float32 ||
          biases.dtype() != mx::float32 || packed.shape() != want_packed ||
          scales.shape() != want_groups || biases.shape() != want_groups) {
        throw std::invalid_argument(
            "[mlx_bun_cpu_attention] quantized keys and values must be uint32 [B, kv_heads, S, "
            "D * bits / 32] with float32 scales and biases [B, kv_heads, S, D / group_size]");
      }
      kv.push_back(packed);
      kv.push_back(scales);
      kv.push_back(biases);
    }
    if (kv[0].shape() != kv[3].shape()) {
      throw std::invalid_argument("[mlx_bun_cpu_attention] keys and values differ in shape");
    }
    const int kv_heads = kv[0].shape(1);
    const int stored = kv[0].shape(2);
    if (attended > stored) {
      throw std::invalid_argument("[mlx_bun_cpu_attention] more keys than the cache holds");
    }
    const int positions = attended > 0 ? attended : stored;
    mlx_array_set_(
        *res,
        mlx_bun::make_attention(
            qa, std::move(kv), kv_heads, positions, mask, scale, causal != 0, bits, group_size));
    return 0;
  } catch (const std::exception& e) {
    mlx_bun::last_error = e.what();
    return 1;
  }
}
