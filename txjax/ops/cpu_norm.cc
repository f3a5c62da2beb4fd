// Layer norm and RMS norm for the CPU, forward and backward, called through XLA's FFI
// (txjax.ops.cpu_norm). XLA:CPU runs a norm as four to six passes over [M, D]: its reductions
// (YNNPACK) take the [D] scale as a materialized [M, D] broadcast, and the backward pass's two
// row means and the scale's and bias's column sums are passes of their own (BUILD.md). Here one
// row at a time stays in L1: the forward pass reads x once and writes y, the row's mean and 1/std;
// the backward pass reads x and dy once, writes dx and adds dy * x_hat and dy to per-part column
// sums, which are summed in part order (a fixed number of parts per shape: the same result on any
// number of threads). The work is float32; x, y, dy and dx are float32 or bfloat16.
#include <cmath>
#include <vector>

#include "cpu_kernels.h"

// Rows per work item: the parts of a backward pass's column sums are its items.
static constexpr long kRows = 64;

// The sum of x[0, D) (vectors of 16, then the rest), and of (x - c)^2.
template <typename T>
static inline float row_sum(const T* x, long D) {
  v16 acc = splat(0.f);
  long j = 0;
  for (; j + 16 <= D; j += 16) acc += load16(x + j);
  float s = hsum(acc);
  for (; j < D; ++j) s += to_f32(x[j]);
  return s;
}
template <typename T>
static inline float row_sq_sum(const T* x, long D, float c) {
  v16 acc = splat(0.f), cv = splat(c);
  long j = 0;
  for (; j + 16 <= D; j += 16) { v16 d = load16(x + j) - cv; acc += d * d; }
  float s = hsum(acc);
  for (; j < D; ++j) { float d = to_f32(x[j]) - c; s += d * d; }
  return s;
}

// y = (x - mean) * rstd * scale + bias (center) or x * rstd * scale, row by row.
template <typename T>
static void forward_rows(const T* x, const float* scale, const float* bias, T* y, float* mean, float* rstd,
                         long r0, long r1, long D, float eps, bool center) {
  for (long r = r0; r < r1; ++r) {
    const T* xr = x + r * D;
    T* yr = y + r * D;
    float mu = center ? row_sum(xr, D) / D : 0.f;
    float rs = 1.f / std::sqrt(row_sq_sum(xr, D, mu) / D + eps);
    mean[r] = mu;
    rstd[r] = rs;
    v16 muv = splat(mu), rsv = splat(rs);
    long j = 0;
    for (; j + 16 <= D; j += 16) {
      v16 v = (load16(xr + j) - muv) * rsv * load(scale + j);
      store16(yr + j, center ? v + load(bias + j) : v);
    }
    for (; j < D; ++j) {
      float v = (to_f32(xr[j]) - mu) * rs * scale[j];
      yr[j] = from_f32<T>(center ? v + bias[j] : v);
    }
  }
}

// dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) with g = dy * scale (without centering, no
// mean(g) term); dscale += dy * x_hat and dbias += dy into this part's column sums.
template <typename T>
static void backward_rows(const T* x, const float* scale, const float* mean, const float* rstd, const T* dy, T* dx,
                          float* dscale, float* dbias, long r0, long r1, long D, bool center) {
  for (long r = r0; r < r1; ++r) {
    const T *xr = x + r * D, *dyr = dy + r * D;
    T* dxr = dx + r * D;
    const float mu = mean[r], rs = rstd[r];
    v16 muv = splat(mu), rsv = splat(rs), sg = splat(0.f), sgx = splat(0.f);
    long j = 0;
    for (; j + 16 <= D; j += 16) {
      v16 xh = (load16(xr + j) - muv) * rsv, d = load16(dyr + j), g = d * load(scale + j);
      sg += g;
      sgx += g * xh;
      store(dscale + j, load(dscale + j) + d * xh);
      store(dbias + j, load(dbias + j) + d);
    }
    float s_g = hsum(sg), s_gx = hsum(sgx);
    for (long k = j; k < D; ++k) {
      float xh = (to_f32(xr[k]) - mu) * rs, d = to_f32(dyr[k]), g = d * scale[k];
      s_g += g;
      s_gx += g * xh;
      dscale[k] += d * xh;
      dbias[k] += d;
    }
    const float m_g = center ? s_g / D : 0.f, m_gx = s_gx / D;
    v16 mgv = splat(m_g), mgxv = splat(m_gx);
    for (j = 0; j + 16 <= D; j += 16) {
      v16 xh = (load16(xr + j) - muv) * rsv, g = load16(dyr + j) * load(scale + j);
      store16(dxr + j, rsv * (g - mgv - xh * mgxv));
    }
    for (; j < D; ++j) {
      float xh = (to_f32(xr[j]) - mu) * rs, g = to_f32(dyr[j]) * scale[j];
      dxr[j] = from_f32<T>(rs * (g - m_g - xh * m_gx));
    }
  }
}

