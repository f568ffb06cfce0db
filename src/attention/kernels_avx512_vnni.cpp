// The fused kernels for AVX-512 with VNNI: int8 and int4 keys scored by 8-bit integer dot products
// (fused_kernel.hpp), exact and fast, and turbo_mse:1..3 and kivi keys in the fast kernels; the other phases as in
// kernels_avx512.cpp. This file alone is compiled with those flags.
#include "attention/kernel_args.hpp"

#if defined(__x86_64__)
#include "attention/fused_kernel.hpp"
#include "attention/vector_avx512_vnni.hpp"

namespace kvq::detail {
namespace avx512vnni {
// Only the int keys are instantiated: the other pairs' code would be kernels_avx512.cpp's again (select_page_kernel
// falls back to it), and compiling it twice took this file from 26 s to 109 s of a release build.
KernelFn fused_kernel(BlockFormat key, BlockFormat value) {
  if (key == BlockFormat::int4) return fused_kernel_with_keys<Avx512Vnni, BlockFormat::int4>(value);
  if (key == BlockFormat::int8) return fused_kernel_with_keys<Avx512Vnni, BlockFormat::int8>(value);
  return nullptr;
}

// int4, int8 and turbo_mse:1..3 keys with two digits per query (docs/METHODS.md, "Fast attention kernels"): one
// digit's rounding of the query measured up to a tenth of int4 keys' own error on outlier data, and of the order of
// int8 keys' own. turbo_mse:4 keys stay exact: their levels as bytes (signed_byte_levels.hpp) measured 1/10 to 1/14
// of the codec's own error, at the contract's edge (its innermost level is byte 6, rounded by up to 8%). kivi keys
// with two digits of the query times the page's channel scales, formed per page (key_scores_kivi_int).
KernelFn fast_kernel(BlockFormat key, BlockFormat value) {
  using F = BlockFormat;
  switch (key) {
    case F::int4:
      return fused_kernel_with_keys<Avx512Vnni, F::int4, 2>(value);
    case F::int8:
      return fused_kernel_with_keys<Avx512Vnni, F::int8, 2>(value);
    case F::turbo1:
      return fused_kernel_with_keys<Avx512Vnni, F::turbo1, 2>(value);
    case F::turbo2:
      return fused_kernel_with_keys<Avx512Vnni, F::turbo2, 2>(value);
    case F::turbo3:
      return fused_kernel_with_keys<Avx512Vnni, F::turbo3, 2>(value);
    case F::kivi2:
      return fused_kernel_with_keys<Avx512Vnni, F::kivi2, 2>(value);
    case F::kivi3:
      return fused_kernel_with_keys<Avx512Vnni, F::kivi3, 2>(value);
    case F::kivi4:
      return fused_kernel_with_keys<Avx512Vnni, F::kivi4, 2>(value);
    default:
      return nullptr;
  }
}
}  // namespace avx512vnni
}  // namespace kvq::detail

#else

namespace kvq::detail::avx512vnni {
KernelFn fused_kernel(BlockFormat, BlockFormat) { return nullptr; }
KernelFn fast_kernel(BlockFormat, BlockFormat) { return nullptr; }
}  // namespace kvq::detail::avx512vnni

#endif
