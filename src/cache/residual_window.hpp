// The fp32 window of unencoded tokens, advanced after an append: shared by the CPU and CUDA caches
// (a CUDA cache runs it on host copies of its windows for codecs without append kernels).
#pragma once

#include <cstddef>
#include <cstring>

namespace kvq::detail {

/// window: [H][slots][d], the first `used` slots of each head in use. The stream is those tokens followed by
/// n_tokens fresh ones ([n_tokens][H][d]); its first `encoded` tokens went to pages, the rest become the window.
inline void advance_window(float* window, size_t H, size_t slots, size_t d, size_t used, size_t encoded,
                           const float* fresh, size_t n_tokens) {
  for (size_t h = 0; h < H; ++h) {
    float* w = window + h * slots * d;
    size_t slot = 0;
    if (encoded < used) {
      std::memmove(w, w + encoded * d, (used - encoded) * d * sizeof(float));
      slot = used - encoded;
    }
    for (size_t i = encoded > used ? encoded - used : 0; i < n_tokens; ++i, ++slot)
      std::memcpy(w + slot * d, fresh + (i * H + h) * d, d * sizeof(float));
  }
}

}  // namespace kvq::detail
