// The split decode kernel for qjl keys and values (decode_kernel.cuh), every head dimension.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

KVQ_DECODE_PAIR(Qjl, Qjl);

}  // namespace kvq::cuda::detail
