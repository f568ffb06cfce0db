// The boundary between the forward pass and the key/value cache: the model hands over each chunk of positions'
// keys and values (after RoPE) and asks for the attention output of its query heads. Nothing else in the runner
// touches keys or values, so the fp32 reference and the compressed kvq::KVCache are two implementations of this
// class (make_float_kv_store, make_compressed_kv_store).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "kvq/model.hpp"

namespace kvq {

class KVCache;
class ThreadPool;

struct KVShape {
  int n_layers, n_kv_heads, n_heads, head_dim;
  std::vector<int> windows;  ///< [n_layers]: positions each layer's queries see, their own included; 0: all
};

class KVStore {
 public:
  virtual ~KVStore() = default;
  /// Appends the next n positions' keys and values for `layer`. k, v: [n][n_kv_heads][head_dim].
  virtual void append(int layer, const float* k, const float* v, int n) = 0;
  /// Causal attention of the n newest positions of `layer` (the ones appended last): query i, at position
  /// length - n + i, sees every stored position up to its own. q: [n][n_heads][head_dim] -> out: the same shape.
  /// Query head h reads key/value head h / (n_heads / n_kv_heads); scores are scaled by 1/sqrt(head_dim); a layer
  /// with a window (KVShape::windows) shows the query at position p only positions p - window + 1 .. p.
  virtual void attend(int layer, const float* q, int n, float* out) = 0;
  /// Appends n positions and computes their attention as token-by-token decoding would: position i sees the
  /// store as it is right after position i is appended (for a KVCache, blocks completed by later positions of the
  /// chunk are still in the fp32 window). The default appends all n, then attends.
  virtual void append_attend(int layer, const float* k, const float* v, const float* q, int n, float* out) {
    append(layer, k, v, n);
    attend(layer, q, n, out);
  }
  /// Positions stored for `layer`.
  virtual int length(int layer) const = 0;
  /// Forgets every position (trained codec state is kept).
  virtual void clear() = 0;
  /// Bytes the store holds now (for a KVCache: KVCache::memory().used_bytes).
  virtual size_t bytes() const = 0;
  /// The compressed cache behind the store, or nullptr for the fp32 store.
  virtual const KVCache* cache() const { return nullptr; }
  /// Whether some layer's codecs must be trained (calibrate) before the store accepts positions.
  virtual bool needs_calibration() const { return false; }
  /// Trains `layer`'s codecs on n example keys and values [n][head_dim] (every kv head's vectors pooled). Only
  /// while the store is empty.
  virtual void calibrate(int layer, const float* keys, const float* values, size_t n) = 0;
};

/// Keys and values kept in fp32: [layer][position][kv_head][head_dim], for up to `capacity` positions; exact
/// softmax attention in plain loops.
std::unique_ptr<KVStore> make_float_kv_store(const KVShape& shape, int capacity);

/// One sequence in a kvq::KVCache configured by `spec` (codecs, T, R, seed), with pages for `capacity` positions;
/// attention through decode_attention (one position) or prefill_attention (a chunk) on `pool` (may be null).
std::unique_ptr<KVStore> make_compressed_kv_store(const KVShape& shape, int capacity, const KVCacheSpec& spec,
                                                  ThreadPool* pool);

}  // namespace kvq
