// The split decode kernel for int8 keys and values (decode_kernel.cuh), every head dimension.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

KVQ_DECODE_PAIR(Int8, Int8);

}  // namespace kvq::cuda::detail
