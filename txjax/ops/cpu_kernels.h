// What txjax's CPU kernels (cpu_attention.cc, cpu_transpose.cc) share: 16-wide float vectors
// written with GCC/Clang vector extensions (no intrinsics: the compiler lowers them to the
// CPU's own width), and a parallel loop over XLA's intra-op thread pool.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));
static inline v16 load(const float* p) { v16 v; std::memcpy(&v, p, 64); return v; }
static inline void store(float* p, v16 v) { std::memcpy(p, &v, 64); }
// One broadcast. (`v16{} + x` would add +0.0, which the compiler may not drop: -0.0 + 0.0 is +0.0.)
static inline v16 splat(float x) { return v16{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
static inline int round16(int x) { return (x + 15) / 16 * 16; }

// The sum and the maximum of a vector's lanes, as a tree of halves (the compiler's lane extracts):
// four dependent steps instead of fifteen.
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
template <typename Half, typename V, typename F>
static inline Half fold(V v, F f) {
  Half lo, hi;
  std::memcpy(&lo, &v, sizeof lo);
  std::memcpy(&hi, (const char*)&v + sizeof lo, sizeof hi);
  return f(lo, hi);
}
static inline float hsum(v16 v) {
  auto add = [](auto a, auto b) { return a + b; };
  v4 x = fold<v4>(fold<v8>(v, add), add);
  return (x[0] + x[2]) + (x[1] + x[3]);
}
static inline float hmax(v16 v) {
  auto max = [](auto a, auto b) { return a > b ? a : b; };
  v4 x = fold<v4>(fold<v8>(v, max), max);
  return std::max(std::max(x[0], x[2]), std::max(x[1], x[3]));
}

// Calls work(state, i) for every i in [0, items) on the caller and the pool's threads, each thread
// with its own state, made by make() before its first item. Items are taken in order. Returns when
// every item is done; a task the pool starts late finds no item left and touches only its copies.
template <typename Make, typename Work>
static void parallel_for(ffi::ThreadPool& pool, int items, Make make, Work work) {
  struct Counters { std::atomic<int> next{0}, done{0}; };
  auto counters = std::make_shared<Counters>();
  auto run = [counters, items, make, work]() {  // by value: a late task may outlive the call
    std::optional<decltype(make())> state;
    for (int i; (i = counters->next.fetch_add(1)) < items;) {
      if (!state) state.emplace(make());
      work(*state, i);
      counters->done.fetch_add(1, std::memory_order_release);
    }
  };
  int helpers = std::min<int64_t>(pool.num_threads(), items) - 1;
  for (int t = 0; t < helpers; ++t) pool.Schedule([counters, items, run]() {
    if (counters->next.load() < items) run();
  });
  run();
  while (counters->done.load(std::memory_order_acquire) < items) std::this_thread::yield();
}
