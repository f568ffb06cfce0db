// A plain double-precision forward pass of the Llama family over a whole sequence, for tests: every weight
// dequantized to a full matrix, attention as an explicit causal softmax over each position's window, RoPE as a
// rotation of each pair ((2i, 2i+1) or (i, i + rope_dim/2)), and what Qwen2 and Gemma 3 add (biases, q/k norms,
// post norms, GELU, embedding scale) written out where it applies. Slow and simple; only for small models.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvq/model.hpp"

namespace kvq::test {

using Matrix = std::vector<std::vector<double>>;

inline Matrix dense(const WeightMatrix& w) {
  Matrix m(static_cast<size_t>(w.rows));
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(w.type, w.row(r), row.data(), w.cols);
    m[r].assign(row.begin(), row.end());
  }
  return m;
}

inline std::vector<double> product(const Matrix& m, const std::vector<double>& x) {
  std::vector<double> y(m.size(), 0.0);
  for (size_t r = 0; r < m.size(); ++r)
    for (size_t c = 0; c < x.size(); ++c) y[r] += m[r][c] * x[c];
  return y;
}

inline std::vector<double> rms_norm(const std::vector<double>& x, const float* w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

// RMSNorm of each head (width hd) of v, where there is a weight.
inline void head_norms(std::vector<double>& v, const float* w, int hd, double eps) {
  if (!w) return;
  for (size_t begin = 0; begin < v.size(); begin += static_cast<size_t>(hd)) {
    double ss = 0;
    for (int i = 0; i < hd; ++i) ss += v[begin + i] * v[begin + i];
    const double inv = 1.0 / std::sqrt(ss / hd + eps);
    for (int i = 0; i < hd; ++i) v[begin + i] *= inv * w[i];
  }
}

/// Logits [position][vocab] for every position of `ids`.
inline Matrix reference_logits(const LlamaModel& model, const std::vector<int>& ids) {
  const LlamaConfig& c = model.config();
  const LlamaWeights& w = model.weights();
  const int T = static_cast<int>(ids.size()), hd = c.head_dim(), group = c.n_heads / c.n_kv_heads;
  const Matrix emb = dense(w.token_embedding), cls = dense(w.classifier);
  Matrix x(T);
  for (int t = 0; t < T; ++t) {
    x[t] = emb[ids[t]];
    for (double& e : x[t]) e *= c.embedding_scale;
  }
  const auto rope = [&](std::vector<double>& v, int heads, int pos, double base) {
    const int half = c.rope_dim / 2;
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const double angle = pos * std::pow(base, -2.0 * i / c.rope_dim);
        const bool halves = c.rope_style == RopeStyle::halves;
        double& a = v[h * hd + (halves ? i : 2 * i)];
        double& b = v[h * hd + (halves ? i + half : 2 * i + 1)];
        const double ra = a * std::cos(angle) - b * std::sin(angle), rb = a * std::sin(angle) + b * std::cos(angle);
        a = ra, b = rb;
      }
  };
  const auto add = [](std::vector<double>& v, const float* bias) {
    if (bias)
      for (size_t i = 0; i < v.size(); ++i) v[i] += bias[i];
  };
  for (int layer = 0; layer < c.n_layers; ++layer) {
    const LlamaLayerWeights& l = w.layers[layer];
    const Matrix wq = dense(l.wq), wk = dense(l.wk), wv = dense(l.wv), wo = dense(l.wo);
    const Matrix gate = dense(l.w_gate), up = dense(l.w_up), down = dense(l.w_down);
    const int window = c.window(layer);
    Matrix q(T), k(T), v(T);
    for (int t = 0; t < T; ++t) {
      const auto h = rms_norm(x[t], l.attn_norm, c.norm_eps);
      q[t] = product(wq, h), k[t] = product(wk, h), v[t] = product(wv, h);
      add(q[t], l.bq), add(k[t], l.bk), add(v[t], l.bv);
      head_norms(q[t], l.q_norm, hd, c.norm_eps);
      head_norms(k[t], l.k_norm, hd, c.norm_eps);
      rope(q[t], c.n_heads, t, c.rope_base(layer));
      rope(k[t], c.n_kv_heads, t, c.rope_base(layer));
    }
    for (int t = 0; t < T; ++t) {
      const int first = window > 0 ? std::max(0, t - window + 1) : 0;
      std::vector<double> att(static_cast<size_t>(c.q_dim()), 0.0);
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / group;
        std::vector<double> s(t + 1, 0.0);
        double max_s = -INFINITY, sum = 0;
        for (int u = first; u <= t; ++u) {
          for (int i = 0; i < hd; ++i) s[u] += q[t][h * hd + i] * k[u][kvh * hd + i];
          s[u] /= std::sqrt(static_cast<double>(hd));
          max_s = std::max(max_s, s[u]);
        }
        for (int u = first; u <= t; ++u) sum += s[u] = std::exp(s[u] - max_s);
        for (int u = first; u <= t; ++u)
          for (int i = 0; i < hd; ++i) att[h * hd + i] += s[u] / sum * v[u][kvh * hd + i];
      }
      auto o = product(wo, att);
      if (l.post_attn_norm) o = rms_norm(o, l.post_attn_norm, c.norm_eps);
      for (int i = 0; i < c.dim; ++i) x[t][i] += o[i];
      const auto h = rms_norm(x[t], l.ffn_norm, c.norm_eps);
      auto g = product(gate, h);
      const auto u = product(up, h);
      for (size_t i = 0; i < g.size(); ++i) {
        const double x3 = g[i] * g[i] * g[i];
        const double a = c.activation == Activation::silu
                             ? g[i] / (1.0 + std::exp(-g[i]))
                             : 0.5 * g[i] * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g[i] + 0.044715 * x3)));
        g[i] = a * u[i];
      }
      auto d = product(down, g);
      if (l.post_ffn_norm) d = rms_norm(d, l.post_ffn_norm, c.norm_eps);
      for (int i = 0; i < c.dim; ++i) x[t][i] += d[i];
    }
  }
  Matrix logits(T);
  for (int t = 0; t < T; ++t) logits[t] = product(cls, rms_norm(x[t], w.final_norm, c.norm_eps));
  return logits;
}

}  // namespace kvq::test
