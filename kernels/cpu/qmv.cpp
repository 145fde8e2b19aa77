// Dispatch to the widest instruction set the CPU has, the portable scalar
// kernel, and the small thread pool that splits the output columns.

#include "qmv.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "qmv_impl.h"

namespace mlx_bun {

#if defined(MLX_BUN_HAVE_AVX512)
void qmv_range_avx512(const QmvArgs& a, int n0, int n1);
void split_pairs_avx512(const float* x, float* out, size_t chunks);
void qmv_range_int8_vnni(const QmvArgs& a, int n0, int n1);
void quantize_int8_vnni(const float* x, int m, int k, int group_size, bool paired, int8_t* xq,
                        float* scales, float* sums);
void qmv_range_int8_avx512(const QmvArgs& a, int n0, int n1);
void quantize_int8_avx512(const float* x, int m, int k, int group_size, bool paired, int8_t* xq,
                          float* scales, float* sums);
#endif
#if defined(MLX_BUN_HAVE_AVX2)
void qmv_range_avx2(const QmvArgs& a, int n0, int n1);
#endif
#if defined(__aarch64__)
void qmv_range_neon(const QmvArgs& a, int n0, int n1);
#endif

namespace {

struct Scalar {
  using reg = float;
  static constexpr int LANES = 1;
  static constexpr bool kNibblePairs = false;
  static reg zero() { return 0.0f; }
  static reg load(const float* p) { return *p; }
  static reg set1(float v) { return v; }
  static void store(float* p, reg v) { *p = v; }
  static reg fma(reg a, reg b, reg c) { return a * b + c; }
  static float hsum(reg v) { return v; }

  template <int BITS>
  static void dequant(const uint8_t* p, reg s, reg b, reg out[32]) {
    for (int i = 0; i < 32; ++i) {
      const uint32_t q = BITS == 4 ? (p[i / 2] >> (4 * (i % 2))) & 0x0F : p[i];
      out[i] = s * static_cast<float>(q) + b;
    }
  }
};

void qmv_range_scalar(const QmvArgs& a, int n0, int n1) {
  qmv_range_generic<Scalar, 1>(a, n0, n1);
}

using RangeFn = void (*)(const QmvArgs&, int, int);
using SplitPairsFn = void (*)(const float* x, float* out, size_t chunks);

struct Isa {
  const char* name;
  RangeFn fn;
  // Reorders activations for the 4-bit path, when it unpacks in pairs.
  SplitPairsFn split_pairs = nullptr;
};

// Set by qmv_configure before the first product; read once.
std::string configured_isa;
int configured_threads = 0;
int configured_spin_us = 50;
int configured_int8_rows = 0;

Isa pick_isa() {
  const char* forced = configured_isa.c_str();
  auto allowed = [&](const char* name) {
    if (forced == nullptr || *forced == '\0') return true;
    // A forced ISA allows itself and everything narrower.
    const char* order[] = {"scalar", "neon", "avx2", "avx512"};
    int want = -1, have = -1;
    for (int i = 0; i < 4; ++i) {
      if (std::strcmp(order[i], forced) == 0) want = i;
      if (std::strcmp(order[i], name) == 0) have = i;
    }
    return want < 0 || have <= want;
  };
#if defined(MLX_BUN_HAVE_AVX512)
  if (allowed("avx512") && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw")) {
    return {"avx512", qmv_range_avx512, split_pairs_avx512};
  }
#endif
#if defined(MLX_BUN_HAVE_AVX2)
  if (allowed("avx2") && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma")) {
    return {"avx2", qmv_range_avx2};
  }
#endif
#if defined(__aarch64__)
  if (allowed("neon")) {
    return {"neon", qmv_range_neon};
  }
#endif
  (void)allowed;
  return {"scalar", qmv_range_scalar};
}

const Isa& isa() {
  static const Isa chosen = pick_isa();
  return chosen;
}

using QuantizeFn = void (*)(const float* x, int m, int k, int group_size, bool paired,
                            int8_t* xq, float* scales, float* sums);

// The integer dot products, when the settings allow them and the CPU has
// them.
struct Int8 {
  const char* name = "";
  RangeFn fn = nullptr;
  QuantizeFn quantize = nullptr;
  bool eight_bit = false;

