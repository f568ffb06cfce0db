// The split decode kernel for qjl:256 keys with int4 values (decode_kernel.cuh), every head dimension.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

KVQ_DECODE_PAIR(Qjl256, Int4);

}  // namespace kvq::cuda::detail
