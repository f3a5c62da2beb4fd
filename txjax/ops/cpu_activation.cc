// The feed-forward's activations for the CPU, forward and backward, called through XLA's FFI
// (txjax.ops.cpu_activation). XLA:CPU computes GELU's erf and exp at 1-2 ns an element; in the
// larger bench config's bfloat16 step GELU took 8.5 ms a layer on one core, 51 of the step's 500 ms
// (BUILD.md). Here each is one pass of 16-lane vectors: y = f(x) forward, dx = dy * f'(x) backward,
// recomputed from x as txjax.ops.activations does. The work is float32; x, y, dy and dx are float32
// or bfloat16. exp is cpu_kernels.h's vexp.
#include <cmath>

#include "cpu_kernels.h"

enum Kind : int32_t { kGelu = 0, kSilu = 1 };  // txjax.ops.cpu_activation.KINDS

static inline v16 clamp(v16 x, float lo, float hi) {  // a NaN stays NaN
  x = x < lo ? splat(lo) : x;
  return x > hi ? splat(hi) : x;
}

// erf(x) as a rational function of x on [-4, 4] (Eigen's generic_fast_erf_float; erf is +-1 in
// float32 beyond): within 5e-7 of the true value.
static inline v16 erf16(v16 x) {
  x = clamp(x, -4.f, 4.f);
  const v16 x2 = x * x;
  v16 p = splat(-2.72614225801306e-10f);
  for (float c : {2.77068142495902e-08f, -2.10102402082508e-06f, -5.69250639462346e-05f, -7.34990630326855e-04f,
                  -2.95459980854025e-03f, -1.60960333262415e-02f})
    p = p * x2 + c;
  v16 q = splat(-1.45660718464996e-05f);
  for (float c : {-2.13374055278905e-04f, -1.68282697438203e-03f, -7.37332916720468e-03f, -1.42647390514189e-02f})
    q = q * x2 + c;
  return x * p / q;
}

// GELU (exact): x Phi(x) and its derivative Phi(x) + x phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2.
static constexpr float kSqrtHalf = 0.7071067811865476f, kInvSqrt2Pi = 0.3989422804014327f;
static inline v16 gelu(v16 x) { return 0.5f * x * (1.f + erf16(x * kSqrtHalf)); }
static inline v16 gelu_grad(v16 x) {
  return 0.5f * (1.f + erf16(x * kSqrtHalf)) + x * kInvSqrt2Pi * vexp(-0.5f * x * x);
}
// SiLU: x s(x) and s(x) (1 + x (1 - s(x))), s the logistic sigmoid 1 / (1 + e^-x).
static inline v16 sigmoid(v16 x) { return 1.f / (1.f + vexp(-x)); }
static inline v16 silu(v16 x) { return x * sigmoid(x); }
static inline v16 silu_grad(v16 x) {
  const v16 s = sigmoid(x);
  return s * (1.f + x * (1.f - s));
}

// Elements per work item: 64 KB of float32.
static constexpr long kChunk = 16384;

// out[i] = f(x[i], dy[i]) for i in [0, n), 16 at a time; the last n % 16 through a padded copy.
template <typename T, typename F>
static void map(ffi::ThreadPool& pool, const T* x, const T* dy, T* out, long n, F f) {
  const int parts = (int)((n + kChunk - 1) / kChunk);
  parallel_for(pool, parts, []() { return 0; }, [=](int&, int p) {
    const long i0 = p * kChunk, i1 = std::min(n, i0 + kChunk);
    long i = i0;
    for (; i + 16 <= i1; i += 16) store16(out + i, f(load16(x + i), dy ? load16(dy + i) : splat(1.f)));
    if (i < i1) {
      T xs[16] = {}, ds[16] = {}, os[16];
      std::copy(x + i, x + i1, xs);
      if (dy) std::copy(dy + i, dy + i1, ds);
      store16(os, f(load16(xs), dy ? load16(ds) : splat(1.f)));
      std::copy(os, os + (i1 - i), out + i);
    }
  });
}

static ffi::Error forward(ffi::ThreadPool pool, ffi::AnyBuffer x, int32_t kind, ffi::Result<ffi::AnyBuffer> y) {
  if (kind != kGelu && kind != kSilu) return ffi::Error::InvalidArgument("txjax activation: unknown kind");
  return by_dtype(x, "txjax activation: x", [&](auto type) {
    using T = decltype(type);
    const T* xp = (const T*)x.untyped_data();
    T* yp = (T*)y->untyped_data();
    const long n = (long)x.element_count();
    if (kind == kGelu) map(pool, xp, (const T*)nullptr, yp, n, [](v16 v, v16) { return gelu(v); });
    else map(pool, xp, (const T*)nullptr, yp, n, [](v16 v, v16) { return silu(v); });
  });
}

static ffi::Error backward(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer dy, int32_t kind,
                           ffi::Result<ffi::AnyBuffer> dx) {
  if (kind != kGelu && kind != kSilu) return ffi::Error::InvalidArgument("txjax activation: unknown kind");
  return by_dtype(x, "txjax activation: x", [&](auto type) {
    using T = decltype(type);
    const T *xp = (const T*)x.untyped_data(), *dyp = (const T*)dy.untyped_data();
    T* dxp = (T*)dx->untyped_data();
    const long n = (long)x.element_count();
    if (kind == kGelu) map(pool, xp, dyp, dxp, n, [](v16 v, v16 d) { return d * gelu_grad(v); });
    else map(pool, xp, dyp, dxp, n, [](v16 v, v16 d) { return d * silu_grad(v); });
  });
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(TxjaxActivationForward, forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()       // x
                                  .Attr<int32_t>("kind")       // Kind
                                  .Ret<ffi::AnyBuffer>());     // y, x's shape and dtype

XLA_FFI_DEFINE_HANDLER_SYMBOL(TxjaxActivationBackward, backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()       // x
                                  .Arg<ffi::AnyBuffer>()       // dy, x's dtype
                                  .Attr<int32_t>("kind")
                                  .Ret<ffi::AnyBuffer>());     // dx
