// The split decode kernels for qjl:256 keys with int4 or qjl:256 values (decode_kernel.cuh), every head dimension.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

KVQ_DECODE_PAIR(Qjl256, Int4);
KVQ_DECODE_PAIR(Qjl256, Qjl256);

}  // namespace kvq::cuda::detail
