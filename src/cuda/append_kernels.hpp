// The append path's kernels besides the encoders: the key offset of centered keys, and the gather that moves the
// stream's unencoded tokens toward the fp32 window (checking the fresh ones for NaN and Inf on the way).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/device_encoder.hpp"

namespace kvq::cuda::detail {

/// offset[h][c] = the mean of the stream's first T keys of head h (window tokens, then fresh ones), summed in token
/// order in fp32 as src/cache/key_offset.hpp does. src.offset is ignored.
void launch_key_mean(const EncodeSource& src, float* offset, cudaStream_t stream);

/// For the keys (role 0) and the values (role 1) in one launch: dst[role][h][dst_slot + s] = stream token
/// stream_first + s of head h (centered as an encoder reads it), s < count; each dst is [H][slots][d] and must not
/// overlap the window tokens it reads. A NaN or Inf among the fresh tokens lowers *nonfinite[role] to its flat index
/// in that role's fresh tokens.
void launch_gather_window(const EncodeSource& keys, const EncodeSource& values, size_t stream_first, size_t count,
                          float* dst_keys, float* dst_values, size_t dst_slot, unsigned long long* nonfinite,
                          cudaStream_t stream);

}  // namespace kvq::cuda::detail
