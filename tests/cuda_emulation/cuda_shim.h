// Just enough of CUDA for running a kernel of kernels/cuda on the CPU, one
// OS thread per CUDA thread: blocks run one after another, a warp's
// shuffles and a block's __syncthreads are barriers. Only the tests use it
// (tests/cuda_attention_emulated.rs), so that a kernel's indexing and
// arithmetic are checked on machines without a GPU.
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
  unsigned x = 0, y = 0, z = 0;
};

inline thread_local dim3 threadIdx;
inline dim3 blockIdx;
inline dim3 gridDim;
inline dim3 blockDim;

struct EmulatedWarp {
  float slot[32];
  std::barrier<> turn{32};
};

inline thread_local EmulatedWarp* emulated_warp = nullptr;
inline std::barrier<>* emulated_block = nullptr;

inline float __shfl_xor_sync(unsigned, float v, int offset) {
  const int lane = threadIdx.x % 32;
  emulated_warp->slot[lane] = v;
  emulated_warp->turn.arrive_and_wait();
  const float other = emulated_warp->slot[lane ^ offset];
  emulated_warp->turn.arrive_and_wait();
  return other;
}

inline void __syncthreads() { emulated_block->arrive_and_wait(); }

inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }

inline float __int_as_float(int bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

struct uint4 {
  unsigned x, y, z, w;
};
struct float2 {
  float x, y;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
template <typename P>
inline P __ldg(const P* p) {
  return *p;
}

// CUDA's byte permute: byte i of the result is byte (s >> 4i) & 7 of y:x.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t both = (static_cast<uint64_t>(y) << 32) | x;
  unsigned out = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned pick = (s >> (4 * i)) & 7u;
    out |= static_cast<unsigned>((both >> (8 * pick)) & 0xffu) << (8 * i);
  }
  return out;
}

// IEEE half with round-to-nearest-even conversions (subnormals included).
struct __half {
  uint16_t bits;
  __half() = default;
  __half(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const int exponent = static_cast<int>((u >> 23) & 0xffu) - 127 + 15;
    uint32_t mantissa = u & 0x7fffffu;
    if (((u >> 23) & 0xffu) == 0xffu) {
      bits = static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u : 0u));
      return;
    }
    if (exponent >= 31) {
      bits = static_cast<uint16_t>(sign | 0x7c00u);
      return;
    }
    if (exponent <= 0) {
      if (exponent < -10) {
        bits = static_cast<uint16_t>(sign);
        return;
      }
      mantissa |= 0x800000u;
      const int shift = 14 - exponent;
      uint32_t half = mantissa >> shift;
      const uint32_t rest = mantissa & ((1u << shift) - 1);
      const uint32_t midpoint = 1u << (shift - 1);
      if (rest > midpoint || (rest == midpoint && (half & 1u))) {
        ++half;
      }
      bits = static_cast<uint16_t>(sign | half);
      return;
    }
    uint32_t half = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) {
      ++half;
    }
    bits = static_cast<uint16_t>(sign | half);
  }
  operator float() const {
    const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    const uint32_t exponent = (bits >> 10) & 0x1fu;
    const uint32_t mantissa = bits & 0x3ffu;
    float f;
    if (exponent == 0) {
      f = std::ldexp(static_cast<float>(mantissa), -24);
      return sign ? -f : f;
    }
    const uint32_t u = exponent == 31 ? sign | 0x7f800000u | (mantissa << 13)
                                      : sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
};

struct __half2 {
  __half x, y;
};

inline __half __ushort_as_half(unsigned short bits) {
  __half h;
  h.bits = bits;
  return h;
}
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline float2 __half22float2(__half2 h) { return {static_cast<float>(h.x), static_cast<float>(h.y)}; }
// A half FMA: the product of two halves is exact in float, then one
// float rounding of the sum before the half's (CUDA rounds once).
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return {__half(std::fma(static_cast<float>(a.x), static_cast<float>(b.x), static_cast<float>(c.x))),
          __half(std::fma(static_cast<float>(a.y), static_cast<float>(b.y), static_cast<float>(c.y)))};
}

// bfloat16 with CUDA's conversions: round to nearest even from float.
struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = static_cast<uint16_t>(u >> 16);
  }
  operator float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
};

// Runs `grid` blocks of `threads` threads (a multiple of 32), one block
// after another, every thread calling `body`.
inline void emulate_grid(dim3 grid, unsigned threads, const std::function<void()>& body) {
  gridDim = grid;
  blockDim = {threads, 1, 1};
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        std::barrier<> block(threads);
        emulated_block = &block;
        std::vector<EmulatedWarp> warps(threads / 32);
        std::vector<std::thread> running;
        for (unsigned t = 0; t < threads; ++t) {
          running.emplace_back([&, t] {
            threadIdx = {t, 0, 0};
            emulated_warp = &warps[t / 32];
            body();
          });
        }
        for (auto& thread : running) {
          thread.join();
        }
      }
    }
  }
}
