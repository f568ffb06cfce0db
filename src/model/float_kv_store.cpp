// The full-precision reference store: fp32 arrays and a plain softmax.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kvq/error.hpp"
#include "model/kv_store.hpp"

namespace kvq {
namespace {

class FloatKVStore final : public KVStore {
 public:
  FloatKVStore(const KVShape& s, int capacity)
      : s_(s),
        capacity_(capacity),
        stride_(static_cast<size_t>(s.n_kv_heads) * s.head_dim),
        keys_(static_cast<size_t>(s.n_layers) * capacity * stride_),
        values_(keys_.size()),
        length_(s.n_layers, 0),
        scores_(capacity) {}

  void append(int layer, const float* k, const float* v, int n) override {
    int& len = length_[layer];
    KVQ_CHECK(n >= 0 && n <= capacity_ - len, "the key/value store is full (", capacity_, " positions)");
    std::copy(k, k + n * stride_, key(layer, len));
    std::copy(v, v + n * stride_, value(layer, len));
    len += n;
  }

  void attend(int layer, const float* q, int n, float* out) override {
    const int d = s_.head_dim, group = s_.n_heads / s_.n_kv_heads, len = length_[layer];
    const size_t row = static_cast<size_t>(s_.n_heads) * d;
    const int window = s_.windows.empty() ? 0 : s_.windows[static_cast<size_t>(layer)];
    for (int i = 0; i < n; ++i) {
      const int visible = len - n + i + 1;
      attend_one(layer, q + i * row, window > 0 ? std::max(0, visible - window) : 0, visible, out + i * row, d,
                 group);
    }
  }

  int length(int layer) const override { return length_[layer]; }
  void clear() override { std::fill(length_.begin(), length_.end(), 0); }
  size_t bytes() const override {
    size_t positions = 0;
    for (int len : length_) positions += static_cast<size_t>(len);
    return positions * 2 * stride_ * sizeof(float);
  }
  void calibrate(int, const float*, const float*, size_t) override {}

 private:
  // Attention of one query (all heads) over positions first .. visible - 1 of `layer`.
  void attend_one(int layer, const float* q, int first, int visible, float* out, int d, int group) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    for (int h = 0; h < s_.n_heads; ++h) {
      const float* qh = q + static_cast<size_t>(h) * d;
      const size_t kv_offset = static_cast<size_t>(h / group) * d;
      float max_score = -INFINITY;
      for (int t = first; t < visible; ++t) {
        const float* kt = key(layer, t) + kv_offset;
        float s = 0;
        for (int i = 0; i < d; ++i) s += qh[i] * kt[i];
        scores_[t] = s * scale;
        max_score = std::max(max_score, scores_[t]);
      }
      float sum = 0;
      for (int t = first; t < visible; ++t) sum += scores_[t] = std::exp(scores_[t] - max_score);
      float* oh = out + static_cast<size_t>(h) * d;
      std::fill(oh, oh + d, 0.0f);
      for (int t = first; t < visible; ++t) {
        const float w = scores_[t] / sum;
        const float* vt = value(layer, t) + kv_offset;
        for (int i = 0; i < d; ++i) oh[i] += w * vt[i];
      }
    }
  }

  float* key(int layer, int pos) { return keys_.data() + (static_cast<size_t>(layer) * capacity_ + pos) * stride_; }
  float* value(int layer, int pos) {
    return values_.data() + (static_cast<size_t>(layer) * capacity_ + pos) * stride_;
  }

  KVShape s_;
  int capacity_;
  size_t stride_;            // floats per position: n_kv_heads * head_dim
  std::vector<float> keys_;  // [n_layers][capacity][n_kv_heads][head_dim]
  std::vector<float> values_;
  std::vector<int> length_;     // [n_layers]
  std::vector<float> scores_;   // [capacity] scratch
};

}  // namespace

std::unique_ptr<KVStore> make_float_kv_store(const KVShape& shape, int capacity) {
  KVQ_CHECK(capacity > 0, "key/value store capacity ", capacity);
  return std::make_unique<FloatKVStore>(shape, capacity);
}

}  // namespace kvq
