// A compressed KV cache in 30 lines: int4 keys and turbo_mse:3 values for one layer of 8 kv heads, a prefill chunk
// and a decode step appended, attention for 32 query heads computed on the packed pages, the cache saved and loaded.
#include <cstdio>
#include <random>
#include <vector>

#include <kvq/attention.hpp>
#include <kvq/cache.hpp>

int main() {
  kvq::CacheConfig config;
  config.n_kv_heads = 8;
  config.head_dim = 128;
  config.key_codec = "int4";
  config.value_codec = "turbo_mse:3";
  config.capacity_pages = 64;  // pages of 64 tokens, shared by every sequence and layer
  kvq::KVCache cache(config, kvq::Device::cpu());  // Device::cuda(0): the same cache on a GPU (a CUDA build)
  const kvq::SeqId seq = cache.add_sequence();

  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const auto tokens = [&](size_t n) {
    std::vector<float> x(n * 8 * 128);  // [token][kv head][channel]
    for (float& v : x) v = normal(rng);
    return x;
  };
  const std::vector<float> keys = tokens(1000), values = tokens(1000), key = tokens(1), value = tokens(1);
  cache.append(seq, 0, keys.data(), values.data(), 1000);  // prefill: a chunk of 1000 tokens
  cache.append(seq, 0, key.data(), value.data(), 1);       // decode: one token

  std::vector<float> query(32 * 128), out(32 * 128);  // 32 query heads: groups of 4 share a kv head
  for (float& v : query) v = normal(rng);
  kvq::decode_attention(cache, 0, std::vector<kvq::SeqId>{seq}, query, out);

  cache.save("example.kvq");
  const kvq::KVCache loaded = kvq::KVCache::load("example.kvq");
  const kvq::CacheMemory m = loaded.memory();
  std::printf("%zu tokens in %zu bytes (%.2f bits per element); head 0's output starts %.4f %.4f %.4f\n",
              loaded.length(seq), m.used_bytes, m.bits_per_element, out[0], out[1], out[2]);
}
