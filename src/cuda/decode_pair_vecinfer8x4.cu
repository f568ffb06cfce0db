// The split decode kernel for vecinfer:8/4 keys and values (decode_kernel.cuh), every head dimension.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

KVQ_DECODE_PAIR(VecInfer8x4, VecInfer8x4);

}  // namespace kvq::cuda::detail
