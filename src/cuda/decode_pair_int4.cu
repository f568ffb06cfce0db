// The split decode kernel for int4 keys and values (decode_kernel.cuh), every head dimension and GQA group.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

template bool launch_split<Int4, Int4>(const SplitArgs&, int, int, dim3, size_t, cudaStream_t);

}  // namespace kvq::cuda::detail
