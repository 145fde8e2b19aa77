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

inline float __int_as_float(int bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
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
