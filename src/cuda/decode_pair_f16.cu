// The split decode kernel for f16 keys and values (decode_kernel.cuh), every head dimension and GQA group.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

template bool launch_split<F16, F16>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);

}  // namespace kvq::cuda::detail
