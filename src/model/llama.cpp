// The Llama forward pass for one token: RMSNorm, attention with RoPE (adjacent pairs) and grouped-query heads,
// a SwiGLU feed-forward network, residual connections, a final RMSNorm and the classifier. Matrix-vector products
// read the quantized weights in place, split over threads by output rows.
#include <algorithm>
#include <cmath>
#include <thread>

#include "kvq/error.hpp"
#include "kvq/model.hpp"
#include "model/kv_store.hpp"
#include "kvq/thread_pool.hpp"

namespace kvq {
namespace {

// out = x / rms(x) * weight, rms(x) = sqrt(mean(x^2) + eps). out may alias x.
void rmsnorm(float* out, const float* x, const float* weight, int n, float eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv * weight[i];
}

// Rotates the pairs (2i, 2i+1), i < rope_dim / 2, of every head of x [n_heads][head_dim] by the angle whose
// cosine and sine are cos_sin[2i], cos_sin[2i+1].
void rope(float* x, int n_heads, int head_dim, const std::vector<float>& cos_sin) {
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * head_dim;
    for (size_t i = 0; i < cos_sin.size() / 2; ++i) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const float a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = a * c - b * s;
      v[2 * i + 1] = a * s + b * c;
    }
  }
}

int default_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

}  // namespace

LlamaRunner::LlamaRunner(const LlamaModel& model, int context, int threads)
    : model_(model),
      context_(context),
      pool_(std::make_unique<ThreadPool>(threads > 0 ? threads : default_threads())) {
  const LlamaConfig& c = model.config();
  KVQ_CHECK(context > 0 && context <= c.max_seq_len, "context ", context, " must be in [1, ", c.max_seq_len,
            "] (the model's max_seq_len)");
  kv_ = make_float_kv_store({c.n_layers, c.n_kv_heads, c.n_heads, c.head_dim()}, context);
  for (int i = 0; i < c.rope_dim / 2; ++i)
    rope_freq_.push_back(static_cast<float>(std::pow(static_cast<double>(c.rope_theta), -2.0 * i / c.rope_dim)));
  rope_cos_sin_.resize(rope_freq_.size() * 2);
  x_.resize(c.dim);
  xb_.resize(c.dim);
  q_.resize(c.q_dim());
  k_.resize(c.kv_dim());
  v_.resize(c.kv_dim());
  att_.resize(c.q_dim());
  proj_.resize(c.dim);
  gate_.resize(c.hidden_dim);
  up_.resize(c.hidden_dim);
  logits_.resize(c.vocab_size);
}

LlamaRunner::~LlamaRunner() = default;

int LlamaRunner::threads() const { return pool_->size(); }

int LlamaRunner::position() const { return kv_->length(0); }

void LlamaRunner::reset() { kv_->clear(); }

// out_k = W_k x for each (W_k, out_k): one parallel pass over the rows of all the products together, one
// contiguous range of rows per worker.
void LlamaRunner::matvec(std::initializer_list<std::pair<const WeightMatrix*, float*>> products, const float* x) {
  int64_t total = 0;
  for (const auto& [w, out] : products) total += w->rows;
  const int64_t parts = pool_->size();
  pool_->parallel_for(static_cast<size_t>(parts), [&](size_t part) {
    const int64_t begin = total * static_cast<int64_t>(part) / parts;
    const int64_t end = total * static_cast<int64_t>(part + 1) / parts;
    int64_t first = 0;  // global index of the current product's row 0
    for (const auto& [w, out] : products) {
      const int64_t lo = std::max(begin, first) - first, hi = std::min(end, first + w->rows) - first;
      for (int64_t r = lo; r < hi; ++r) out[r] = dot_row(w->type, w->row(r), x, w->cols);
      first += w->rows;
    }
  });
}

void LlamaRunner::attention_block(const LlamaLayerWeights& w, int layer) {
  const LlamaConfig& c = model_.config();
  rmsnorm(xb_.data(), x_.data(), w.attn_norm, c.dim, c.norm_eps);
  matvec({{&w.wq, q_.data()}, {&w.wk, k_.data()}, {&w.wv, v_.data()}}, xb_.data());
  rope(q_.data(), c.n_heads, c.head_dim(), rope_cos_sin_);
  rope(k_.data(), c.n_kv_heads, c.head_dim(), rope_cos_sin_);
  kv_->append(layer, k_.data(), v_.data());
  kv_->attend(layer, q_.data(), att_.data());
  matvec({{&w.wo, proj_.data()}}, att_.data());
  for (int i = 0; i < c.dim; ++i) x_[i] += proj_[i];
}

void LlamaRunner::ffn_block(const LlamaLayerWeights& w) {
  const LlamaConfig& c = model_.config();
  rmsnorm(xb_.data(), x_.data(), w.ffn_norm, c.dim, c.norm_eps);
  matvec({{&w.w_gate, gate_.data()}, {&w.w_up, up_.data()}}, xb_.data());
  for (int i = 0; i < c.hidden_dim; ++i) gate_[i] = gate_[i] / (1.0f + std::exp(-gate_[i])) * up_[i];  // SiLU(g) u
  matvec({{&w.w_down, proj_.data()}}, gate_.data());
  for (int i = 0; i < c.dim; ++i) x_[i] += proj_[i];
}

std::span<const float> LlamaRunner::forward(int token, int pos) {
  const LlamaConfig& c = model_.config();
  const LlamaWeights& w = model_.weights();
  KVQ_CHECK(token >= 0 && token < c.vocab_size, "token ", token, " is outside the vocabulary of ", c.vocab_size);
  KVQ_CHECK(pos == position(), "forward at position ", pos, " but ", position(), " positions have been run");
  KVQ_CHECK(pos < context_, "position ", pos, " is beyond the runner's context of ", context_);
  for (size_t i = 0; i < rope_freq_.size(); ++i) {
    const double angle = static_cast<double>(pos) * rope_freq_[i];
    rope_cos_sin_[2 * i] = static_cast<float>(std::cos(angle));
    rope_cos_sin_[2 * i + 1] = static_cast<float>(std::sin(angle));
  }
  dequantize_row(w.token_embedding.type, w.token_embedding.row(token), x_.data(), c.dim);
  for (int l = 0; l < c.n_layers; ++l) {
    attention_block(w.layers[l], l);
    ffn_block(w.layers[l]);
  }
  rmsnorm(x_.data(), x_.data(), w.final_norm, c.dim, c.norm_eps);
  matvec({{&w.classifier, logits_.data()}}, x_.data());
  return logits_;
}

}  // namespace kvq
