// The boundary between the forward pass and the key/value cache: the model hands over each position's keys and
// values (after RoPE) and asks for the attention output of its query heads. Nothing else in the runner touches
// keys or values, so a compressed cache (kvq::KVCache and decode attention) plugs in by implementing this class.
#pragma once

#include <memory>
#include <vector>

namespace kvq {

struct KvShape {
  int n_layers, n_kv_heads, n_heads, head_dim;
};

class KvStore {
 public:
  virtual ~KvStore() = default;
  /// Appends the next position's key and value for `layer`. k, v: [n_kv_heads][head_dim].
  virtual void append(int layer, const float* k, const float* v) = 0;
  /// Causal attention of the newest position of `layer` over every position stored for it (itself included):
  /// q: [n_heads][head_dim] -> out: [n_heads][head_dim]. Query head h reads key/value head
  /// h / (n_heads / n_kv_heads); scores are scaled by 1/sqrt(head_dim).
  virtual void attend(int layer, const float* q, float* out) = 0;
  /// Positions stored for `layer`.
  virtual int length(int layer) const = 0;
  /// Forgets every position.
  virtual void clear() = 0;
};

/// Keys and values kept in fp32: [layer][position][kv_head][head_dim], for up to `capacity` positions.
std::unique_ptr<KvStore> make_float_kv_store(const KvShape& shape, int capacity);

}  // namespace kvq
