// A plain double-precision Llama forward pass over a whole sequence, for tests: every weight dequantized to a
// full matrix, attention as an explicit causal softmax over all positions, RoPE as a rotation of each pair
// (2i, 2i+1). Slow and simple; only for small models.
#pragma once

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

/// Logits [position][vocab] for every position of `ids`.
inline Matrix reference_logits(const LlamaModel& model, const std::vector<int>& ids) {
  const LlamaConfig& c = model.config();
  const LlamaWeights& w = model.weights();
  const int T = static_cast<int>(ids.size()), hd = c.head_dim(), group = c.n_heads / c.n_kv_heads;
  const Matrix emb = dense(w.token_embedding), cls = dense(w.classifier);
  Matrix x(T);
  for (int t = 0; t < T; ++t) x[t] = emb[ids[t]];
  const auto rope = [&](std::vector<double>& v, int heads, int pos) {
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < c.rope_dim / 2; ++i) {
        const double angle = pos * std::pow(static_cast<double>(c.rope_theta), -2.0 * i / c.rope_dim);
        double& a = v[h * hd + 2 * i];
        double& b = v[h * hd + 2 * i + 1];
        const double ra = a * std::cos(angle) - b * std::sin(angle), rb = a * std::sin(angle) + b * std::cos(angle);
        a = ra, b = rb;
      }
  };
  for (const LlamaLayerWeights& l : w.layers) {
    const Matrix wq = dense(l.wq), wk = dense(l.wk), wv = dense(l.wv), wo = dense(l.wo);
    const Matrix gate = dense(l.w_gate), up = dense(l.w_up), down = dense(l.w_down);
    Matrix q(T), k(T), v(T);
    for (int t = 0; t < T; ++t) {
      const auto h = rms_norm(x[t], l.attn_norm, c.norm_eps);
      q[t] = product(wq, h), k[t] = product(wk, h), v[t] = product(wv, h);
      rope(q[t], c.n_heads, t);
      rope(k[t], c.n_kv_heads, t);
    }
    for (int t = 0; t < T; ++t) {
      std::vector<double> att(static_cast<size_t>(c.q_dim()), 0.0);
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / group;
        std::vector<double> s(t + 1);
        double max_s = -INFINITY, sum = 0;
        for (int u = 0; u <= t; ++u) {
          s[u] = 0;
          for (int i = 0; i < hd; ++i) s[u] += q[t][h * hd + i] * k[u][kvh * hd + i];
          s[u] /= std::sqrt(static_cast<double>(hd));
          max_s = std::max(max_s, s[u]);
        }
        for (double& e : s) sum += e = std::exp(e - max_s);
        for (int u = 0; u <= t; ++u)
          for (int i = 0; i < hd; ++i) att[h * hd + i] += s[u] / sum * v[u][kvh * hd + i];
      }
      const auto o = product(wo, att);
      for (int i = 0; i < c.dim; ++i) x[t][i] += o[i];
      const auto h = rms_norm(x[t], l.ffn_norm, c.norm_eps);
      auto g = product(gate, h);
      const auto u = product(up, h);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const auto d = product(down, g);
      for (int i = 0; i < c.dim; ++i) x[t][i] += d[i];
    }
  }
  Matrix logits(T);
  for (int t = 0; t < T; ++t) logits[t] = product(cls, rms_norm(x[t], w.final_norm, c.norm_eps));
  return logits;
}

}  // namespace kvq::test
