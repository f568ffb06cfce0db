// IEEE single operations rounded to nearest (ties to even), each rounded once and never fused with its neighbours,
// the same on the device (the _rn intrinsics) and on the host (the tests run the device's arithmetic there).
#pragma once

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

#include "cuda/encode_layout.cuh"

namespace kvq::cuda::detail {

KVQ_ENCODE_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KVQ_ENCODE_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
KVQ_ENCODE_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KVQ_ENCODE_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
/// a b + c rounded once.
KVQ_ENCODE_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

}  // namespace kvq::cuda::detail