static ffi::Error forward(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::F32> scale,
                          ffi::Buffer<ffi::F32> bias, float eps, int32_t center, ffi::Result<ffi::AnyBuffer> y,
                          ffi::ResultBuffer<ffi::F32> mean, ffi::ResultBuffer<ffi::F32> rstd) {
  const long D = x.dimensions().back(), M = D ? (long)x.element_count() / D : 0;
  const int parts = (int)((M + kRows - 1) / kRows);
  return by_dtype(x, "txjax norm: x", [&](auto type) {
    using T = decltype(type);
    const T* xp = (const T*)x.untyped_data();
    T* yp = (T*)y->untyped_data();
    const float *s = scale.typed_data(), *b = bias.typed_data();
    float *mu = mean->typed_data(), *rs = rstd->typed_data();
    parallel_for(pool, parts, []() { return 0; }, [=](int&, int p) {
      forward_rows(xp, s, b, yp, mu, rs, p * kRows, std::min(M, (p + 1) * kRows), D, eps, center != 0);
    });
  });
}

static ffi::Error backward(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::F32> scale,
                           ffi::Buffer<ffi::F32> mean, ffi::Buffer<ffi::F32> rstd, ffi::AnyBuffer dy, int32_t center,
                           ffi::Result<ffi::AnyBuffer> dx, ffi::ResultBuffer<ffi::F32> dscale,
                           ffi::ResultBuffer<ffi::F32> dbias) {
  const long D = x.dimensions().back(), M = D ? (long)x.element_count() / D : 0;
  const int parts = (int)((M + kRows - 1) / kRows);
  std::vector<float> sums(2 * (size_t)std::max(parts, 1) * D, 0.f);  // [part][dscale | dbias][D]
  ffi::Error error = by_dtype(x, "txjax norm: x", [&](auto type) {
    using T = decltype(type);
    const T *xp = (const T*)x.untyped_data(), *dyp = (const T*)dy.untyped_data();
    T* dxp = (T*)dx->untyped_data();
    const float *s = scale.typed_data(), *mu = mean.typed_data(), *rs = rstd.typed_data();
    float* part_sums = sums.data();
    parallel_for(pool, parts, []() { return 0; }, [=](int&, int p) {
      float* ds = part_sums + 2 * (long)p * D;
      backward_rows(xp, s, mu, rs, dyp, dxp, ds, ds + D, p * kRows, std::min(M, (p + 1) * kRows), D, center != 0);
    });
  });
  float *ds = dscale->typed_data(), *db = dbias->typed_data();
  for (long j = 0; j < D; ++j) ds[j] = db[j] = 0.f;
  for (int p = 0; p < parts; ++p)
    for (long j = 0; j < D; ++j) {
      ds[j] += sums[2 * (size_t)p * D + j];
      db[j] += sums[(2 * (size_t)p + 1) * D + j];
    }
  return error;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(TxjaxNormForward, forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()          // x [..., D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // scale [D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // bias [D] (zeros when not centering)
                                  .Attr<float>("eps")
                                  .Attr<int32_t>("center")        // 1: layer norm, 0: RMS norm
                                  .Ret<ffi::AnyBuffer>()          // y, x's shape and dtype
                                  .Ret<ffi::Buffer<ffi::F32>>()   // mean per row (0 for RMS norm)
                                  .Ret<ffi::Buffer<ffi::F32>>());  // 1 / std per row

XLA_FFI_DEFINE_HANDLER_SYMBOL(TxjaxNormBackward, backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()          // x
                                  .Arg<ffi::Buffer<ffi::F32>>()   // scale
                                  .Arg<ffi::Buffer<ffi::F32>>()   // mean
                                  .Arg<ffi::Buffer<ffi::F32>>()   // rstd
                                  .Arg<ffi::AnyBuffer>()          // dy, x's dtype
                                  .Attr<int32_t>("center")
                                  .Ret<ffi::AnyBuffer>()          // dx
                                  .Ret<ffi::Buffer<ffi::F32>>()   // dscale [D]
                                  .Ret<ffi::Buffer<ffi::F32>>());  // dbias [D]
