// The fused kernels for AArch64 NEON: 4 fp32 lanes (vector_neon.hpp). Baseline armv8-a, so no extra flags.
#include "attention/kernel_args.hpp"

#if defined(__aarch64__)
#include "attention/fused_kernel.hpp"
#include "attention/vector_neon.hpp"

namespace kvq::detail::neon {
KernelFn fused_kernel(BlockFormat key, BlockFormat value) { return fused_kernel_for<Neon>(key, value); }
}  // namespace kvq::detail::neon

#else

namespace kvq::detail::neon {
KernelFn fused_kernel(BlockFormat, BlockFormat) { return nullptr; }
}  // namespace kvq::detail::neon

#endif
