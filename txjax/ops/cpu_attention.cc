// Fused scaled dot-product attention for the CPU, computed in float32 (q, k, v, the output and
// their gradients read and written as float32 or bfloat16): txjax.ops.cpu_kernels builds this file
// on first use and registers its two XLA FFI handlers. One work item is one (batch, key head) pair:
// its query heads' scores, softmax and products run in per-thread scratch, so the [B, N, T, S]
// scores never leave the cache and no heads-major copy of q, k or v is made. With S == T and
// `causal`, only the lower triangle is computed. The backward pass recomputes the weights from the
// saved log-sum-exp (as FlashAttention does). bfloat16 heads on a CPU with bfloat16 products (AMX
// or AVX512-BF16) run their products in bfloat16 instead (cpu_attention_bf16.h).
#include <cmath>
#include <type_traits>
#include <vector>

#include "cpu_attention_f32.h"
#include "cpu_bf16_dot.h"
#include "cpu_kernels.h"

// q [B, T, N, H], k and v [B, S, K, H] (K divides N: query head n reads key head n / (N / K)),
// row-major; the bias, if any, [B|1, N|1, T, S] with stride 0 on its broadcast axes.
struct Dims {
  int B, T, S, N, K, H;
  float scale;
  bool causal;          // key s is visible to query t only if s <= t + S - T (and the bias allows it)
  long bias_b, bias_n;  // the bias's strides over batch and heads
};

// One thread's buffers. With `dot16` (bfloat16 products: cpu_attention_bf16.h) the products' operands
// are bfloat16 copies padded to multiples of 32 (Hp, Sp, Tp): q, k and v as rows (qb, kb, vb), k^T
// and v^T as pairs of h (kt2, vt2), k, v, q and dO as pairs of rows (k2, v2, q2, d2), the weights
// and the scores' gradient as rows (pb, sb) and transposed (pt, st).
struct Scratch {
  bool dot16;
  int Hp, Sp, Tp;
  long ld;  // the row stride of kt, vt, s and p: Sp, padded off multiples of 64 (256 bytes), whose
            // rows would all map to the same few L1 sets
  std::vector<float> q, k, kt, v, vt, o, d, s, p, m;
  std::vector<uint16_t> qb, kb, vb, db, kt2, vt2, q2, k2, v2, d2, pb, sb, pt, st;
  Scratch(const Dims& dm, bool dot16)
      : dot16(dot16), Hp(dot16 ? round32(dm.H) : round16(dm.H)), Sp(dot16 ? round32(dm.S) : round16(dm.S)),
        Tp(round32(dm.T)), ld(Sp % 64 ? Sp : Sp + 16) {
    long rows = round16(std::max(dm.T, dm.S)) + 16;
    for (auto* x : {&s, &p}) x->assign((round16(dm.T) + 16) * ld + 64, 0.f);
    m.assign(dm.T, 0.f);
    o.assign(rows * Hp + 64, 0.f);
    if (dot16) {
      const long R = std::max(Tp, Sp);
      for (auto* x : {&qb, &kb, &vb, &db, &kt2, &vt2, &q2, &k2, &v2, &d2}) x->assign(R * Hp, 0);
      for (auto* x : {&pb, &sb, &pt, &st}) x->assign((long)Tp * Sp, 0);
      return;
    }
    for (auto* x : {&q, &k, &v, &d}) x->assign(rows * Hp + 64, 0.f);
    for (auto* x : {&kt, &vt}) x->assign(Hp * ld + 64, 0.f);
  }
};

