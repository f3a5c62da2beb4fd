// A 2-D transpose for the CPU, called through XLA's FFI: the weight gradients' x^T
// (txjax.ops.xla_cpu.transposed). As an XLA transpose, the elementwise work that produced x (a
// layer norm, the residual stream's gradient) is fused into the transposing loop and redone there
// with strided reads; a custom call's operand is materialized first, so that work is done once.
#include "cpu_kernels.h"

// y [M, K] = x [K, M]^T for elements of type T (V: 16 of them), in 16 x 16 tiles transposed in
// registers and, at the edges, element by element; strips of 64 rows of x are spread over the pool.
template <typename V, typename T>
static void transpose_as(ffi::ThreadPool& pool, const T* x, T* y, long K, long M) {
  constexpr long TB = 64;
  const int strips = (K + TB - 1) / TB;
  const int parts = std::min<int64_t>(strips, 8 * std::max<int64_t>(1, pool.num_threads()));
  parallel_for(pool, parts, []() { return 0; }, [=](int&, int part) {
    const long k_begin = (long)strips * part / parts * TB, k_end = std::min(K, (long)strips * (part + 1) / parts * TB);
    const long k16 = k_begin + (k_end - k_begin) / 16 * 16, m16 = M / 16 * 16;
    for (long m0 = 0; m0 < m16; m0 += 16)
      for (long k0 = k_begin; k0 < k16; k0 += 16) tile16<V>(x + k0 * M + m0, M, y + m0 * K + k0, K);
    for (long m = 0; m < M; ++m)  // the edges: the last M % 16 rows of y, the last columns of the strip
      for (long k = m < m16 ? k16 : k_begin; k < k_end; ++k) y[m * K + k] = x[k * M + m];
  });
}

static ffi::Error transpose(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  const long K = x.dimensions()[0], M = x.dimensions()[1];
  switch (ffi::ByteWidth(x.element_type())) {
    case 4: transpose_as<u32x16>(pool, (const uint32_t*)x.untyped_data(), (uint32_t*)y->untyped_data(), K, M); break;
    case 2: transpose_as<u16x16>(pool, (const uint16_t*)x.untyped_data(), (uint16_t*)y->untyped_data(), K, M); break;
    default: return ffi::Error::InvalidArgument("txjax_transpose: elements of 2 or 4 bytes only");
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(TxjaxTranspose, transpose,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()           // x [K, M]
                                  .Ret<ffi::AnyBuffer>());  // x^T [M, K]
