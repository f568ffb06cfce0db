// The forward pass of the Llama family for a chunk of positions: RMSNorm, attention with RoPE and grouped-query
// heads, a gated feed-forward network, residual connections, a final RMSNorm and the classifier; the config and
// the optional weights add what Qwen2 and Gemma 3 differ by (model.hpp). The matrix products read the quantized
// weights in place: for the common block formats in integer arithmetic on activations quantized to 8 bits
// (q8_dot.hpp), otherwise on fp32 activations (dot_row for one position, chunk_matmul.hpp's dequantized tiles for
// a chunk); one position splits them over threads by output rows, a chunk by tiles of rows.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/error.hpp"
#include "kvq/model.hpp"
#include "model/chunk_matmul.hpp"
#include "model/kv_store.hpp"
#include "model/q8_dot.hpp"

namespace kvq {
namespace {

// Non-finite activations come from the weights (a damaged or crafted file) or from an overflow. The forward pass
// stops at the first stage that produces one and names it, rather than print NaN logits: one pass over the stage's
// n x width outputs, against the n x width x width of its products.
template <class... Where>
void check_finite(const float* x, size_t n, const Where&... where) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]))
      throw Error(detail::concat(where..., " produced ", x[i],
                                 ": the model's weights hold NaN or Inf, or its activations overflow"));
}

// out = x / rms(x) * weight, rms(x) = sqrt(mean(x^2) + eps). out may alias x.
void rmsnorm(float* out, const float* x, const float* weight, int n, float eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv * weight[i];
}

// Rotates pair i < pairs of every head of x [n_heads][head_dim] by the angle whose cosine and sine are
// cos_sin[2i], cos_sin[2i+1]. The pair is (2i, 2i+1), or (i, i + pairs) for RopeStyle::halves.
void rope(float* x, int n_heads, int head_dim, const float* cos_sin, int pairs, RopeStyle style) {
  const int stride = style == RopeStyle::halves ? 1 : 2, offset = style == RopeStyle::halves ? pairs : 1;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < pairs; ++i) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      float& a = v[stride * i];
      float& b = v[stride * i + offset];
      const float ra = a * c - b * s, rb = a * s + b * c;
      a = ra, b = rb;
    }
  }
}

// The gate of a gated feed-forward network: SiLU(g) = g sigmoid(g), or GELU in its tanh form.
float activate(float g, Activation a) {
  if (a == Activation::silu) return g / (1.0f + std::exp(-g));
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
}

// x[i] += bias for each of the n rows of x [n][width]; no bias: nothing.
void add_bias(float* x, const float* bias, int n, int width) {
  if (!bias) return;
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < width; ++c) x[static_cast<size_t>(i) * width + c] += bias[c];
}

// RMSNorm of each of the `rows` vectors of width `width` in x, in place; no weight: nothing.
void rmsnorm_rows(float* x, const float* weight, int rows, int width, float eps) {
  if (!weight) return;
  for (int r = 0; r < rows; ++r) rmsnorm(x + static_cast<size_t>(r) * width, x + static_cast<size_t>(r) * width,
                                         weight, width, eps);
}

// How far ahead of its reads a decode product's worker asks for weight lines. The hardware prefetchers alone
// streamed SmolLM2's 84 MB at 15-16 GB/s at deep contexts and slower still beside other work; 8 KiB ahead, about
// 25 GB/s at any depth (docs/perf/cpu.md, "Whole-model decode").
constexpr size_t kWeightPrefetchBytes = 8192;

// Asks for the cache lines of [from, to) (a hint: no fault, whatever the addresses).
void prefetch_lines(const std::byte* from, const std::byte* to) {
  for (; from < to; from += 64) __builtin_prefetch(from, 0, 3);
}

using Clock = std::chrono::steady_clock;

// Adds the time since `start` to `seconds` and returns now, the start of the next stage.
Clock::time_point add_since(double& seconds, Clock::time_point start) {
  const Clock::time_point now = Clock::now();
  seconds += std::chrono::duration<double>(now - start).count();
  return now;
}