  // Whether a product of this shape takes them: whole runs of 64 weights,
  // each in one group or in two of 32.
  bool takes(const QmvArgs& a) const {
    return fn != nullptr && a.m <= configured_int8_rows && a.k % 64 == 0 &&
           (a.bits == 4 || eight_bit);
  }
};

Int8 pick_int8() {
  if (configured_int8_rows <= 0 || std::strcmp(isa().name, "avx512") != 0) return {};
#if defined(MLX_BUN_HAVE_AVX512)
  if (__builtin_cpu_supports("avx512vnni")) {
    return {"avx512-vnni", qmv_range_int8_vnni, quantize_int8_vnni, true};
  }
  return {"avx512bw", qmv_range_int8_avx512, quantize_int8_avx512, false};
#else
  return {};
#endif
}

const Int8& int8() {
  static const Int8 chosen = pick_int8();
  return chosen;
}

// The kernel for one product: integer dot products when its activations
// were quantized, else the float one.
inline void run_range(const QmvArgs& a, int n0, int n1) {
  if (a.xq != nullptr) {
    int8().fn(a, n0, n1);
  } else {
    isa().fn(a, n0, n1);
  }
}

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Helper threads that take tasks of one run at a time; the caller works too.
// A run is an epoch: tasks are claimed from one 64-bit word holding the epoch
// and the next task index, so a helper late from an older run cannot claim
// tasks of a newer one. Between runs helpers spin briefly (runs come in
// quick succession during a forward pass) and then sleep on the word.
class Pool {
 public:
  using TaskFn = void (*)(void* ctx, int task);

  explicit Pool(int threads) {
    spin_ = std::chrono::microseconds(configured_spin_us);
    for (int i = 1; i < threads; ++i) {
      std::thread([this] { helper(); }).detach();
    }
    threads_ = threads;
  }

  int threads() const { return threads_; }

  void run(int tasks, TaskFn fn, void* ctx) {
    if (threads_ <= 1 || tasks <= 1) {
      for (int t = 0; t < tasks; ++t) fn(ctx, t);
      return;
    }
    std::lock_guard<std::mutex> lock(run_mutex_);
    fn_ = fn;
    ctx_ = ctx;
    tasks_.store(tasks, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint32_t epoch = ++epoch_;
    state_.store(static_cast<uint64_t>(epoch) << 32, std::memory_order_release);
    state_.notify_all();
    work(epoch);
    // Tasks still running on helpers: wait for them, yielding the core in
    // case a helper was preempted while holding one.
    for (int spins = 0; done_.load(std::memory_order_acquire) < tasks; ++spins) {
      cpu_relax();
      if (spins % 64 == 63) std::this_thread::yield();
    }
  }

 private:
  bool claim(uint32_t epoch, int& task) {
    uint64_t s = state_.load(std::memory_order_acquire);
    for (;;) {
      if (static_cast<uint32_t>(s >> 32) != epoch) return false;
      const uint32_t index = static_cast<uint32_t>(s);
      if (index >= static_cast<uint32_t>(tasks_.load(std::memory_order_relaxed))) {
        return false;
      }
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) {
        task = static_cast<int>(index);
        return true;
      }
    }
  }

