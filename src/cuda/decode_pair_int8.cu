// The tensor-core split decode kernel for int8 keys and values (decode_kernel_mma.cuh), every head dimension and
// GQA group.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

template bool launch_mma<Int8>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);

}  // namespace kvq::cuda::detail
