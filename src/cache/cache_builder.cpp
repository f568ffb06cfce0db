#include "cache/cache_builder.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "cache/key_offset.hpp"
#include "kvq/error.hpp"

namespace kvq::detail {

CacheBuilder::CacheBuilder(const CacheConfig& config) : cache_(config) {}

void CacheBuilder::load_codecs(int layer, const Codec& key, const Codec& value) {
  cache_.check_layer(layer);
  const size_t l = static_cast<size_t>(layer);
  for (const auto& [to, from] :
       {std::pair{cache_.key_codecs_[l].get(), &key}, std::pair{cache_.value_codecs_[l].get(), &value}}) {
    KVQ_CHECK(to->spec().str() == from->spec().str(), "CacheBuilder: layer ", layer, " codec '", from->spec().str(),
              "' where the configuration has '", to->spec().str(), "'");
    if (from->trained()) to->load_state(from->state());
  }
}

void CacheBuilder::add_sequence(SeqId id) {
  KVQ_CHECK(!cache_.has_sequence(id), "CacheBuilder: sequence ", id, " added twice");
  cache_.sequences_.insert(id, cache_.config_.n_layers);  // the next id moves past it
}

void CacheBuilder::fill_layer(SeqId id, int layer, const uint8_t* pages, size_t n_pages, const float* window,
                              size_t window_slots, int window_count, const float* key_offset) {
  cache_.check_layer(layer);
  KVCache::LayerState& ls = cache_.sequences_.at(id).layers[static_cast<size_t>(layer)];
  const CacheConfig& c = cache_.config_;
  const size_t H = static_cast<size_t>(c.n_kv_heads), d = static_cast<size_t>(c.head_dim);
  const size_t slots = cache_.residual_slots();
  KVQ_CHECK(ls.pages.empty() && ls.residual_count == 0, "CacheBuilder: sequence ", id, " layer ", layer,
            " filled twice");
  KVQ_CHECK(window_count >= 0 && static_cast<size_t>(window_count) <= std::min(slots, window_slots),
            "CacheBuilder: a window of ", window_count, " tokens (at most ", slots, ", in ", window_slots, " slots)");
  KVQ_CHECK(n_pages <= cache_.free_pages(), "CacheBuilder: sequence ", id, " layer ", layer, " holds ", n_pages,
            " pages, only ", cache_.free_pages(), " of the pool's ", c.capacity_pages, " are left");
  KVQ_CHECK((key_offset != nullptr) == (centers_keys(c) && n_pages > 0), "CacheBuilder: sequence ", id, " layer ",
            layer, key_offset != nullptr ? " has a key offset without centered keys and pages"
                                         : " has centered keys in pages but no key offset");
  ls.pages.reserve(n_pages);
  cache_.free_.take(n_pages, ls.pages);
  for (size_t j = 0; j < n_pages; ++j)
    std::memcpy(cache_.page_mut(ls.pages[j]), pages + j * cache_.page_bytes(), cache_.page_bytes());
  cache_.reserve_window(ls, static_cast<size_t>(window_count));
  const size_t used = static_cast<size_t>(window_count) * d;
  for (size_t row = 0; row < 2 * H && used > 0; ++row)  // keys, then values
    std::memcpy(ls.residual.data() + row * ls.window_slots * d, window + row * window_slots * d, used * sizeof(float));
  ls.residual_count = window_count;
  if (key_offset != nullptr) ls.key_offset.assign(key_offset, key_offset + H * d);
}

void CacheBuilder::fill_sinks(SeqId id, int layer, const uint16_t* sinks, size_t slots, int count) {
  cache_.check_layer(layer);
  KVCache::LayerState& ls = cache_.sequences_.at(id).layers[static_cast<size_t>(layer)];
  const CacheConfig& c = cache_.config_;
  KVQ_CHECK(count >= 0 && count <= c.sink_tokens, "CacheBuilder: ", count, " sink tokens (at most ", c.sink_tokens,
            ")");
  KVQ_CHECK(ls.sink_count == 0, "CacheBuilder: sequence ", id, " layer ", layer, " given sinks twice");
  KVQ_CHECK(count == c.sink_tokens || (ls.pages.empty() && ls.residual_count == 0), "CacheBuilder: sequence ", id,
            " layer ", layer, " holds tokens after ", count, " of its ", c.sink_tokens, " sink tokens");
  if (count == 0) return;
  KVQ_CHECK(sinks != nullptr && slots >= static_cast<size_t>(count), "CacheBuilder: ", count, " sink tokens in ",
            slots, " slots");
  const size_t H = static_cast<size_t>(c.n_kv_heads), d = static_cast<size_t>(c.head_dim);
  cache_.reserve_sinks(ls, static_cast<size_t>(count));
  for (size_t row = 0; row < 2 * H; ++row)  // keys, then values
    std::copy_n(sinks + row * slots * d, static_cast<size_t>(count) * d, ls.sinks.data() + row * ls.sink_slots * d);
  ls.sink_count = count;
}

void CacheBuilder::set_next_id(SeqId next) {
  KVQ_CHECK(next >= cache_.sequences_.next_id, "CacheBuilder: next sequence id ", next, " below ",
            cache_.sequences_.next_id, " (an id in use)");
  cache_.sequences_.next_id = next;
}

}  // namespace kvq::detail
