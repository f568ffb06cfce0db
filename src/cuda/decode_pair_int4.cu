// The split decode kernel for int4 keys and values (decode_kernel.cuh), every head dimension.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

KVQ_DECODE_PAIR(Int4, Int4);

}  // namespace kvq::cuda::detail
