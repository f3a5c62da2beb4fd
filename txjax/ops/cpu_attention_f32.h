// Attention's float32 products for cpu_attention.cc (q k^T, P v and the gradients' products): 16-lane
// FMAs over blocks of 4 rows, the causal triangles skipped. Every float32 head runs them, and the
// bfloat16 heads that cpu_attention_bf16.h does not take (no AMX or AVX512-BF16, heads under 32
// wide, grouped queries).
#pragma once

#include "cpu_kernels.h"

enum Range { kAll = 0, kLower = 1, kUpper = 2 };

// v held in a register. GCC otherwise folds the loads of B's vectors into each row's FMA, loading
// each 4 times (16 loads and 4 broadcasts for 16 FMAs: the loop then waits on the load ports).
static inline v16 in_register(v16 v) {
#ifdef __AVX512F__
  asm("" : "+v"(v));
#endif
  return v;
}

// C[i, :16WC] = sum_k A(i, k) Bm[k, :16WC] with A(i, k) = A[i*ai + k*ak], 4 rows at a time.
// kLower: k < i0 + 4; kUpper: k >= i0 (the causal triangles; A must be 0 outside each row's own).
template <int WC>
static void rows_mm(const float* A, long ai, long ak, const float* Bm, float* C, long W, int m, int range, int kmax) {
  for (int i0 = 0; i0 < m; i0 += 4) {
    int r = std::min(4, m - i0);
    int k0 = range == kUpper ? i0 : 0, k1 = range == kLower ? std::min(kmax, i0 + 4) : kmax;
    v16 acc[4][WC];
    for (int a = 0; a < 4; ++a) for (int c = 0; c < WC; ++c) acc[a][c] = splat(0.f);
    const float* Ar = A + (long)i0 * ai;
    for (int k = k0; k < k1; ++k) {
      v16 b[WC];
      for (int c = 0; c < WC; ++c) b[c] = in_register(load(Bm + (long)k * W + 16 * c));
      for (int a = 0; a < 4; ++a) {
        v16 x = splat(Ar[a * ai + k * ak]);
        for (int c = 0; c < WC; ++c) acc[a][c] += x * b[c];
      }
    }
    for (int a = 0; a < r; ++a) for (int c = 0; c < WC; ++c) store(C + (long)(i0 + a) * W + 16 * c, acc[a][c]);
  }
}

// rows_mm over Hp = 16 hc columns (row stride Hp), at most 64 at a time.
static void rows_mm_any(int hc, const float* A, long ai, long ak, const float* Bm, float* C, int m, int range,
                        int kmax) {
  const long W = 16L * hc;
  for (int c = 0; c < hc; c += 4) {
    const float* B = Bm + 16 * c;
    float* Cc = C + 16 * c;
    switch (std::min(4, hc - c)) {
      case 1: rows_mm<1>(A, ai, ak, B, Cc, W, m, range, kmax); break;
      case 2: rows_mm<2>(A, ai, ak, B, Cc, W, m, range, kmax); break;
      case 3: rows_mm<3>(A, ai, ak, B, Cc, W, m, range, kmax); break;
      default: rows_mm<4>(A, ai, ak, B, Cc, W, m, range, kmax);
    }
  }
}

// S[i, j] = sum_{h < H} X[i, h] Yt[h, j] (X's rows Hp apart) for rows [i0, i0 + 4) and the 16*NV
// columns from j, in order of h (so the blocking leaves every sum's rounding as it is).
template <int NV>
static void scores_block(const float* X, int H, int Hp, const float* Yt, long ld, float* S, int T, int i0, int j) {
  v16 acc[4][NV];
  for (int a = 0; a < 4; ++a) for (int c = 0; c < NV; ++c) acc[a][c] = splat(0.f);
  for (int h = 0; h < H; ++h) {
    v16 b[NV];
    for (int c = 0; c < NV; ++c) b[c] = in_register(load(Yt + h * ld + j + 16 * c));
    for (int a = 0; a < 4; ++a) {
      v16 x = splat(X[(i0 + a) * Hp + h]);
      for (int c = 0; c < NV; ++c) acc[a][c] += x * b[c];
    }
  }
  for (int a = 0; a < 4 && i0 + a < T; ++a)
    for (int c = 0; c < NV; ++c) store(S + (i0 + a) * ld + j + 16 * c, acc[a][c]);
}

// S = X Yt (Yt's and S's rows ld apart) for every row, on the columns below 16*ceil((i0+4)/16)
// (causal) or all Sp of them.
// Column blocks outside, so that Yt's [H, 64] slab stays in L1 while X's rows stream past.
static void scores_mm(const float* X, int H, int Hp, const float* Yt, long ld, int Sp, float* S, int T, bool causal) {
  for (int j = 0; j < Sp; j += 64) {
    for (int i0 = causal ? std::max(0, (j - 3) / 4 * 4) : 0; i0 < T; i0 += 4) {
      int jend = causal ? std::min(Sp, round16(i0 + 4)) : Sp;
      if (jend <= j) continue;
      switch (std::min(4, (jend - j) / 16)) {
        case 1: scores_block<1>(X, H, Hp, Yt, ld, S, T, i0, j); break;
        case 2: scores_block<2>(X, H, Hp, Yt, ld, S, T, i0, j); break;
        case 3: scores_block<3>(X, H, Hp, Yt, ld, S, T, i0, j); break;
        default: scores_block<4>(X, H, Hp, Yt, ld, S, T, i0, j);
      }
    }
  }
}
