// A 2-D transpose for the CPU, called through XLA's FFI: the weight gradients' x^T
// (txjax.ops.xla_cpu.transposed). As an XLA transpose, the elementwise work that produced x (a
// layer norm, the residual stream's gradient) is fused into the transposing loop and redone there
// with strided reads; a custom call's operand is materialized first, so that work is done once.
#include "cpu_kernels.h"

// y [M, K] = x [K, M]^T for elements of type T, in TB x TB blocks that stay in cache; the rows of
// blocks are spread over the pool.
template <typename T>
static void transpose_as(ffi::ThreadPool& pool, const T* x, T* y, long K, long M) {
  constexpr long TB = 32;
  const int blocks = (K + TB - 1) / TB;
  const int parts = std::min<int64_t>(blocks, 8 * std::max<int64_t>(1, pool.num_threads()));
  parallel_for(pool, parts, []() { return 0; }, [=](int&, int part) {
    const long k_end = std::min(K, (long)blocks * (part + 1) / parts * TB);
    for (long k0 = (long)blocks * part / parts * TB; k0 < k_end; k0 += TB)
      for (long m0 = 0; m0 < M; m0 += TB) {
        const long k1 = std::min(K, k0 + TB), m1 = std::min(M, m0 + TB);
        for (long m = m0; m < m1; ++m)
          for (long k = k0; k < k1; ++k) y[m * K + k] = x[k * M + m];
      }
  });
}

static ffi::Error transpose(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  const long K = x.dimensions()[0], M = x.dimensions()[1];
  switch (ffi::ByteWidth(x.element_type())) {
    case 4: transpose_as(pool, (const uint32_t*)x.untyped_data(), (uint32_t*)y->untyped_data(), K, M); break;
    case 2: transpose_as(pool, (const uint16_t*)x.untyped_data(), (uint16_t*)y->untyped_data(), K, M); break;
    default: return ffi::Error::InvalidArgument("txjax_transpose: elements of 2 or 4 bytes only");
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(TxjaxTranspose, transpose,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()           // x [K, M]
                                  .Ret<ffi::AnyBuffer>());  // x^T [M, K]