int default_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

KVShape kv_shape(const LlamaConfig& c) {
  KVShape s{c.n_layers, c.n_kv_heads, c.n_heads, c.head_dim(), {}};
  for (int l = 0; l < c.n_layers; ++l) s.windows.push_back(c.window(l));
  return s;
}

std::unique_ptr<KVStore> make_kv_store(const LlamaConfig& c, int context, const KVCacheSpec& spec,
                                       ThreadPool* pool) {
  if (!spec.compressed()) return make_float_kv_store(kv_shape(c), context);
  return make_compressed_kv_store(kv_shape(c), context, spec, pool);
}

}  // namespace

std::string KVCacheSpec::label() const {
  if (!compressed()) return "fp32 (no cache)";
  if (!layer_codecs.empty()) {  // each pair once, with the number of layers it serves, in order of first use
    std::vector<std::pair<LayerCodecs, int>> pairs;
    for (const LayerCodecs& c : layer_codecs) {
      const auto it = std::find_if(pairs.begin(), pairs.end(), [&](const auto& p) { return p.first.same_codecs(c); });
      if (it == pairs.end()) pairs.emplace_back(c, 1); else ++it->second;
    }
    std::string s = sink_tokens > 0 ? std::to_string(sink_tokens) + " sink tokens, per layer:" : "per layer:";
    for (size_t i = 0; i < pairs.size(); ++i)
      s += (i == 0 ? " " : ", ") + std::string(pairs[i].first.center_keys ? "centered " : "") + pairs[i].first.key +
           "/" + pairs[i].first.value + " x" + std::to_string(pairs[i].second);
    return center_keys ? s + " (centered keys)" : s;
  }
  std::string s = key_codec + "/" + value_codec;
  for (size_t i = 0; i < layers.size(); ++i) s += (i == 0 ? "@layers " : ",") + std::to_string(layers[i]);
  if (center_keys) s += " (centered keys)";
  if (sink_tokens > 0) s += " + " + std::to_string(sink_tokens) + (sink_tokens == 1 ? " sink token" : " sink tokens");
  return s;
}

LlamaRunner::LlamaRunner(const LlamaModel& model, int context, int threads, const KVCacheSpec& cache,
                         ContextLimit limit)
    : model_(model),
      context_(context),
      cache_spec_(cache),
      pool_(std::make_unique<ThreadPool>(threads > 0 ? threads : default_threads())),
      isa_(detail::active_isa()),
      x_q8_(std::make_unique<detail::Q8Rows>()) {
  const LlamaConfig& c = model.config();
  KVQ_CHECK(context > 0 && (limit == ContextLimit::any || context <= c.max_seq_len), "context ", context,
            " must be in [1, ", c.max_seq_len, "] (the model's max_seq_len)");
  KVQ_CHECK(threads >= 0, "threads = ", threads, " (need >= 0; 0 means one per core)");
  kv_ = make_kv_store(c, context, cache, pool_.get());
  scratch_.resize(static_cast<size_t>(pool_->size()));
  const int pairs = c.rope_dim / 2;
  std::vector<float> bases;  // one table per distinct RoPE base
  for (int l = 0; l < c.n_layers; ++l) {
    const float base = c.rope_base(l);
    const auto it = std::find(bases.begin(), bases.end(), base);
    rope_table_.push_back(static_cast<int>(it - bases.begin()));
    if (it != bases.end()) continue;
    bases.push_back(base);
    std::vector<float>& table = rope_cos_sin_.emplace_back(static_cast<size_t>(context) * pairs * 2);
    for (int i = 0; i < pairs; ++i) {
      const float freq = static_cast<float>(std::pow(static_cast<double>(base), -2.0 * i / c.rope_dim));
      for (int pos = 0; pos < context; ++pos) {
        const double angle = static_cast<double>(pos) * freq;
        float* cs = table.data() + (static_cast<size_t>(pos) * pairs + i) * 2;
        cs[0] = static_cast<float>(std::cos(angle));
        cs[1] = static_cast<float>(std::sin(angle));
      }
    }
  }
  reserve_chunk(1);
}

