// The split decode kernel for bf16 keys and values (decode_kernel.cuh), every head dimension.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

KVQ_DECODE_PAIR(Bf16, Bf16);

}  // namespace kvq::cuda::detail
