// The split decode kernel for turbo_mse:3 keys and values (decode_kernel.cuh), every head dimension.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

KVQ_DECODE_PAIR(TurboMse3, TurboMse3);

}  // namespace kvq::cuda::detail
