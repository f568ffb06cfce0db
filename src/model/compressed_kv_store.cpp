// The runner's key/value cache as one sequence of a kvq::KVCache: appends go to the cache's pages and fp32 window,
// attention reads exactly what a serving system would (encoded pages through the codecs' scorers, then the window).
// Layers with different codecs or key centering (KVCacheSpec::layers, KVCacheSpec::layer_codecs) go to different
// KVCaches.
#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/error.hpp"
#include "model/kv_store.hpp"

namespace kvq {
namespace {

CacheConfig cache_config(const KVShape& shape, int capacity, const KVCacheSpec& spec, const LayerCodecs& codecs) {
  KVQ_CHECK(!codecs.key.empty() && !codecs.value.empty(), "a compressed key/value cache needs both a key "
            "and a value codec spec (got '", codecs.key, "' and '", codecs.value, "')");
  CacheConfig c;
  c.n_layers = shape.n_layers;
  c.n_kv_heads = shape.n_kv_heads;
  c.head_dim = shape.head_dim;
  c.block_tokens = spec.block_tokens;
  c.key_codec = codecs.key;
  c.value_codec = codecs.value;
  c.residual_tokens = spec.residual_tokens;
  // Pages are always full, so ceil(capacity / T) per layer is enough for any window size R.
  c.capacity_pages = static_cast<size_t>(shape.n_layers) *
                     ((static_cast<size_t>(capacity) + spec.block_tokens - 1) / std::max(spec.block_tokens, 1));
  c.seed = spec.seed;
  c.center_keys = codecs.center_keys;
  c.sink_tokens = spec.sink_tokens;
  return c;
}

// The spec's own pair, centered as it asks (every layer or none).
LayerCodecs spec_pair(const KVCacheSpec& spec) { return {spec.key_codec, spec.value_codec, spec.center_keys}; }

// Each layer's codec pair and centering: the spec's per-layer list (every layer centered where the spec asks for
// it), or its one pair in `layers` (f16 in the others), or its one pair in every layer.
std::vector<LayerCodecs> codecs_per_layer(const KVShape& shape, const KVCacheSpec& spec) {
  const size_t n_layers = static_cast<size_t>(shape.n_layers);
  if (!spec.layer_codecs.empty()) {
    KVQ_CHECK(spec.layer_codecs.size() == n_layers, "codecs given for ", spec.layer_codecs.size(),
              " layers, the model has ", n_layers);
    std::vector<LayerCodecs> codecs = spec.layer_codecs;
    for (LayerCodecs& c : codecs) c.center_keys = c.center_keys || spec.center_keys;
    return codecs;
  }
  if (spec.layers.empty()) return std::vector<LayerCodecs>(n_layers, spec_pair(spec));
  std::vector<LayerCodecs> codecs(n_layers, LayerCodecs{"f16", "f16", spec.center_keys});
  for (int l : spec.layers) {
    KVQ_CHECK(l >= 0 && l < shape.n_layers, "cache layer ", l, " is outside the model's ", shape.n_layers, " layers");
    codecs[static_cast<size_t>(l)] = spec_pair(spec);
  }
  return codecs;
}

// One sequence of one KVCache.
struct CacheSequence {
  explicit CacheSequence(const CacheConfig& config) : cache(config), seq(cache.add_sequence()) {}
  KVCache cache;
  SeqId seq;
};

class CompressedKVStore final : public KVStore {
 public:
  // One KVCache per distinct codec pair and centering, each with every layer (so that layer l's codecs get the seeds
  // of a uniform cache) but holding only the layers routed to it; the spec's own pair, where it has one, first.
  // Each layer's codecs start from the trained state the spec gives them.
  CompressedKVStore(const KVShape& shape, int capacity, const KVCacheSpec& spec, ThreadPool* pool)
      : shape_(shape), capacity_(capacity), pool_(pool) {
    const std::vector<LayerCodecs> codecs = codecs_per_layer(shape, spec);
    std::vector<LayerCodecs> pairs;
    if (spec.layer_codecs.empty()) pairs.push_back(spec_pair(spec));
    for (const LayerCodecs& c : codecs) {
      auto it = std::find_if(pairs.begin(), pairs.end(), [&](const LayerCodecs& p) { return p.same_codecs(c); });
      if (it == pairs.end()) it = pairs.insert(pairs.end(), c);
      route_.push_back(static_cast<size_t>(it - pairs.begin()));
    }
    for (const LayerCodecs& c : pairs)
      caches_.push_back(std::make_unique<CacheSequence>(cache_config(shape, capacity, spec, c)));
    for (int l = 0; l < shape.n_layers; ++l) {
      const LayerCodecs& c = codecs[static_cast<size_t>(l)];
      if (!c.key_state.empty() || !c.value_state.empty()) at(l).cache.load_layer_state(l, c.key_state, c.value_state);
    }
    plans_.resize(static_cast<size_t>(shape.n_layers));
  }