LlamaRunner::~LlamaRunner() = default;

int LlamaRunner::threads() const { return pool_->size(); }

int LlamaRunner::position() const { return kv_->length(0); }

void LlamaRunner::reset() { kv_->clear(); }

const KVCache* LlamaRunner::cache() const { return kv_->cache(); }

size_t LlamaRunner::cache_bytes() const { return kv_->bytes(); }

bool LlamaRunner::needs_calibration() const { return kv_->needs_calibration(); }

void LlamaRunner::reserve_chunk(int n) {
  if (n <= chunk_capacity_) return;
  const LlamaConfig& c = model_.config();
  const auto rows = [n](int width) { return static_cast<size_t>(n) * width; };
  x_.resize(rows(c.dim));
  xb_.resize(rows(c.dim));
  q_.resize(rows(c.q_dim()));
  k_.resize(rows(c.kv_dim()));
  v_.resize(rows(c.kv_dim()));
  att_.resize(rows(c.q_dim()));
  proj_.resize(rows(c.dim));
  gate_.resize(rows(c.hidden_dim));
  up_.resize(rows(c.hidden_dim));
  logits_.resize(rows(c.vocab_size));
  chunk_capacity_ = n;
}

void LlamaRunner::project(std::initializer_list<Product> products, const float* x, int n) {
  const Clock::time_point start = Clock::now();
  multiply(products, x, n);
  add_since(stage_times_.weights, start);
}

void LlamaRunner::multiply(std::initializer_list<Product> products, const float* x, int n) {
  bool quantized = product_input_ == ProductInput::q8 && detail::q8_vectorized(isa_);
  for (const auto& [w, out] : products) quantized = quantized && detail::q8_kernels(w->type, isa_);
  if (quantized) {
    multiply_q8(products, x, n);
    return;
  }
  if (n == 1) {  // one contiguous range of rows of all the products together per worker
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
    return;
  }
  // Chunks: tasks of a few weight tiles, handed to whichever worker is free.
  constexpr int64_t kTilesPerTask = 4;
  int64_t total = 0;
  for (const auto& [w, out] : products) total += (detail::tile_count(*w) + kTilesPerTask - 1) / kTilesPerTask;
  pool_->parallel_for(static_cast<size_t>(total), [&](size_t task, int worker) {
    int64_t first = 0;  // global index of the current product's first task
    for (const auto& [w, out] : products) {
      const int64_t tiles = detail::tile_count(*w), tasks = (tiles + kTilesPerTask - 1) / kTilesPerTask;
      const int64_t t = static_cast<int64_t>(task) - first;
      if (t >= 0 && t < tasks) {
        detail::multiply_tiles(*w, t * kTilesPerTask, std::min(tiles, (t + 1) * kTilesPerTask), x, n, out,
                               static_cast<size_t>(w->rows), scratch_[static_cast<size_t>(worker)], isa_);
        return;
      }
      first += tasks;
    }
  });
}

