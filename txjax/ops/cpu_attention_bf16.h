// Attention's bfloat16 heads on the CPU's bfloat16 products (cpu_bf16_dot.h: AMX or AVX512-BF16),
// included by cpu_attention.cc after its Dims, Scratch, row_cols, softmax_rows, ds_row and scatter.
// The six products (q k^T, again in the backward pass, P v, dO v^T, dS k, dS^T q and P^T dO) take
// bfloat16 operands and sum in float32, as under PyTorch's autocast or in FlashAttention: the
// weights P and the scores' gradient dS are rounded to bfloat16 before their products. The softmax,
// the scale and dS itself stay float32, as in the float32 heads.
#pragma once

#ifdef TXJAX_BF16_DOT

static inline const uint16_t* bits(const bf16* x) { return (const uint16_t*)x; }

// Rows [0, T) of x [T, ld] (float32) rounded into out [T, Sp] (bfloat16), on their row_cols.
static void rows_to_bf16(const Dims& dm, const Scratch& w, const float* x, uint16_t* out) {
  for (int t = 0; t < dm.T; ++t)
    for (int j = 0, n = row_cols(dm, w, t); j < n; j += 16)
      store16((bf16*)out + (long)t * w.Sp + j, load(x + t * w.ld + j));
}

// y [Sp, Tp] = x [Tp, Sp]^T for the weights (or dS) in bfloat16: the tiles of rows below T and
// columns within their row_cols (the others stay zero in y).
static void transpose_weights(const Dims& dm, const Scratch& w, const uint16_t* x, uint16_t* y) {
  for (int r = 0; r < dm.T; r += 16)
    for (int c = 0, n = row_cols(dm, w, std::min(dm.T, r + 16) - 1); c < n; c += 16)
      tile16<u16x16>(x + (long)r * w.Sp + c, w.Sp, y + (long)c * w.Tp + r, w.Tp);
}

// a b^T into w.s (q k^T unscaled, softmax_rows scales it; or dO v^T): a as rows [Tp, Hp], b^T as
// pairs of h [Hp / 2, Sp, 2].
static void scores_bf16(Scratch& w, const uint16_t* a, const uint16_t* bt2, bool tri) {
  const int Hp = w.Hp, Sp = w.Sp;
  bf16_mm(a, Hp, bt2, 2L * Sp, w.s.data(), w.ld, w.Tp,
          [=](int m0) { return TileRange{0, Hp, tri ? std::min(Sp, m0 + 32) : Sp}; });
}

// Into w: q, k and v of head n as bfloat16 rows, and k^T and v^T as pairs of h.
static void gather_bf16(Scratch& w, const Dims& dm, const bf16* q, const bf16* k, const bf16* v, int n, int kh) {
  rows_bf16(bits(q), dm.T, dm.N, dm.H, n, w.qb.data(), w.Hp, w.Tp);
  rows_bf16(bits(k), dm.S, dm.K, dm.H, kh, w.kb.data(), w.Hp, w.Sp);
  rows_bf16(bits(v), dm.S, dm.K, dm.H, kh, w.vb.data(), w.Hp, w.Sp);
  transpose_tiles<u32x16>((const uint32_t*)w.kb.data(), w.Sp, w.Hp / 2, (uint32_t*)w.kt2.data());
}

static void forward_head_bf16(Scratch& w, const Dims& dm, const bf16* q, const bf16* k, const bf16* v,
                              const float* bias_TS, int n, bf16* out, float* lse) {
  const int kh = n / (dm.N / dm.K), Hp = w.Hp, Sp = w.Sp;
  const bool tri = dm.causal && dm.S == dm.T;
  Bf16Unit unit;
  gather_bf16(w, dm, q, k, v, n, kh);
  pair_rows(w.vb.data(), Sp, Hp, w.v2.data());
  scores_bf16(w, w.qb.data(), w.kt2.data(), tri);
  softmax_rows(w, dm, bias_TS, nullptr, lse, dm.scale, w.pb.data());
  bf16_mm(w.pb.data(), Sp, w.v2.data(), 2L * Hp, w.o.data(), Hp, w.Tp,
          [=](int m0) { return TileRange{0, tri ? std::min(Sp, m0 + 32) : Sp, Hp}; });
  scatter(w.o.data(), dm.T, dm.N, dm.H, n, 1.f, out, Hp, false);
}

