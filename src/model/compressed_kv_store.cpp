// The runner's key/value cache as one sequence of a kvq::KVCache: appends go to the cache's pages and fp32 window,
// attention reads exactly what a serving system would (encoded pages through the codecs' scorers, then the window).
#include <algorithm>
#include <span>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/error.hpp"
#include "model/kv_store.hpp"

namespace kvq {
namespace {

CacheConfig cache_config(const KvShape& shape, int capacity, const KvCacheSpec& spec) {
  KVQ_CHECK(!spec.key_codec.empty() && !spec.value_codec.empty(), "a compressed key/value cache needs both a key "
            "and a value codec spec (got '", spec.key_codec, "' and '", spec.value_codec, "')");
  CacheConfig c;
  c.n_layers = shape.n_layers;
  c.n_kv_heads = shape.n_kv_heads;
  c.head_dim = shape.head_dim;
  c.block_tokens = spec.block_tokens;
  c.key_codec = spec.key_codec;
  c.value_codec = spec.value_codec;
  c.residual_tokens = spec.residual_tokens;
  // Pages are always full, so ceil(capacity / T) per layer is enough for any window size R.
  c.capacity_pages = static_cast<size_t>(shape.n_layers) *
                     ((static_cast<size_t>(capacity) + spec.block_tokens - 1) / std::max(spec.block_tokens, 1));
  c.seed = spec.seed;
  return c;
}

class CompressedKvStore final : public KvStore {
 public:
  CompressedKvStore(const KvShape& shape, int capacity, const KvCacheSpec& spec, ThreadPool* pool)
      : shape_(shape), capacity_(capacity), cache_(cache_config(shape, capacity, spec)), pool_(pool) {
    seq_ = cache_.add_sequence();
  }

  void append(int layer, const float* k, const float* v, int n) override {
    KVQ_CHECK(cache_.ready(layer), "the key/value cache codecs '", cache_.config().key_codec, "' / '",
              cache_.config().value_codec, "' need training: calibrate them on the model's own keys and values "
              "first (kvq ppl / generate --calib-tokens N)");
    KVQ_CHECK(n >= 0 && static_cast<size_t>(n) <= capacity_ - cache_.length(seq_, layer),
              "the key/value cache is full (", capacity_, " positions)");
    cache_.append(seq_, layer, k, v, static_cast<size_t>(n));
  }

  void attend(int layer, const float* q, int n, float* out) override {
    const size_t floats = static_cast<size_t>(n) * shape_.n_heads * shape_.head_dim;
    const std::span<const float> qs(q, floats);
    const std::span<float> outs(out, floats);
    if (n == 1) {
      decode_attention(cache_, layer, std::span<const SeqId>(&seq_, 1), qs, outs, {}, pool_);
    } else {
      const size_t start = cache_.length(seq_, layer) - static_cast<size_t>(n);
      prefill_attention(cache_, layer, seq_, start, static_cast<size_t>(n), qs, outs, {}, pool_);
    }
  }

  int length(int layer) const override { return static_cast<int>(cache_.length(seq_, layer)); }

  void clear() override {
    cache_.remove_sequence(seq_);
    seq_ = cache_.add_sequence();
  }

  size_t bytes() const override { return cache_.memory().used_bytes; }
  const KVCache* cache() const override { return &cache_; }

  bool needs_calibration() const override {
    for (int l = 0; l < shape_.n_layers; ++l)
      if (!cache_.ready(l)) return true;
    return false;
  }

  void calibrate(int layer, const float* keys, const float* values, size_t n) override {
    KVQ_CHECK(cache_.length(seq_, layer) == 0, "calibrate the key/value cache before it holds positions");
    cache_.train_layer(layer, keys, values, n);
  }

 private:
  KvShape shape_;
  size_t capacity_;
  KVCache cache_;
  ThreadPool* pool_;
  SeqId seq_ = 0;
};

}  // namespace

std::unique_ptr<KvStore> make_compressed_kv_store(const KvShape& shape, int capacity, const KvCacheSpec& spec,
                                                  ThreadPool* pool) {
  KVQ_CHECK(capacity > 0, "key/value cache capacity ", capacity);
  return std::make_unique<CompressedKvStore>(shape, capacity, spec, pool);
}

}  // namespace kvq
