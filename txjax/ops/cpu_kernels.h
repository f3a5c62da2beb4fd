// What txjax's CPU kernels (cpu_attention.cc, cpu_norm.cc, cpu_transpose.cc) share: 16-wide
// float vectors written with GCC/Clang vector extensions (no intrinsics: the compiler lowers them
// to the CPU's own width), bfloat16 read and written exactly as XLA converts it, and a parallel
// loop over XLA's intra-op thread pool.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));
static inline v16 load(const float* p) { v16 v; std::memcpy(&v, p, 64); return v; }
static inline void store(float* p, v16 v) { std::memcpy(p, &v, 64); }
// One broadcast. (`v16{} + x` would add +0.0, which the compiler may not drop: -0.0 + 0.0 is +0.0.)
static inline v16 splat(float x) { return v16{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
static inline int round16(int x) { return (x + 15) / 16 * 16; }

// The sum and the maximum of a vector's lanes, as a tree of halves: four dependent steps instead of
// fifteen. The halves are taken by shuffles, which stay in registers (a copy through memory stalls
// each row of a softmax on the store).
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
template <typename F>
static inline v4 fold(v16 v, F f) {
  v8 x = f(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
           __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
  return f(__builtin_shufflevector(x, x, 0, 1, 2, 3), __builtin_shufflevector(x, x, 4, 5, 6, 7));
}
static inline float hsum(v16 v) {
  auto add = [](auto a, auto b) { return a + b; };
  v4 x = fold(v, add);
  return (x[0] + x[2]) + (x[1] + x[3]);
}
static inline float hmax(v16 v) {
  auto max = [](auto a, auto b) { return a > b ? a : b; };
  v4 x = fold(v, max);
  return std::max(std::max(x[0], x[2]), std::max(x[1], x[3]));
}

// e^x (Cephes' expf): x = n ln 2 + r, e^r by a polynomial, 2^n by the exponent's bits. x < -87 (and
// -inf) gives exactly 0; x above 88.37 is taken as 88.37 (e^x near the largest float); NaN stays NaN.
static inline v16 vexp(v16 x) {
  vi16 tiny = x < -87.0f;
  x = tiny ? splat(-87.0f) : x;
  x = x > 88.37f ? splat(88.37f) : x;
  v16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  v16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
  v16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  vi16 bits = (__builtin_convertvector(n, vi16) + 127) << 23;
  v16 scale;
  std::memcpy(&scale, &bits, 64);
  return tiny ? splat(0.f) : p * scale;
}

// 16 lanes of 2- or 4-byte elements: one 16 x 16 tile is 16 of them.
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

// One step of the tile transpose, for rows a (bit S of the row index 0) and c = the row S below:
// the lanes whose bit S is 1 in a trade places with the lanes whose bit S is 0 in c, that is,
// bit S of the row index is swapped with bit S of the column index. Four steps (S = 1, 2, 4, 8)
// swap them all: 64 shuffles for 256 elements, where an element-wise loop reads with a stride.
template <int S, typename V, size_t... L>
static inline void swap_bit(V& a, V& c, std::index_sequence<L...>) {
  V lo = __builtin_shufflevector(a, c, ((L & S) ? 16 + L - S : L)...);
  V hi = __builtin_shufflevector(a, c, ((L & S) ? 16 + L : L + S)...);
  a = lo;
  c = hi;
}

template <int S, typename V>
static inline void swap_bits(V* r) {
  for (int i = 0; i < 16; ++i)
    if (!(i & S)) swap_bit<S>(r[i], r[i + S], std::make_index_sequence<16>());
}

// The 16 x 16 tile at x (rows ldx apart) transposed in registers: r[i] = column i, V the 16-lane
// vector of T.
template <typename V, typename T>
static inline void tile16_columns(const T* x, long ldx, V* r) {
  for (int i = 0; i < 16; ++i) std::memcpy(&r[i], x + i * ldx, sizeof(V));
  swap_bits<1>(r);
  swap_bits<2>(r);
  swap_bits<4>(r);
  swap_bits<8>(r);
}

// The 16 x 16 tile at y (rows ldy apart) = the one at x (rows ldx apart), transposed.
template <typename V, typename T>
static inline void tile16(const T* x, long ldx, T* y, long ldy) {
  V r[16];
  tile16_columns(x, ldx, r);
  for (int i = 0; i < 16; ++i) std::memcpy(y + i * ldy, &r[i], sizeof(V));
}

// Arrays of float32 or bfloat16 (its bits) whose work is float32.
struct bf16 { uint16_t bits; };
static inline float to_f32(float x) { return x; }
static inline float to_f32(bf16 x) {
  uint32_t u = (uint32_t)x.bits << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// x rounded to T: to nearest, ties to even, NaN kept (as XLA's convert).
template <typename T> static inline T from_f32(float x);
template <> inline float from_f32<float>(float x) { return x; }
template <> inline bf16 from_f32<bf16>(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((u >> 16) | 0x40)};
  return {(uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16)};
}

// 16 elements of T as floats, and back (rounded as from_f32 rounds): exact conversions, so the
// vectors give each element the value the scalar code gives it. Lanes<T>: 16 of T's bits.
template <typename T> struct Lanes;
template <> struct Lanes<float> { typedef u32x16 type; };
template <> struct Lanes<bf16> { typedef u16x16 type; };
static inline v16 to_f32(u32x16 u) { v16 f; std::memcpy(&f, &u, 64); return f; }
static inline v16 to_f32(u16x16 b) { return to_f32(__builtin_convertvector(b, u32x16) << 16); }
template <typename T> static inline v16 load16(const T* x) {
  typename Lanes<T>::type b;
  std::memcpy(&b, x, sizeof b);
  return to_f32(b);
}
static inline void store16(float* y, v16 v) { store(y, v); }
static inline void store16(bf16* y, v16 v) {
  u32x16 u;
  std::memcpy(&u, &v, 64);
  u32x16 r = (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  u16x16 b = __builtin_convertvector(r, u16x16);
  std::memcpy(y, &b, sizeof b);
}

// Calls run(T{}) with T the C++ type of x's elements (float or bf16).
template <typename Run>
static ffi::Error by_dtype(ffi::AnyBuffer x, const char* what, Run run) {
  switch (x.element_type()) {
    case ffi::DataType::F32: run(float{}); return ffi::Error::Success();
    case ffi::DataType::BF16: run(bf16{}); return ffi::Error::Success();
    default: return ffi::Error::InvalidArgument(std::string(what) + " must be float32 or bfloat16");
  }
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
