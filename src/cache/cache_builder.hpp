// A KVCache assembled from its parts: codec states, and per sequence and layer its pages, window, key offset and
// sink tokens.
// KVCache::to copies a cache to the CPU with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "kvq/cache.hpp"

namespace kvq::detail {

class CacheBuilder {
 public:
  /// An empty cache of this configuration (codecs as KVCache(config) builds them).
  explicit CacheBuilder(const CacheConfig& config);

  /// The layer's key and value codecs take the state of `key` and `value` (same specs), where those are trained.
  void load_codecs(int layer, const Codec& key, const Codec& value);
  /// A new, empty sequence `id` (not present yet); the cache's next id becomes at least id + 1.
  void add_sequence(SeqId id);
  /// Fills one layer of a sequence added above and still empty: n_pages pages of page_bytes() each, back to back;
  /// the window [keys H][window_slots][d] then values, its first window_count slots of each head used (at most
  /// R + T - 1); the key offset [H][d] (centered keys with pages; else null).
  void fill_layer(SeqId id, int layer, const uint8_t* pages, size_t n_pages, const float* window, size_t window_slots,
                  int window_count, const float* key_offset);
  /// Gives one layer of a sequence added above `count` sink tokens (at most sink_tokens): f16 keys [H][slots][d],
  /// then values, the first `count` slots of each head used (null when count is 0).
  void fill_sinks(SeqId id, int layer, const uint16_t* sinks, size_t slots, int count);
  /// The next sequence id add_sequence of the finished cache hands out (at least every id added + 1).
  void set_next_id(SeqId next);

  KVCache finish() { return std::move(cache_); }

 private:
  KVCache cache_;
};

}  // namespace kvq::detail
