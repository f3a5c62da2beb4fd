// bfloat16 products with float32 sums for txjax's CPU kernels, and the layouts their operands take:
// on Intel's AMX tiles where the compiler targets them (-march=native on a CPU with amx_tile and
// amx_bf16, and Linux grants the tile state: `bf16_dot_usable()`), else by AVX512-BF16's dot
// products of pairs (vdpbf16ps: AMD Zen 4, Intel Cooper Lake). In both, a product of two bfloat16
// numbers is exact in float32 and the sums are float32 (subnormals flushed to zero), in orders of
// their own. Elsewhere the kernels keep their float32 vector code.
#pragma once

#include "cpu_kernels.h"

// C[m, n] = sum_k A[m, k] B[k, n] for m < M and n < N (both multiples of 32), in 32 x 32 blocks
// (bf16_mm): A bfloat16 with rows lda apart; B as pairs along k, Bp[k / 2][n][k % 2], its rows of
// pairs ldb elements apart; C float32 with rows ldc apart. range(m0) gives the block of rows
// [m0, m0 + 32) its k range [k0, k1) (multiples of 32; A and B hold zeros where a causal product
// has none) and its last column n1: blocks at n >= n1 are not computed.
struct TileRange { int k0, k1, n1; };

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define TXJAX_BF16_DOT 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

// Whether this process may use the tiles: Linux grants the tile data state on request (once).
static inline bool bf16_dot_usable() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ok;
}

// The tiles configured as 16 rows of 64 bytes for as long as it lives (one work item: other code on
// the thread, such as XLA's own AMX products, configures them its own way).
struct Bf16Unit {
  Bf16Unit() {
    struct { uint8_t palette, start; uint8_t reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg{};
    cfg.palette = 1;
    for (int i = 0; i < 8; ++i) { cfg.colsb[i] = 64; cfg.rows[i] = 16; }
    _tile_loadconfig(&cfg);
  }
  ~Bf16Unit() { _tile_release(); }
};

// Each 32 x 32 block of C in four 16 x 16 tiles.
template <typename R>
static void bf16_mm(const uint16_t* A, long lda, const uint16_t* Bp, long ldb, float* C, long ldc, int M, R range) {
  for (int m0 = 0; m0 < M; m0 += 32) {
    const TileRange r = range(m0);
    for (int n0 = 0; n0 < r.n1; n0 += 32) {
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int k = r.k0; k < r.k1; k += 32) {
        _tile_loadd(4, A + m0 * lda + k, lda * 2);
        _tile_loadd(5, A + (m0 + 16) * lda + k, lda * 2);
        _tile_loadd(6, Bp + k / 2 * ldb + 2 * n0, ldb * 2);
        _tile_loadd(7, Bp + k / 2 * ldb + 2 * n0 + 32, ldb * 2);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
      }
      float* c = C + m0 * ldc + n0;
      _tile_stored(0, c, ldc * 4); _tile_stored(1, c + 16, ldc * 4);
      _tile_stored(2, c + 16 * ldc, ldc * 4); _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
    }
  }
}
#elif defined(__AVX512BF16__)
#define TXJAX_BF16_DOT 1
#include <immintrin.h>

static inline bool bf16_dot_usable() { return true; }
struct Bf16Unit {};  // nothing to configure

// Each 32 x 32 block of C as four blocks of 8 rows, held in 16 registers while k runs: per pair of
// k, one load of B's pairs for 32 columns (two registers) serves 8 rows, each row's pair of A
// broadcast once.
template <typename R>
static void bf16_mm(const uint16_t* A, long lda, const uint16_t* Bp, long ldb, float* C, long ldc, int M, R range) {
  for (int m0 = 0; m0 < M; m0 += 32) {
    const TileRange r = range(m0);
    for (int i0 = m0; i0 < m0 + 32; i0 += 8)
      for (int n0 = 0; n0 < r.n1; n0 += 32) {
        __m512 c[8][2];
        for (int i = 0; i < 8; ++i) c[i][0] = c[i][1] = _mm512_setzero_ps();
        for (int k = r.k0; k < r.k1; k += 2) {
          const uint16_t* b = Bp + k / 2 * ldb + 2 * n0;
          const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 32);
          for (int i = 0; i < 8; ++i) {
            uint32_t pair;
            std::memcpy(&pair, A + (i0 + i) * lda + k, 4);
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)pair);
            c[i][0] = _mm512_dpbf16_ps(c[i][0], a, b0);
            c[i][1] = _mm512_dpbf16_ps(c[i][1], a, b1);
          }
        }
        for (int i = 0; i < 8; ++i) {
          _mm512_storeu_ps(C + (i0 + i) * ldc + n0, c[i][0]);
          _mm512_storeu_ps(C + (i0 + i) * ldc + n0 + 16, c[i][1]);
        }
      }
  }
}
#else
static inline bool bf16_dot_usable() { return false; }
#endif

static inline int round32(int x) { return (x + 31) / 32 * 32; }

// Rows [0, rows) of head n of x [rows, heads, H] (bfloat16 bits) into out [rows, ld]; columns from H
// and rows from `rows` up to `rows_to` zero.
static void rows_bf16(const uint16_t* x, int rows, int heads, int H, int n, uint16_t* out, int ld, int rows_to) {
  for (int t = 0; t < rows; ++t) {
    std::memcpy(out + (long)t * ld, x + ((long)t * heads + n) * H, 2 * H);
    std::memset(out + (long)t * ld + H, 0, 2 * (ld - H));
  }
  std::memset(out + (long)rows * ld, 0, 2 * (long)(rows_to - rows) * ld);
}

// Rows 2i and 2i + 1 of x [rows (even), cols (a multiple of 16)] interleaved: out[i][c][e] = x[2i + e][c],
// the layout of bf16_mm's B along x's rows.
static void pair_rows(const uint16_t* x, int rows, int cols, uint16_t* out) {
  typedef uint16_t u16x32 __attribute__((vector_size(64)));
  for (int i = 0; i < rows / 2; ++i)
    for (int c = 0; c < cols; c += 16) {
      u16x16 a, b;
      std::memcpy(&a, x + (2L * i) * cols + c, 32);
      std::memcpy(&b, x + (2L * i + 1) * cols + c, 32);
      u16x32 ab = __builtin_shufflevector(a, b, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 8, 24, 9, 25,
                                          10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
      std::memcpy(out + (2L * i * cols + 2 * c), &ab, 64);
    }
}

// y [cols, rows] = x [rows, cols]^T for elements of 2 or 4 bytes (V: 16 of them), both multiples of 16.
template <typename V, typename E>
static void transpose_tiles(const E* x, int rows, int cols, E* y) {
  for (int r = 0; r < rows; r += 16)
    for (int c = 0; c < cols; c += 16) tile16<V>(x + (long)r * cols + c, cols, y + (long)c * rows + r, rows);
}
