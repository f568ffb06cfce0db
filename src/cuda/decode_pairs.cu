// The table of codec pairs with a CUDA decode kernel.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

const std::vector<PairKernel>& pair_kernels() {
  static const std::vector<PairKernel> pairs = {
      {"f16", "f16", &launch_split<F16, F16>},
      {"bf16", "bf16", &launch_split<Bf16, Bf16>},
      {"int4", "int4", &launch_split<Int4, Int4>},
      {"int8", "int8", &launch_split<Int8, Int8>},
  };
  return pairs;
}

}  // namespace kvq::cuda::detail