// Head `n` of x [rows, heads, H] into out [rows, Hp] (times mult), or transposed into [Hp, ld].
template <typename T>
static void gather(const T* x, int rows, int heads, int H, int n, float mult, float* out, int Hp) {
  for (int t = 0; t < rows; ++t) {
    const T* row = x + ((long)t * heads + n) * H;
    int h = 0;
    for (; h + 16 <= H; h += 16) store(out + t * Hp + h, load16(row + h) * splat(mult));
    for (; h < H; ++h) out[t * Hp + h] = to_f32(row[h]) * mult;
  }
}
// 16 rows at a time, so that each store fills a cache line of out (one per h) while the 16 rows
// read stay in L1: row by row, every store would touch a different line. Whole 16 x 16 tiles are
// transposed in registers.
template <typename T>
static void gather_t(const T* x, int rows, int heads, int H, int n, float* out, long ld) {
  typedef typename Lanes<T>::type V;
  for (int t0 = 0; t0 < rows; t0 += 16) {
    int r = std::min(16, rows - t0), h16 = r == 16 ? H / 16 * 16 : 0;
    for (int h0 = 0; h0 < h16; h0 += 16) {
      V cols[16];
      tile16_columns((const typename std::conditional<sizeof(T) == 2, uint16_t, uint32_t>::type*)
                         (x + ((long)t0 * heads + n) * H + h0), (long)heads * H, cols);
      for (int i = 0; i < 16; ++i) store(out + (h0 + i) * ld + t0, to_f32(cols[i]));
    }
    for (int h = h16; h < H; ++h)
      for (int t = t0; t < t0 + r; ++t) out[h * ld + t] = to_f32(x[((long)t * heads + n) * H + h]);
  }
}
// in [rows, Hp] (times mult) into head n of x [rows, heads, H], written or added (in T).
template <typename T>
static void scatter(const float* in, int rows, int heads, int H, int n, float mult, T* x, int Hp, bool add) {
  for (int t = 0; t < rows; ++t) {
    T* row = x + ((long)t * heads + n) * H;
    const float* i = in + t * Hp;
    int h = 0;
    for (; h + 16 <= H; h += 16)
      store16(row + h, (add ? load16(row + h) : splat(0.f)) + load(i + h) * splat(mult));
    for (; h < H; ++h) row[h] = from_f32<T>((add ? to_f32(row[h]) : 0.f) + i[h] * mult);
  }
}

// Number of keys row t may see before the bias: all S, or t + S - T + 1 when causal.
static inline int row_keys(const Dims& dm, int t) {
  return dm.causal ? std::min(dm.S, std::max(0, t + dm.S - dm.T + 1)) : dm.S;
}

// The columns of row t of the weights (or dS) that the products read: the row's keys rounded up to
// 32, or all Sp. Beyond them the bfloat16 copies keep the zeros they were made with (every head of
// a call writes the same columns).
static inline int row_cols(const Dims& dm, const Scratch& w, int t) {
  return std::min(w.Sp, round32(row_keys(dm, t)));
}

// Zeros in row x after its keys rounded up to 16 (nk16): to Sp, or, in causal self-attention
// without a bias gradient, only the next 16, all that the products read there (the bfloat16
// copies' 32-column blocks; the rest stays as the scratch was made, zero).
static inline void zero_tail(const Dims& dm, const Scratch& w, float* x, int nk16, bool all = false) {
  if (!all && dm.causal && dm.S == dm.T) {
    if (nk16 < w.Sp) store(x + nk16, splat(0.f));
    return;
  }
  for (int j = nk16; j < w.Sp; ++j) x[j] = 0.f;
}

// P[t, :] = exp(S[t, :] * scale + bias - lse[t]) on the row's visible keys, 0 after them
// (zero_tail), from the forward pass's saved_lse; without it, computes the softmax and writes
// lse_out (the log-sum-exp, +inf for a row with no visible key), and P normalized into pb as
// bfloat16 rows (on their row_cols) where pb is given, else in place. Each pass runs over every
// row before the next starts: a row alone is one chain of dependent steps (maximum, sum, scale),
// which the rows run side by side. Without a bias, a positive scale is applied as the passes read
// S (1: q came scaled; the maximum of the scaled row is the scaled maximum, rounded alike); with
// one, S * scale + bias is written back in the first pass.
static void softmax_rows(Scratch& w, const Dims& dm, const float* bias_TS, const float* saved_lse, float* lse_out,
                         float scale = 1.f, uint16_t* pb = nullptr) {
  float* m = w.m.data();  // each row's maximum (or saved lse), then (without saved_lse) 1 / its sum
  const bool early = bias_TS || !(scale > 0.f);
  const float sc = early ? 1.f : scale;
  for (int t = 0; t < dm.T; ++t) {
    float* s = w.s.data() + t * w.ld;
    const int nk = row_keys(dm, t), nk16 = round16(nk);
    int j = 0;
    if (bias_TS) {
      const float* b = bias_TS + (long)t * dm.S;
      for (; j + 16 <= nk; j += 16) store(s + j, load(s + j) * scale + load(b + j));
      for (; j < nk; ++j) s[j] = s[j] * scale + b[j];
    } else if (early && scale != 1.f) {
      for (; j < nk16; j += 16) store(s + j, load(s + j) * scale);
    }
    for (j = nk; j < nk16; ++j) s[j] = -INFINITY;
    if (saved_lse) {
      m[t] = saved_lse[t];
      continue;
    }
    v16 mv = splat(-INFINITY);
    for (j = 0; j < nk16; j += 16) { v16 x = load(s + j); mv = x > mv ? x : mv; }
    float mt = hmax(mv) * sc;
    m[t] = std::isfinite(mt) ? mt : 0.f;
  }
  for (int t = 0; t < dm.T; ++t) {
    const float* s = w.s.data() + t * w.ld;
    float* p = w.p.data() + t * w.ld;
    int nk16 = round16(row_keys(dm, t));
    v16 sum = splat(0.f);
    for (int j = 0; j < nk16; j += 16) { v16 e = vexp(load(s + j) * sc - m[t]); store(p + j, e); sum += e; }
    zero_tail(dm, w, p, nk16);
    if (saved_lse) continue;
    float l = hsum(sum);
    lse_out[t] = l > 0.f ? m[t] + std::log(l) : INFINITY;
    m[t] = l > 0.f ? 1.f / l : 0.f;
  }
  if (saved_lse) return;
  for (int t = 0; t < dm.T; ++t) {
    float* p = w.p.data() + t * w.ld;
    if (pb) {
      for (int j = 0, n = row_cols(dm, w, t); j < n; j += 16)
        store16((bf16*)pb + (long)t * w.Sp + j, load(p + j) * m[t]);
      continue;
    }
    int nk16 = round16(row_keys(dm, t));
    for (int j = 0; j < nk16; j += 16) store(p + j, load(p + j) * m[t]);
  }
}