void LlamaRunner::multiply_q8(std::initializer_list<Product> products, const float* x, int n) {
  const int64_t cols = products.begin()->first->cols;
  const size_t blocks = static_cast<size_t>(cols / detail::kQ8Block);
  x_q8_->quantize(x, n, cols, *pool_);
  if (n == 1) {  // one contiguous range of rows of all the products together per worker
    int64_t total = 0;
    for (const auto& [w, out] : products) total += w->rows;
    const int64_t parts = pool_->size();
    const detail::Q8Row xq = x_q8_->row(0);
    pool_->parallel_for(static_cast<size_t>(parts), [&](size_t part) {
      const int64_t begin = total * static_cast<int64_t>(part) / parts;
      const int64_t end = total * static_cast<int64_t>(part + 1) / parts;
      int64_t first = 0;  // global index of the current product's row 0
      for (const auto& [w, out] : products) {
        const int64_t lo = std::max(begin, first) - first, hi = std::min(end, first + w->rows) - first;
        const detail::Q8Kernels dot = detail::q8_kernels(w->type, isa_);
        int64_t r = lo;
        if (dot.weight_rows)
          for (; r + detail::kQ8WeightRows <= hi; r += detail::kQ8WeightRows) {
            const std::byte* ahead = w->row(r + detail::kQ8WeightRows) + kWeightPrefetchBytes;
            prefetch_lines(ahead - w->row_bytes * detail::kQ8WeightRows, std::min(ahead, w->row(hi)));
            dot.weight_rows(reinterpret_cast<const uint8_t*>(w->row(r)), w->row_bytes, xq, blocks, out + r);
          }
        for (; r < hi; ++r) dot.one(reinterpret_cast<const uint8_t*>(w->row(r)), &xq, blocks, out + r);
        first += w->rows;
      }
    });
    return;
  }
  // Chunks: tasks of kTileRows weight rows, each row read from L1 for every position of the chunk and unpacked
  // once per kQ8Rows positions.
  constexpr int64_t kTileRows = 16;
  int64_t total = 0;
  for (const auto& [w, out] : products) total += (w->rows + kTileRows - 1) / kTileRows;
  pool_->parallel_for(static_cast<size_t>(total), [&](size_t task) {
    int64_t first = 0;  // global index of the current product's first task
    for (const auto& [w, out] : products) {
      const int64_t tasks = (w->rows + kTileRows - 1) / kTileRows, t = static_cast<int64_t>(task) - first;
      if (t >= 0 && t < tasks) {
        const detail::Q8Kernels dot = detail::q8_kernels(w->type, isa_);
        const int64_t r0 = t * kTileRows, r1 = std::min(w->rows, r0 + kTileRows);
        const size_t ldy = static_cast<size_t>(w->rows);
        for (int i = 0; i < n; i += detail::kQ8Rows) {
          const int m = std::min(detail::kQ8Rows, n - i);
          detail::Q8Row xq[detail::kQ8Rows];
          for (int k = 0; k < m; ++k) xq[k] = x_q8_->row(i + k);
          for (int64_t r = r0; r < r1; ++r) {
            const auto* row = reinterpret_cast<const uint8_t*>(w->row(r));
            float y[detail::kQ8Rows];
            if (m == detail::kQ8Rows) {
              dot.rows(row, xq, blocks, y);
            } else {
              for (int k = 0; k < m; ++k) dot.one(row, xq + k, blocks, y + k);
            }
            for (int k = 0; k < m; ++k) out[static_cast<size_t>(i + k) * ldy + static_cast<size_t>(r)] = y[k];
          }
        }
        return;
      }
      first += tasks;
    }
  });
}