  void work(uint32_t epoch) {
    int task;
    while (claim(epoch, task)) {
      fn_(ctx_, task);
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void helper() {
    uint32_t seen = 0;
    for (;;) {
      uint64_t s = state_.load(std::memory_order_acquire);
      const uint32_t epoch = static_cast<uint32_t>(s >> 32);
      if (epoch != seen) {
        seen = epoch;
        work(epoch);
        continue;
      }
      // Spin with yields: on an idle core the next run is picked up within
      // microseconds; on a busy machine the yields hand the core over.
      const auto until = std::chrono::steady_clock::now() + spin_;
      bool woke = false;
      while (!woke && std::chrono::steady_clock::now() < until) {
        for (int i = 0; i < 32; ++i) {
          cpu_relax();
        }
        woke = static_cast<uint32_t>(state_.load(std::memory_order_acquire) >> 32) != seen;
        if (!woke) std::this_thread::yield();
      }
      if (!woke) {
        state_.wait(s, std::memory_order_acquire);
      }
    }
  }

  int threads_ = 1;
  std::chrono::microseconds spin_{0};
  std::mutex run_mutex_;
  uint32_t epoch_ = 0;
  std::atomic<uint64_t> state_{0};
  std::atomic<int> tasks_{0};
  std::atomic<int> done_{0};
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
};

Pool& pool() {
  // Leaked on purpose: helpers sleep in it until the process exits.
  static Pool* p = [] {
    int hw = static_cast<int>(std::thread::hardware_concurrency());
    if (hw <= 0) hw = 1;
    int threads = configured_threads > 0 ? configured_threads : (hw < 8 ? hw : 8);
    if (threads < 1) threads = 1;
    return new Pool(threads);
  }();
  return *p;
}

// Products of one input split into tasks of `rows_per_task` output rows,
// the tasks of products[0] first.
struct Split {
  const QmvArgs* const* products;
  int count;
  int rows_per_task;
};

void run_task(void* ctx, int task) {
  const Split& s = *static_cast<const Split*>(ctx);
  for (int i = 0; i < s.count; ++i) {
    const QmvArgs& a = *s.products[i];
    const int tasks = (a.n + s.rows_per_task - 1) / s.rows_per_task;
    if (task < tasks) {
      const int n0 = task * s.rows_per_task;
      const int n1 = n0 + s.rows_per_task < a.n ? n0 + s.rows_per_task : a.n;
      run_range(a, n0, n1);
      return;
    }
    task -= tasks;
  }
}

}  // namespace

bool qmv_supported(int k, int group_size, int bits) {
  return (bits == 4 || bits == 8) &&
         (group_size == 32 || group_size == 64 || group_size == 128) && k > 0 &&
         k % group_size == 0;
}

void qmv_range(const QmvArgs& a, int n0, int n1) {
  run_range(a, n0, n1);
}

namespace {
// Calls and nanoseconds spent in qmv() and qmv_pair(), by bit width (index
// 0: 4, 1: 8).
std::atomic<uint64_t> stat_calls[2];
std::atomic<uint64_t> stat_ns[2];

// products with x_pairs set, when the instruction set wants paired
// activations for a 4-bit product: reordered once here rather than once per
// task.
class PairedProducts {
 public:
  PairedProducts(const QmvArgs* const* products, int count) : products_(products) {
    bool four_bit = false;
    for (int i = 0; i < count; ++i) {
      four_bit = four_bit || (products[i]->bits == 4 && products[i]->xq == nullptr);
    }
    if (!four_bit || isa().split_pairs == nullptr) return;
    const QmvArgs& first = *products[0];
    const size_t floats = static_cast<size_t>(first.m) * first.k;
    static thread_local std::vector<float> paired;
    if (paired.size() < floats) paired.resize(floats);
    isa().split_pairs(first.x, paired.data(), floats / 32);
    copies_.resize(count);
    pointers_.resize(count);
    for (int i = 0; i < count; ++i) {
      copies_[i] = *products[i];
      copies_[i].x_pairs = paired.data();
      pointers_[i] = &copies_[i];
    }
    products_ = pointers_.data();
  }

  const QmvArgs* const* get() const { return products_; }

 private:
  const QmvArgs* const* products_;
  std::vector<QmvArgs> copies_;
  std::vector<const QmvArgs*> pointers_;
};

// products with their activations quantized to int8, where the integer dot
// products are on and take them: once per layout (4-bit paired or in order,
// group size) for all products of the input.
class Int8Products {
 public:
  Int8Products(const QmvArgs* const* products, int count) : products_(products) {
    const Int8& dot = int8();
    if (dot.fn == nullptr) return;
    copies_.resize(count);
    pointers_.resize(count);
    for (int i = 0; i < count; ++i) {
      copies_[i] = *products[i];
      pointers_[i] = &copies_[i];
      if (!dot.takes(copies_[i])) continue;
      const Layout& layout = prepare(dot, copies_[i]);
      copies_[i].xq = layout.xq;
      copies_[i].xq_scales = layout.scales;
      copies_[i].x_sums = layout.sums;
    }
    products_ = pointers_.data();
  }

  const QmvArgs* const* get() const { return products_; }

