// The fused kernels for AVX-512 (F, BW, VL, DQ): 16 fp32 lanes. This file alone is compiled with those flags.
#include "attention/kernel_args.hpp"

#if defined(__x86_64__)
#include "attention/fused_kernel.hpp"
#include "attention/vector_avx512.hpp"

namespace kvq::detail {
namespace avx512 {
KernelFn fused_kernel(BlockFormat key, BlockFormat value) { return fused_kernel_for<Avx512>(key, value); }
}  // namespace avx512
}  // namespace kvq::detail

#else

namespace kvq::detail::avx512 {
KernelFn fused_kernel(BlockFormat, BlockFormat) { return nullptr; }
}  // namespace kvq::detail::avx512

#endif