void LlamaRunner::attention_block(const LlamaLayerWeights& w, int layer, int pos, int n) {
  const LlamaConfig& c = model_.config();
  for (int i = 0; i < n; ++i)
    rmsnorm(&xb_[static_cast<size_t>(i) * c.dim], &x_[static_cast<size_t>(i) * c.dim], w.attn_norm, c.dim,
            c.norm_eps);
  project({{&w.wq, q_.data()}, {&w.wk, k_.data()}, {&w.wv, v_.data()}}, xb_.data(), n);
  add_bias(q_.data(), w.bq, n, c.q_dim());
  add_bias(k_.data(), w.bk, n, c.kv_dim());
  add_bias(v_.data(), w.bv, n, c.kv_dim());
  rmsnorm_rows(q_.data(), w.q_norm, n * c.n_heads, c.head_dim(), c.norm_eps);
  rmsnorm_rows(k_.data(), w.k_norm, n * c.n_kv_heads, c.head_dim(), c.norm_eps);
  const int pairs = c.rope_dim / 2;
  const std::vector<float>& table = rope_cos_sin_[static_cast<size_t>(rope_table_[layer])];
  for (int i = 0; i < n; ++i) {
    const float* cs = table.data() + static_cast<size_t>(pos + i) * pairs * 2;
    rope(&q_[static_cast<size_t>(i) * c.q_dim()], c.n_heads, c.head_dim(), cs, pairs, c.rope_style);
    rope(&k_[static_cast<size_t>(i) * c.kv_dim()], c.n_kv_heads, c.head_dim(), cs, pairs, c.rope_style);
  }
  check_finite(q_.data(), static_cast<size_t>(n) * c.q_dim(), "layer ", layer, "'s query projection");
  check_finite(k_.data(), static_cast<size_t>(n) * c.kv_dim(), "layer ", layer, "'s key projection");
  check_finite(v_.data(), static_cast<size_t>(n) * c.kv_dim(), "layer ", layer, "'s value projection");
  if (capture_) {
    const auto floats = static_cast<std::ptrdiff_t>(n) * c.kv_dim();
    capture_->keys[layer].insert(capture_->keys[layer].end(), k_.begin(), k_.begin() + floats);
    capture_->values[layer].insert(capture_->values[layer].end(), v_.begin(), v_.begin() + floats);
  }
  Clock::time_point start = Clock::now();
  if (n == 1) {  // decode: the append and the attention timed apart
    kv_->append(layer, k_.data(), v_.data(), 1);
    start = add_since(stage_times_.append, start);
    kv_->attend(layer, q_.data(), 1, att_.data());
  } else {
    kv_->append_attend(layer, k_.data(), v_.data(), q_.data(), n, att_.data());
  }
  add_since(stage_times_.attention, start);
  project({{&w.wo, proj_.data()}}, att_.data(), n);
  rmsnorm_rows(proj_.data(), w.post_attn_norm, n, c.dim, c.norm_eps);
  for (size_t i = 0; i < static_cast<size_t>(n) * c.dim; ++i) x_[i] += proj_[i];
  check_finite(x_.data(), static_cast<size_t>(n) * c.dim, "layer ", layer, "'s attention output");
}

void LlamaRunner::ffn_block(const LlamaLayerWeights& w, int layer, int n) {
  const LlamaConfig& c = model_.config();
  for (int i = 0; i < n; ++i)
    rmsnorm(&xb_[static_cast<size_t>(i) * c.dim], &x_[static_cast<size_t>(i) * c.dim], w.ffn_norm, c.dim,
            c.norm_eps);
  project({{&w.w_gate, gate_.data()}, {&w.w_up, up_.data()}}, xb_.data(), n);
  for (size_t i = 0; i < static_cast<size_t>(n) * c.hidden_dim; ++i)
    gate_[i] = activate(gate_[i], c.activation) * up_[i];
  project({{&w.w_down, proj_.data()}}, gate_.data(), n);
  rmsnorm_rows(proj_.data(), w.post_ffn_norm, n, c.dim, c.norm_eps);
  for (size_t i = 0; i < static_cast<size_t>(n) * c.dim; ++i) x_[i] += proj_[i];
  check_finite(x_.data(), static_cast<size_t>(n) * c.dim, "layer ", layer, "'s feed-forward network");
}

std::span<const float> LlamaRunner::forward(int token, int pos) { return forward_chunk({&token, 1}, pos); }

std::span<const float> LlamaRunner::forward_chunk(std::span<const int> tokens, int pos, bool all_logits) {
  return forward_chunk_residuals(tokens, pos, {}, all_logits);
}

