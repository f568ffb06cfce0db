// The codec pairs with a CUDA decode kernel: one explicit instantiation of launch_split per pair, each in its own
// translation unit (decode_pair_*.cu) so that they compile in parallel. f16, bf16, int8, int4 and turbo_mse
// run on the tensor cores (decode_kernel_mma.cuh), kivi on the CUDA cores (decode_kernel.cuh).
#pragma once

#include <string>
#include <vector>

#include "cuda/decode_kernel.cuh"
#include "cuda/decode_kernel_mma.cuh"

namespace kvq::cuda::detail {

using Launch = bool (*)(const SplitArgs&, int d, int g, dim3 grid, size_t smem_bytes, cudaStream_t stream);

struct PairKernel {
  std::string key, value;  // codec ids: "f16", "int4", "kivi:2", "turbo_mse:3", ...
  Launch launch;
  bool tiles;    // the kernel takes several pages per tile (SplitArgs::tile_pages)
  bool swizzle;  // its blocks are staged swizzled (SplitArgs::swizzle_chunks)
};

/// Every pair with a kernel.
const std::vector<PairKernel>& pair_kernels();

using F16 = FloatMma<false>;
using Bf16 = FloatMma<true>;
using Int4 = IntMma<4>;
using Int8 = IntMma<8>;
using Kivi2 = KiviTraits<2>;
using TurboMse3 = TurboMseMma<3>;

extern template bool launch_mma<F16>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);
extern template bool launch_mma<Bf16>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);
extern template bool launch_mma<Int4>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);
extern template bool launch_mma<Int8>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);
extern template bool launch_split<Kivi2, Kivi2>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);
extern template bool launch_mma<TurboMse3>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);

}  // namespace kvq::cuda::detail
