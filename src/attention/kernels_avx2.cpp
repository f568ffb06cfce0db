#include "attention/kernel_args.hpp"

namespace kvq::detail::avx2 {
KernelFn fused_kernel(BlockFormat, BlockFormat) { return nullptr; }
}  // namespace kvq::detail::avx2
