// Quantized matrix times a few vectors on the CPU, reading MLX's affine
// quantized layout directly.
//
// y[m, n] = sum_k x[m, k] * (scale[n, g(k)] * q[n, k] + bias[n, g(k)])
//
// where q[n, k] is the k-th `bits`-wide unsigned field of row n of `w`
// (uint32 words, element j of a word in bits [j*bits, (j+1)*bits)), and
// g(k) = k / group_size. This is `mx.quantized_matmul(x, w, scales, biases,
// transpose=True)` for float32 activations, scales and biases.
//
// The kernel is written for few rows (decode, small batches, speculative
// verification): the weights are streamed from memory once for all rows and
// dequantized in registers. No MLX headers here, so the file builds alone.

#pragma once

#include <cstddef>
#include <cstdint>

namespace mlx_bun {

// The integer dot products quantize activations per this many elements,
// whatever the weights' group size: per weight group they lose too much
// (docs/cpu-kernel.md).
constexpr int kInt8ActivationGroup = 16;

// How far ahead of its reads a product prefetches each weight row, and the
// scales and biases in step with it. A decode product reads every weight once
// from memory, a few rows side by side; without this, one core read the 8-bit
// output head at about 6 GB/s (docs/cpu-kernel.md). 8-bit rows, read twice as
// fast per operation, go further ahead and into L2 (prefetcht1): measured on
// the 49,152 x 576 head, one thread, 2.0-2.5 ms against 3.3-3.8 with the
// 4-bit rows' 4 KiB into L1, which was the faster choice for those.
// Internal linkage: each instruction set's translation unit keeps its own.
namespace {

template <int BITS>
constexpr size_t kPrefetchBytes = BITS == 8 ? 8192 : 4096;

template <int BITS>
inline void prefetch(const void* at) {
  __builtin_prefetch(at, 0, BITS == 8 ? 2 : 3);
}

// The weight line kPrefetchBytes ahead of `at` in its row.
template <int BITS>
inline void prefetch_row(const uint8_t* at) {
  prefetch<BITS>(at + kPrefetchBytes<BITS>);
}

// A row's scales and biases, prefetched once per cache line of them (every
// 16 groups) as far ahead as its weights are.
template <int BITS>
inline void prefetch_group_params(const float* scales, const float* biases, int group,
                                  int group_size) {
  if (group % 16 == 0) {
    const size_t ahead = kPrefetchBytes<BITS> / static_cast<size_t>(group_size * BITS / 8);
    prefetch<BITS>(scales + group + ahead);
    prefetch<BITS>(biases + group + ahead);
  }
}

}  // namespace

struct QmvArgs {
  const float* x;         // [m, k], row-major
  const uint32_t* w;      // [n, k * bits / 32]
  const float* scales;    // [n, k / group_size]
  const float* biases;    // [n, k / group_size]
  float* y;               // [m, n], row-major
  int m;
  int n;
  int k;
  int group_size;         // 32, 64 or 128
  int bits;               // 4 or 8
  // x with each chunk of 32 in the order the instruction set's 4-bit path
  // unpacks weights, when it has one (set by qmv_products; else null).
  const float* x_pairs = nullptr;
  // x quantized to int8 per 16 elements, in the order the weights unpack,
  // with each 16's scale ([m, k / kInt8ActivationGroup]) and each weight group's exact sum
  // ([m, k / group_size]), when the settings ask for integer dot products
  // and the CPU has them (set by qmv_products; else null, and the product is
  // computed in float).
  const int8_t* xq = nullptr;
  const float* xq_scales = nullptr;
  const float* x_sums = nullptr;
};

// True when the kernel handles this configuration.
bool qmv_supported(int k, int group_size, int bits);

// Computes y for output columns [n0, n1) on the calling thread.
void qmv_range(const QmvArgs& a, int n0, int n1);

// Computes all of y, splitting the output columns over the kernel's threads
// (the caller's thread takes part).
void qmv(const QmvArgs& a);

// Computes two products of the same input (a.x == b.x) in one split over
// the kernel's threads: both outputs, as qmv() would give each.
void qmv_pair(const QmvArgs& a, const QmvArgs& b);

// Computes `count` products of the same input in one split over the
// kernel's threads: every output as qmv() would give it.
void qmv_products(const QmvArgs* const* products, int count);

// Runs fn(ctx, t) for every t in [0, tasks) on the kernel's threads (the
// caller's included) and returns when all are done.
void parallel_tasks(int tasks, void (*fn)(void* ctx, int task), void* ctx);

// Calls of qmv() so far and the wall time spent in them, for one bit width.
void qmv_stats(int bits, uint64_t* calls, uint64_t* ns);

// The instruction set the kernel dispatches to: "avx512", "avx2", "neon" or
// "scalar", the widest the CPU has or the configured one allows.
const char* qmv_isa();

// Number of threads (caller included) that qmv() uses.
int qmv_threads();

// Threads (0: the cores, at most 8), helper spin time, the widest
// instruction set ("" for any) and the most activation rows of a product
// that quantizes its activations to int8 for integer dot products (not
// MLX's arithmetic; 0: none); takes effect only before the first product.
void qmv_configure(int threads, int spin_us, const char* isa, int int8_rows);

// The integer dot products in use: "avx512-vnni" (4- and 8-bit weights),
// "avx512bw" (4-bit weights), or "" when off or the CPU has neither.
const char* qmv_int8();

}  // namespace mlx_bun
