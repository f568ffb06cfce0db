// The online-softmax step every attention path shares.
#pragma once

#include <cstddef>

#include "kvq/attention.hpp"

namespace kvq::detail {

/// One block of tokens for n_q queries: s[i * stride + t], t < n, are query i's scaled scores (-inf where masked).
/// Raises each state's running max, rescales its l and o, adds the block's exp sums to l, and overwrites the scores
/// with the weights exp(s - m) that the values are to be summed with (0 where masked).
void online_softmax_block(float* s, size_t stride, int n_q, int n, AttnState* states);

}  // namespace kvq::detail