// Row t of s := dS = P (dP - dd), dP the row of s and dd its rowsum(dO O); zeros after its keys,
// and the row copied into dbias_TS when the bias's gradient is asked for.
static void ds_row(Scratch& w, const Dims& dm, int t, float dd, float* dbias_TS) {
  float* s = w.s.data() + t * w.ld;
  const float* p = w.p.data() + t * w.ld;
  int nk16 = round16(row_keys(dm, t));
  for (int j = 0; j < nk16; j += 16) store(s + j, load(p + j) * (load(s + j) - dd));
  zero_tail(dm, w, s, nk16, dbias_TS != nullptr);
  if (dbias_TS) std::memcpy(dbias_TS + (long)t * dm.S, s, sizeof(float) * dm.S);
}

#include "cpu_attention_bf16.h"

// Query head n of one batch row: out [T, N, H] and lse [T] (its log-sum-exp per query).
template <typename T>
static void forward_head(Scratch& w, const Dims& dm, const T* q, const T* k, const T* v, const float* bias_TS, int n,
                         T* out, float* lse) {
#ifdef TXJAX_BF16_DOT
  if constexpr (std::is_same_v<T, bf16>)
    if (w.dot16) return forward_head_bf16(w, dm, q, k, v, bias_TS, n, out, lse);
#endif
  const int kh = n / (dm.N / dm.K), hc = w.Hp / 16;
  const bool tri = dm.causal && dm.S == dm.T;
  gather(q, dm.T, dm.N, dm.H, n, dm.scale, w.q.data(), w.Hp);
  gather_t(k, dm.S, dm.K, dm.H, kh, w.kt.data(), w.ld);
  gather(v, dm.S, dm.K, dm.H, kh, 1.f, w.v.data(), w.Hp);
  scores_mm(w.q.data(), dm.H, w.Hp, w.kt.data(), w.ld, w.Sp, w.s.data(), dm.T, tri);
  softmax_rows(w, dm, bias_TS, nullptr, lse);
  rows_mm_any(hc, w.p.data(), w.ld, 1, w.v.data(), w.o.data(), dm.T, tri ? kLower : kAll, dm.S);
  scatter(w.o.data(), dm.T, dm.N, dm.H, n, 1.f, out, w.Hp, false);
}

