// The split decode kernel for int8 keys and values (decode_kernel.cuh), every head dimension and GQA group.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

template bool launch_split<Int8, Int8>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);

}  // namespace kvq::cuda::detail