static void backward_head_bf16(Scratch& w, const Dims& dm, const bf16* q, const bf16* k, const bf16* v,
                               const float* bias_TS, const bf16* out, const float* lse, const bf16* dout, int n,
                               bf16* dq, bf16* dk, bf16* dv, float* dbias_TS) {
  const int group = dm.N / dm.K, kh = n / group, Hp = w.Hp, Sp = w.Sp, Tp = w.Tp;
  const bool tri = dm.causal && dm.S == dm.T, add = n % group != 0;
  Bf16Unit unit;
  gather_bf16(w, dm, q, k, v, n, kh);
  rows_bf16(bits(dout), dm.T, dm.N, dm.H, n, w.db.data(), Hp, Tp);
  transpose_tiles<u32x16>((const uint32_t*)w.vb.data(), Sp, Hp / 2, (uint32_t*)w.vt2.data());
  pair_rows(w.kb.data(), Sp, Hp, w.k2.data());
  pair_rows(w.qb.data(), Tp, Hp, w.q2.data());
  pair_rows(w.db.data(), Tp, Hp, w.d2.data());
  float* dd = w.o.data();  // rowsum(dO O), in o until dq's product: one pass over O's strided rows
  for (int t = 0; t < dm.T; ++t) {
    const bf16 *dor = dout + ((long)t * dm.N + n) * dm.H, *orow = out + ((long)t * dm.N + n) * dm.H;
    v16 acc = splat(0.f);
    int h = 0;
    for (; h + 16 <= dm.H; h += 16) acc += load16(dor + h) * load16(orow + h);
    dd[t] = hsum(acc);
    for (; h < dm.H; ++h) dd[t] += to_f32(dor[h]) * to_f32(orow[h]);
  }
  scores_bf16(w, w.qb.data(), w.kt2.data(), tri);
  softmax_rows(w, dm, bias_TS, lse, nullptr, dm.scale);
  scores_bf16(w, w.db.data(), w.vt2.data(), tri);  // s := dP = dO V^T
  for (int t = 0; t < dm.T; ++t) ds_row(w, dm, t, dd[t], dbias_TS);  // s := dS = P (dP - dd)
  rows_to_bf16(dm, w, w.p.data(), w.pb.data());
  rows_to_bf16(dm, w, w.s.data(), w.sb.data());
  transpose_weights(dm, w, w.pb.data(), w.pt.data());
  transpose_weights(dm, w, w.sb.data(), w.st.data());
  float* o = w.o.data();  // dq, then dk, then dv
  bf16_mm(w.sb.data(), Sp, w.k2.data(), 2L * Hp, o, Hp, Tp,
          [=](int m0) { return TileRange{0, tri ? std::min(Sp, m0 + 32) : Sp, Hp}; });
  scatter(o, dm.T, dm.N, dm.H, n, dm.scale, dq, Hp, false);
  auto upper = [=](int m0) { return TileRange{tri ? m0 : 0, Tp, Hp}; };  // keys [m0, m0 + 32): queries from m0
  bf16_mm(w.st.data(), Tp, w.q2.data(), 2L * Hp, o, Hp, Sp, upper);
  scatter(o, dm.S, dm.K, dm.H, kh, dm.scale, dk, Hp, add);
  bf16_mm(w.pt.data(), Tp, w.d2.data(), 2L * Hp, o, Hp, Sp, upper);
  scatter(o, dm.S, dm.K, dm.H, kh, 1.f, dv, Hp, add);
}

#endif
