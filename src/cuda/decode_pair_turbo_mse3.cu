// The tensor-core split decode kernel for turbo_mse:3 keys and values (decode_kernel_mma.cuh), every head dimension
// and GQA group.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

template bool launch_mma<TurboMse3>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);

}  // namespace kvq::cuda::detail