 private:
  struct Layout {
    bool paired;
    int group_size;
    const int8_t* xq;
    const float* scales;
    const float* sums;
  };

  const Layout& prepare(const Int8& dot, const QmvArgs& a) {
    const bool paired = a.bits == 4;
    for (const auto& l : layouts_) {
      if (l.paired == paired && l.group_size == a.group_size) return l;
    }
    // One set of this thread's buffers per layout, reused across calls.
    struct Buffers {
      std::vector<int8_t> quantized;
      std::vector<float> scales;
      std::vector<float> sums;
    };
    static thread_local std::vector<Buffers> buffers;
    if (buffers.size() <= layouts_.size()) buffers.resize(layouts_.size() + 1);
    Buffers& b = buffers[layouts_.size()];
    const size_t values = static_cast<size_t>(a.m) * a.k;
    const size_t groups = values / a.group_size;
    const size_t activation_groups = values / kInt8ActivationGroup;
    if (b.quantized.size() < values) b.quantized.resize(values);
    if (b.scales.size() < activation_groups) b.scales.resize(activation_groups);
    if (b.sums.size() < groups) b.sums.resize(groups);
    dot.quantize(a.x, a.m, a.k, a.group_size, paired, b.quantized.data(), b.scales.data(),
                 b.sums.data());
    layouts_.push_back({paired, a.group_size, b.quantized.data(), b.scales.data(), b.sums.data()});
    return layouts_.back();
  }

  const QmvArgs* const* products_;
  std::vector<QmvArgs> copies_;
  std::vector<const QmvArgs*> pointers_;
  std::vector<Layout> layouts_;
};

}  // namespace

void qmv_products(const QmvArgs* const* given, int count) {
  const auto start = std::chrono::steady_clock::now();
  const Int8Products quantized(given, count);
  const PairedProducts paired(quantized.get(), count);
  const QmvArgs* const* products = paired.get();
  Pool& p = pool();
  long long weights = 0;
  int total_n = 0;
  bool narrow = false;
  for (int i = 0; i < count; ++i) {
    weights += static_cast<long long>(products[i]->n) * products[i]->k;
    total_n += products[i]->n;
    narrow = narrow || products[i]->n < 32;
  }
  // Below this many weights a wake-up costs more than the split gains.
  if (p.threads() <= 1 || weights < (1LL << 16) || narrow) {
    for (int i = 0; i < count; ++i) run_range(*products[i], 0, products[i]->n);
  } else {
    // A few tasks per thread balance the load; multiples of 4 rows keep
    // every task on the blocked path.
    const int target = p.threads() * 4;
    int rows = (total_n + target - 1) / target;
    rows = (rows + 3) / 4 * 4;
    if (rows < 16) rows = 16;
    int tasks = 0;
    for (int i = 0; i < count; ++i) tasks += (products[i]->n + rows - 1) / rows;
    Split split{products, count, rows};
    p.run(tasks, run_task, &split);
  }
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  const int i = products[0]->bits == 8 ? 1 : 0;
  stat_calls[i].fetch_add(1, std::memory_order_relaxed);
  stat_ns[i].fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
}

void qmv(const QmvArgs& a) {
  const QmvArgs* products[] = {&a};
  qmv_products(products, 1);
}

void qmv_pair(const QmvArgs& a, const QmvArgs& b) {
  const QmvArgs* products[] = {&a, &b};
  qmv_products(products, 2);
}

void qmv_stats(int bits, uint64_t* calls, uint64_t* ns) {
  const int i = bits == 8 ? 1 : 0;
  *calls = stat_calls[i].load(std::memory_order_relaxed);
  *ns = stat_ns[i].load(std::memory_order_relaxed);
}

void parallel_tasks(int tasks, void (*fn)(void* ctx, int task), void* ctx) {
  pool().run(tasks, fn, ctx);
}

void qmv_configure(int threads, int spin_us, const char* isa, int int8_rows) {
  configured_threads = threads;
  configured_spin_us = spin_us;
  configured_isa = isa == nullptr ? "" : isa;
  configured_int8_rows = int8_rows;
}

const char* qmv_int8() {
  return int8().name;
}

const char* qmv_isa() {
  return isa().name;
}

int qmv_threads() {
  return pool().threads();
}

}  // namespace mlx_bun
