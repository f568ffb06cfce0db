// The codec pairs with a CUDA decode kernel: one explicit instantiation of launch_split per pair, each in its own
// translation unit (decode_pair_*.cu) so that they compile in parallel.
#pragma once

#include <string>
#include <vector>

#include "cuda/decode_kernel.cuh"

namespace kvq::cuda::detail {

using Launch = bool (*)(const SplitArgs&, int d, int g, dim3 grid, size_t smem_bytes, cudaStream_t stream);

struct PairKernel {
  std::string key, value;  // codec ids: "f16", "bf16", "int4", "int8"
  Launch launch;
};

/// Every pair with a kernel.
const std::vector<PairKernel>& pair_kernels();

using F16 = FloatTraits<false>;
using Bf16 = FloatTraits<true>;
using Int4 = IntTraits<4>;
using Int8 = IntTraits<8>;

extern template bool launch_split<F16, F16>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);
extern template bool launch_split<Bf16, Bf16>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);
extern template bool launch_split<Int4, Int4>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);
extern template bool launch_split<Int8, Int8>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);

}  // namespace kvq::cuda::detail