  void append(int layer, const float* k, const float* v, int n) override {
    CacheSequence& c = at(layer);
    KVQ_CHECK(c.cache.ready(layer), "the key/value cache codecs '", c.cache.config().key_codec, "' / '",
              c.cache.config().value_codec, "' need training: calibrate them on the model's own keys and values "
              "first (kvq ppl / generate --calib-tokens N)");
    KVQ_CHECK(n >= 0 && static_cast<size_t>(n) <= capacity_ - c.cache.length(c.seq, layer),
              "the key/value cache is full (", capacity_, " positions)");
    c.cache.append(c.seq, layer, k, v, static_cast<size_t>(n));
  }

  void attend(int layer, const float* q, int n, float* out) override {
    const CacheSequence& c = at(layer);
    const size_t floats = static_cast<size_t>(n) * shape_.n_heads * shape_.head_dim;
    const std::span<const float> qs(q, floats);
    const std::span<float> outs(out, floats);
    AttentionOptions options;
    if (!shape_.windows.empty()) options.window = static_cast<size_t>(shape_.windows[static_cast<size_t>(layer)]);
    if (n == 1) {
      std::optional<DecodePlan>& plan = plans_[static_cast<size_t>(layer)];
      if (!plan) plan.emplace(c.cache, layer, std::span<const SeqId>(&c.seq, 1), shape_.n_heads, options, pool_);
      plan->run(qs, outs);  // decode_attention, its scratch kept from the layer's last token
    } else {
      const size_t start = c.cache.length(c.seq, layer) - static_cast<size_t>(n);
      prefill_attention(c.cache, layer, c.seq, start, static_cast<size_t>(n), qs, outs, options, pool_);
    }
  }

  // A KVCache encodes its oldest T window tokens when an append brings the window to R + T. Positions before
  // such an event attend before it happens, the position that triggers it after, as in decoding.
  void append_attend(int layer, const float* k, const float* v, const float* q, int n, float* out) override {
    const CacheSequence& c = at(layer);
    const CacheConfig& config = c.cache.config();
    const size_t kv_row = static_cast<size_t>(shape_.n_kv_heads) * shape_.head_dim;
    const size_t q_row = static_cast<size_t>(shape_.n_heads) * shape_.head_dim;
    for (int done = 0; done < n;) {
      const int window = c.cache.view(c.seq, layer).residual_count;
      const int sink_room = config.sink_tokens - c.cache.view(c.seq, layer).sink_count;  // tokens the sinks still take
      const int before_encoding = config.residual_tokens + config.block_tokens - 1 - window + sink_room;
      const int m = before_encoding > 0 ? std::min(n - done, before_encoding) : 1;
      append(layer, k + done * kv_row, v + done * kv_row, m);
      attend(layer, q + done * q_row, m, out + done * q_row);
      done += m;
    }
  }

  int length(int layer) const override {
    const CacheSequence& c = at(layer);
    return static_cast<int>(c.cache.length(c.seq, layer));
  }

  void clear() override {
    for (auto& c : caches_) {
      c->cache.remove_sequence(c->seq);
      c->seq = c->cache.add_sequence();
    }
    for (auto& plan : plans_) plan.reset();
  }

  size_t bytes() const override {
    size_t total = 0;
    for (const auto& c : caches_) total += c->cache.memory().used_bytes;
    return total;
  }
  const KVCache* cache() const override { return &caches_.front()->cache; }

  bool needs_calibration() const override {
    for (int l = 0; l < shape_.n_layers; ++l)
      if (!at(l).cache.ready(l)) return true;
    return false;
  }

  void calibrate(int layer, const float* keys, const float* values, size_t n) override {
    CacheSequence& c = at(layer);
    KVQ_CHECK(c.cache.length(c.seq, layer) == 0, "calibrate the key/value cache before it holds positions");
    c.cache.train_layer(layer, keys, values, n);
  }

 private:
  CacheSequence& at(int layer) { return *caches_[route_[static_cast<size_t>(layer)]]; }
  const CacheSequence& at(int layer) const { return *caches_[route_[static_cast<size_t>(layer)]]; }

  KVShape shape_;
  size_t capacity_;
  ThreadPool* pool_;
  std::vector<std::unique_ptr<CacheSequence>> caches_;  // one per distinct codec pair and centering
  std::vector<size_t> route_;                           // [layer]: index into caches_
  std::vector<std::optional<DecodePlan>> plans_;        // [layer]: its decode plan, made at its first decode
};

}  // namespace

std::unique_ptr<KVStore> make_compressed_kv_store(const KVShape& shape, int capacity, const KVCacheSpec& spec,
                                                  ThreadPool* pool) {
  KVQ_CHECK(capacity > 0, "key/value cache capacity ", capacity);
  return std::make_unique<CompressedKVStore>(shape, capacity, spec, pool);
}

}  // namespace kvq
