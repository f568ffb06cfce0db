// Centered keys: a cache stores every key of one (sequence, layer, kv head) minus an offset, the mean of the
// sequence's first T keys, fixed when its first page is encoded. Attention does not change: all scores of one query
// move by the same <q, offset>, which softmax ignores. The codecs do: in real models a large part of a key's norm is
// common to the tokens near each other (Gemma 3 270M: 62-86 % per layer), which would otherwise set the quantization
// step of the per-token part that decides the softmax. After RoPE, channel pairs of middle frequency turn away from
// the first page's mean over a long context, so what centering gains depends on the model (docs/quality.md).
// Shared by the CPU and CUDA caches (a CUDA cache encodes on the host for codecs without append kernels).
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "kvq/cache.hpp"

namespace kvq::detail {

/// Whether a cache of this configuration centers its keys: asked for, and a key codec that quantizes.
inline bool centers_keys(const CacheConfig& config) {
  return config.center_keys && centering_applies(config.key_codec);
}

/// The keys of one append as its pages and its window must hold them. window: [H][slots][d] with `used` tokens per
/// head; fresh: [n][H][d]. With an offset already set, the fresh keys are centered (the window already is); where
/// this append encodes a sequence's first page (`sets_offset`), the offset is the mean of the stream's first T keys
/// and the window's keys are centered too, in a copy: nothing of the cache changes until commit().
class CenteredKeys {
 public:
  CenteredKeys(bool enabled, const std::vector<float>& offset, const float* window, size_t H, size_t slots, size_t d,
               size_t used, const float* fresh, size_t n, size_t T, bool encodes_page)
      : window_(window), fresh_(fresh) {
    if (!enabled || (offset.empty() && !encodes_page)) return;
    const float* mu = offset.data();
    if (offset.empty()) {
      new_offset_.assign(H * d, 0.f);
      for (size_t h = 0; h < H; ++h)
        for (size_t t = 0; t < T; ++t) {
          const float* k = t < used ? window + (h * slots + t) * d : fresh + ((t - used) * H + h) * d;
          for (size_t c = 0; c < d; ++c) new_offset_[h * d + c] += k[c];
        }
      for (float& x : new_offset_) x /= static_cast<float>(T);
      mu = new_offset_.data();
      window_copy_.assign(window, window + H * slots * d);
      for (size_t h = 0; h < H; ++h)
        for (size_t t = 0; t < used; ++t)
          for (size_t c = 0; c < d; ++c) window_copy_[(h * slots + t) * d + c] -= mu[h * d + c];
      window_ = window_copy_.data();
    }
    fresh_copy_.assign(fresh, fresh + n * H * d);
    for (size_t i = 0; i < n; ++i)
      for (size_t h = 0; h < H; ++h)
        for (size_t c = 0; c < d; ++c) fresh_copy_[(i * H + h) * d + c] -= mu[h * d + c];
    fresh_ = fresh_copy_.data();
  }

  const float* window() const { return window_; }
  const float* fresh() const { return fresh_; }

  /// Makes the cache's window and offset those of this append (before the window advances over fresh()).
  void commit(float* window, std::vector<float>& offset) {
    if (new_offset_.empty()) return;
    std::copy(window_copy_.begin(), window_copy_.end(), window);
    offset = std::move(new_offset_);
  }

 private:
  const float* window_;
  const float* fresh_;
  std::vector<float> new_offset_, window_copy_, fresh_copy_;
};

}  // namespace kvq::detail