std::span<const float> LlamaRunner::forward_chunk_residuals(std::span<const int> tokens, int pos,
                                                            std::span<float> residuals, bool all_logits) {
  const LlamaConfig& c = model_.config();
  const LlamaWeights& w = model_.weights();
  const int n = static_cast<int>(tokens.size());
  KVQ_CHECK(n > 0, "forward of an empty chunk");
  for (int token : tokens)
    KVQ_CHECK(token >= 0 && token < c.vocab_size, "token ", token, " is outside the vocabulary of ", c.vocab_size);
  check_chunk(0, pos, n);
  KVQ_CHECK(residuals.empty() || residuals.size() == residual_floats(n), "a residual buffer of ", residuals.size(),
            " floats for ", n, " positions (need ", residual_floats(n), ")");
  const Clock::time_point start = Clock::now();
  reserve_chunk(n);
  for (int i = 0; i < n; ++i)
    dequantize_row(w.token_embedding.type, w.token_embedding.row(tokens[i]), &x_[static_cast<size_t>(i) * c.dim],
                   c.dim);
  if (c.embedding_scale != 1.0f)
    for (size_t i = 0; i < static_cast<size_t>(n) * c.dim; ++i) x_[i] *= c.embedding_scale;
  for (int i = 0; i < n; ++i)
    check_finite(&x_[static_cast<size_t>(i) * c.dim], static_cast<size_t>(c.dim), "the token embedding of token ",
                 tokens[i]);
  const std::span<const float> logits = run_layers(0, pos, n, residuals, all_logits);
  add_since(stage_times_.total, start);
  return logits;
}

std::span<const float> LlamaRunner::forward_chunk_from(int layer, std::span<const float> x, int pos,
                                                       bool all_logits) {
  const int n = load_residual(layer, x, pos);
  const Clock::time_point start = Clock::now();
  const std::span<const float> logits = run_layers(layer, pos, n, {}, all_logits);
  add_since(stage_times_.total, start);
  return logits;
}

std::span<const float> LlamaRunner::forward_layer(int layer, std::span<const float> x, int pos) {
  const LlamaConfig& c = model_.config();
  KVQ_CHECK(layer < c.n_layers, "forward through layer ", layer, " of a model of ", c.n_layers);
  const int n = load_residual(layer, x, pos);
  const Clock::time_point start = Clock::now();
  attention_block(model_.weights().layers[layer], layer, pos, n);
  ffn_block(model_.weights().layers[layer], layer, n);
  add_since(stage_times_.total, start);
  return {x_.data(), x.size()};
}

int LlamaRunner::load_residual(int layer, std::span<const float> x, int pos) {
  const LlamaConfig& c = model_.config();
  KVQ_CHECK(layer >= 0 && layer <= c.n_layers, "forward from layer ", layer, " of a model of ", c.n_layers);
  KVQ_CHECK(!x.empty() && x.size() % static_cast<size_t>(c.dim) == 0, "a residual stream of ", x.size(),
            " floats is not whole positions of ", c.dim);
  const int n = static_cast<int>(x.size() / static_cast<size_t>(c.dim));
  check_chunk(layer, pos, n);
  reserve_chunk(n);
  std::copy(x.begin(), x.end(), x_.begin());
  return n;
}

void LlamaRunner::check_chunk(int layer, int pos, int n) const {
  // The first layer run counts the positions; from past the last layer nothing is stored, so any position goes.
  if (layer < model_.config().n_layers)
    KVQ_CHECK(pos == kv_->length(layer), "forward at position ", pos, " but ", kv_->length(layer),
              " positions have been run");
  KVQ_CHECK(pos >= 0 && n <= context_ - pos, "positions ", pos, "..", pos + n - 1,
            " go beyond the runner's context of ", context_);
}

size_t LlamaRunner::residual_floats(int n) const {
  const LlamaConfig& c = model_.config();
  return static_cast<size_t>(c.n_layers + 1) * static_cast<size_t>(n) * static_cast<size_t>(c.dim);
}