// Query head n of one batch row, backward: dq written; dk and dv (its key head's) written by the
// group's first query head and added to by the others (so, in bfloat16, rounded once per head: the
// caller takes grouped queries in float32); dbias_TS (optional) gets dL/dscores [T, S].
template <typename T>
static void backward_head(Scratch& w, const Dims& dm, const T* q, const T* k, const T* v, const float* bias_TS,
                          const T* out, const float* lse, const T* dout, int n, T* dq, T* dk, T* dv,
                          float* dbias_TS) {
#ifdef TXJAX_BF16_DOT
  if constexpr (std::is_same_v<T, bf16>)
    if (w.dot16) return backward_head_bf16(w, dm, q, k, v, bias_TS, out, lse, dout, n, dq, dk, dv, dbias_TS);
#endif
  const int group = dm.N / dm.K, kh = n / group, hc = w.Hp / 16;
  const bool tri = dm.causal && dm.S == dm.T, add = n % group != 0;
  gather(q, dm.T, dm.N, dm.H, n, dm.scale, w.q.data(), w.Hp);
  gather_t(k, dm.S, dm.K, dm.H, kh, w.kt.data(), w.ld);
  gather(k, dm.S, dm.K, dm.H, kh, 1.f, w.k.data(), w.Hp);
  gather_t(v, dm.S, dm.K, dm.H, kh, w.vt.data(), w.ld);
  gather(dout, dm.T, dm.N, dm.H, n, 1.f, w.d.data(), w.Hp);
  gather(out, dm.T, dm.N, dm.H, n, 1.f, w.o.data(), w.Hp);
  scores_mm(w.q.data(), dm.H, w.Hp, w.kt.data(), w.ld, w.Sp, w.s.data(), dm.T, tri);
  softmax_rows(w, dm, bias_TS, lse, nullptr);
  scores_mm(w.d.data(), dm.H, w.Hp, w.vt.data(), w.ld, w.Sp, w.s.data(), dm.T, tri);  // s := dP = dO V^T
  for (int t = 0; t < dm.T; ++t) {  // s := dS = P (dP - rowsum(dO O))
    float dd = 0.f;
    for (int h = 0; h < dm.H; ++h) dd += w.d[t * w.Hp + h] * w.o[t * w.Hp + h];
    ds_row(w, dm, t, dd, dbias_TS);
  }
  float* o = w.o.data();  // dq, then dk, then dv
  rows_mm_any(hc, w.s.data(), w.ld, 1, w.k.data(), o, dm.T, tri ? kLower : kAll, dm.S);
  scatter(o, dm.T, dm.N, dm.H, n, dm.scale, dq, w.Hp, false);
  rows_mm_any(hc, w.s.data(), 1, w.ld, w.q.data(), o, dm.S, tri ? kUpper : kAll, dm.T);
  scatter(o, dm.S, dm.K, dm.H, kh, 1.f, dk, w.Hp, add);
  rows_mm_any(hc, w.p.data(), 1, w.ld, w.d.data(), o, dm.S, tri ? kUpper : kAll, dm.T);
  scatter(o, dm.S, dm.K, dm.H, kh, 1.f, dv, w.Hp, add);
}

// Heads narrower than this keep the float32 FMAs: padded to 32, they ran 1.4-1.7x slower on AMX,
// and 16 wide 1.05-1.2x slower on AVX512-BF16 (BUILD.md).
static constexpr int kBf16MinHead = 32;

// Runs head(scratch, b, n) for every batch row b and query head n (parallel_for). One item is one
// batch row's query heads that share a key head, in order (so that dk and dv are written by the
// group's first head before the others add to them). `dot16`: bfloat16 heads on the CPU's bfloat16
// products where they are usable and the heads at least kBf16MinHead wide.
template <typename F>
static void parallel_heads(ffi::ThreadPool& pool, const Dims& dm, bool dot16, F head) {
  const int group = dm.N / dm.K;
  dot16 = dot16 && dm.H >= kBf16MinHead && bf16_dot_usable();
  parallel_for(pool, dm.B * dm.K, [dm, dot16]() { return Scratch(dm, dot16); }, [dm, group, head](Scratch& w, int i) {
    for (int n = i % dm.K * group; n < (i % dm.K + 1) * group; ++n) head(w, i / dm.K, n);
  });
}

static Dims dims_of(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::Buffer<ffi::F32> bias, float scale, int32_t causal,
                    int32_t has_bias) {
  auto qd = q.dimensions(), kd = k.dimensions(), bd = bias.dimensions();
  Dims dm{(int)qd[0], (int)qd[1], (int)kd[1], (int)qd[2], (int)kd[2], (int)qd[3], scale, causal != 0, 0, 0};
  if (has_bias) {
    dm.bias_n = bd[1] == 1 ? 0 : (long)dm.T * dm.S;
    dm.bias_b = bd[0] == 1 ? 0 : (long)bd[1] * dm.T * dm.S;
  }
  return dm;
}

