// The table of codec pairs with a CUDA decode kernel.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

const std::vector<PairKernel>& pair_kernels() {
  static const std::vector<PairKernel> pairs = {
      {"f16", "f16", &launch_mma<F16>, true, true},
      {"bf16", "bf16", &launch_mma<Bf16>, true, true},
      {"int4", "int4", &launch_mma<Int4>, true, false},
      {"int8", "int8", &launch_mma<Int8>, true, false},
      {"kivi:2", "kivi:2", &launch_split<Kivi2, Kivi2>, false, false},
      {"turbo_mse:3", "turbo_mse:3", &launch_mma<TurboMse3>, true, false},
  };
  return pairs;
}

}  // namespace kvq::cuda::detail
