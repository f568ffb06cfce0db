// The split decode kernel for vecinfer:10/4 keys and values (decode_kernel.cuh), every head dimension.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

KVQ_DECODE_PAIR(VecInfer10x4, VecInfer10x4);

}  // namespace kvq::cuda::detail
