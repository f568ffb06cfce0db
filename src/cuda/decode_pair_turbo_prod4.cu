// The split decode kernel for turbo_prod:4 keys and values (decode_kernel.cuh), every head dimension.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

KVQ_DECODE_PAIR(TurboProd4, TurboProd4);

}  // namespace kvq::cuda::detail