static const float* bias_at(ffi::Buffer<ffi::F32> bias, int32_t has_bias, const Dims& dm, int b, int n) {
  return has_bias ? bias.typed_data() + b * dm.bias_b + n * dm.bias_n : nullptr;
}

template <typename T> static const T* in(ffi::AnyBuffer x) { return (const T*)x.untyped_data(); }
template <typename T> static T* out_of(ffi::Result<ffi::AnyBuffer>& x) { return (T*)x->untyped_data(); }

static ffi::Error forward(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                          ffi::Buffer<ffi::F32> bias, float scale, int32_t causal, int32_t has_bias,
                          ffi::Result<ffi::AnyBuffer> out, ffi::ResultBuffer<ffi::F32> lse) {
  const Dims dm = dims_of(q, k, bias, scale, causal, has_bias);
  const long qs = (long)dm.T * dm.N * dm.H, ks = (long)dm.S * dm.K * dm.H;
  return by_dtype(q, "txjax attention: q, k, v", [&](auto type) {
    using T = decltype(type);
    parallel_heads(pool, dm, std::is_same_v<T, bf16>, [&](Scratch& w, int b, int n) {
      forward_head(w, dm, in<T>(q) + b * qs, in<T>(k) + b * ks, in<T>(v) + b * ks, bias_at(bias, has_bias, dm, b, n),
                   n, out_of<T>(out) + b * qs, lse->typed_data() + ((long)b * dm.N + n) * dm.T);
    });
  });
}

static ffi::Error backward(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                           ffi::Buffer<ffi::F32> bias, ffi::AnyBuffer out, ffi::Buffer<ffi::F32> lse,
                           ffi::AnyBuffer dout, float scale, int32_t causal, int32_t has_bias, int32_t bias_grad,
                           ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                           ffi::Result<ffi::AnyBuffer> dv, ffi::ResultBuffer<ffi::F32> dbias) {
  const Dims dm = dims_of(q, k, bias, scale, causal, has_bias);
  const long qs = (long)dm.T * dm.N * dm.H, ks = (long)dm.S * dm.K * dm.H, ts = (long)dm.T * dm.S;
  return by_dtype(q, "txjax attention: q, k, v", [&](auto type) {
    using T = decltype(type);
    parallel_heads(pool, dm, std::is_same_v<T, bf16>, [&](Scratch& w, int b, int n) {
      backward_head(w, dm, in<T>(q) + b * qs, in<T>(k) + b * ks, in<T>(v) + b * ks, bias_at(bias, has_bias, dm, b, n),
                    in<T>(out) + b * qs, lse.typed_data() + ((long)b * dm.N + n) * dm.T, in<T>(dout) + b * qs, n,
                    out_of<T>(dq) + b * qs, out_of<T>(dk) + b * ks, out_of<T>(dv) + b * ks,
                    bias_grad ? dbias->typed_data() + ((long)b * dm.N + n) * ts : nullptr);
    });
  });
}

// The narrowest bfloat16 heads that run their products in bfloat16 here, 0 for none
// (txjax.ops.cpu_attention.bf16_heads).
extern "C" int TxjaxBf16MinHead() { return bf16_dot_usable() ? kBf16MinHead : 0; }

// q, k, v and the bias: the arguments both handlers start with.
static auto bind_inputs() {
  using Any = ffi::AnyBuffer;
  return ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<Any>().Arg<Any>().Arg<Any>().Arg<ffi::Buffer<ffi::F32>>();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(TxjaxAttentionForward, forward,
                              bind_inputs()
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("causal")
                                  .Attr<int32_t>("has_bias")
                                  .Ret<ffi::AnyBuffer>()          // out
                                  .Ret<ffi::Buffer<ffi::F32>>());  // lse

XLA_FFI_DEFINE_HANDLER_SYMBOL(TxjaxAttentionBackward, backward,
                              bind_inputs()
                                  .Arg<ffi::AnyBuffer>()         // out
                                  .Arg<ffi::Buffer<ffi::F32>>()  // lse
                                  .Arg<ffi::AnyBuffer>()         // dout
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("causal")
                                  .Attr<int32_t>("has_bias")
                                  .Attr<int32_t>("bias_grad")
                                  .Ret<ffi::AnyBuffer>()          // dq
                                  .Ret<ffi::AnyBuffer>()          // dk
                                  .Ret<ffi::AnyBuffer>()          // dv
                                  .Ret<ffi::Buffer<ffi::F32>>());  // dbias
