// The split decode kernel for kivi:2 keys and values (decode_kernel.cuh), every head dimension.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

KVQ_DECODE_PAIR(Kivi2, Kivi2);

}  // namespace kvq::cuda::detail
