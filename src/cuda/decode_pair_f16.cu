// The split decode kernel for f16 keys and values (decode_kernel.cuh), every head dimension.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

KVQ_DECODE_PAIR(F16, F16);

}  // namespace kvq::cuda::detail