std::span<const float> LlamaRunner::run_layers(int first_layer, int pos, int n, std::span<float> residuals,
                                               bool all_logits) {
  const LlamaConfig& c = model_.config();
  const LlamaWeights& w = model_.weights();
  const size_t floats = static_cast<size_t>(n) * c.dim;
  for (int l = first_layer; l < c.n_layers; ++l) {
    if (!residuals.empty()) std::copy_n(x_.begin(), floats, residuals.begin() + static_cast<ptrdiff_t>(l * floats));
    attention_block(w.layers[l], l, pos, n);
    ffn_block(w.layers[l], l, n);
  }
  if (!residuals.empty())
    std::copy_n(x_.begin(), floats, residuals.begin() + static_cast<ptrdiff_t>(c.n_layers * floats));
  const int first = all_logits ? 0 : n - 1, rows = n - first;
  float* x = &x_[static_cast<size_t>(first) * c.dim];
  for (int i = 0; i < rows; ++i)
    rmsnorm(x + static_cast<size_t>(i) * c.dim, x + static_cast<size_t>(i) * c.dim, w.final_norm, c.dim, c.norm_eps);
  project({{&w.classifier, logits_.data()}}, x, rows);
  check_finite(logits_.data(), static_cast<size_t>(rows) * c.vocab_size, "the classifier");
  return {logits_.data(), static_cast<size_t>(rows) * c.vocab_size};
}

KVSample LlamaRunner::capture_kv(std::span<const int> tokens, int chunk) {
  const LlamaConfig& c = model_.config();
  KVQ_CHECK(position() == 0, "capture keys and values before running any position (", position(), " run)");
  KVQ_CHECK(!tokens.empty(), "calibration needs at least one token");
  KVQ_CHECK(chunk > 0, "calibration chunk ", chunk);
  KVSample sample;
  sample.keys.resize(static_cast<size_t>(c.n_layers));
  sample.values.resize(static_cast<size_t>(c.n_layers));
  sample.tokens = tokens.size();
  // The runner's own cache waits aside while an f16 cache runs the tokens.
  std::unique_ptr<KVStore> own = std::move(kv_);
  kv_ = make_compressed_kv_store(kv_shape(c), context_, {"f16", "f16"}, pool_.get());
  capture_ = &sample;
  try {
    for (size_t w = 0; w < tokens.size(); w += static_cast<size_t>(context_)) {
      kv_->clear();
      const size_t end = std::min(tokens.size(), w + static_cast<size_t>(context_));
      for (size_t i = w; i < end; i += static_cast<size_t>(chunk)) {
        const size_t n = std::min(end - i, static_cast<size_t>(chunk));
        forward_chunk(tokens.subspan(i, n), static_cast<int>(i - w), false);
      }
    }
  } catch (...) {
    capture_ = nullptr;
    kv_ = std::move(own);
    throw;
  }
  capture_ = nullptr;
  kv_ = std::move(own);
  return sample;
}

void LlamaRunner::train_cache(const KVSample& sample) {
  const LlamaConfig& c = model_.config();
  KVQ_CHECK(position() == 0, "train the key/value cache before running any position (", position(), " run)");
  KVQ_CHECK(sample.keys.size() == static_cast<size_t>(c.n_layers) && sample.values.size() == sample.keys.size(),
            "a key/value sample of ", sample.keys.size(), " layers for a model of ", c.n_layers);
  const size_t vectors = sample.tokens * static_cast<size_t>(c.n_kv_heads);
  for (int l = 0; l < c.n_layers; ++l) {
    KVQ_CHECK(sample.keys[l].size() == vectors * c.head_dim() && sample.values[l].size() == vectors * c.head_dim(),
              "the key/value sample of layer ", l, " does not hold ", sample.tokens, " tokens");
    kv_->calibrate(l, sample.keys[l].data(), sample.values[l].data(), vectors);
  }
}

void LlamaRunner::calibrate(std::span<const int> tokens, int chunk) { train_cache(capture_kv(tokens, chunk)); }

}  // namespace kvq
