#include "kvq/detail/perplexity.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

// A runner with its running sums.
struct Measured {
  CacheQuality q;
  std::unique_ptr<LlamaRunner> runner;
  std::span<const float> logits;  // of the current chunk
  double nll = 0, kld = 0;
  size_t agree = 0;
};

void run_chunk(Measured& m, std::span<const int> inputs, int pos) {
  const auto start = std::chrono::steady_clock::now();
  m.logits = m.runner->forward_chunk(inputs, pos);
  m.q.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Per-layer codecs: the mean over the layers of each codec's storage (every layer has the same head shape).
double mean_bits_per_element(const std::vector<LayerCodecs>& layers, Role role, int head_dim, int block_tokens) {
  double sum = 0;
  for (const LayerCodecs& c : layers)
    sum += make_codec(role == Role::key ? c.key : c.value, {head_dim, block_tokens, 0, role})->bits_per_element();
  return sum / static_cast<double>(layers.size());
}

void describe_codecs(Measured& m, int head_dim, int window) {
  const KVCacheSpec& spec = m.q.cache;
  if (!spec.layer_codecs.empty()) {
    m.q.bits_per_element_k = mean_bits_per_element(spec.layer_codecs, Role::key, head_dim, spec.block_tokens);
    m.q.bits_per_element_v = mean_bits_per_element(spec.layer_codecs, Role::value, head_dim, spec.block_tokens);
  } else if (const KVCache* cache = m.runner->cache()) {
    m.q.bits_per_element_k = cache->key_codec(0).bits_per_element();
    m.q.bits_per_element_v = cache->value_codec(0).bits_per_element();
  }
  if (spec.compressed() && spec.sink_tokens > 0) {
    m.q.bits_per_element_k = sink_bits(m.q.bits_per_element_k, spec.sink_tokens, window);
    m.q.bits_per_element_v = sink_bits(m.q.bits_per_element_v, spec.sink_tokens, window);
  }
}

}  // namespace

double sink_bits(double bits, int sinks, int tokens) {
  KVQ_CHECK(sinks >= 0 && tokens > 0, sinks, " sink tokens in sequences of ", tokens);
  const double share = static_cast<double>(std::min(sinks, tokens)) / tokens;
  return bits + share * (16.0 - bits);
}

PerplexityResult measure_perplexity(const LlamaModel& model, const Tokenizer& tokenizer, std::span<const int> tokens,
                                    const PerplexityOptions& options) {
  const int bos = tokenizer.add_bos() ? 1 : 0;
  KVQ_CHECK(options.window >= 2, "perplexity window ", options.window, " must be at least 2 tokens");
  KVQ_CHECK(options.window + bos <= model.config().max_seq_len, "perplexity window ", options.window,
            bos ? " + BOS" : "", " exceeds the model's context of ", model.config().max_seq_len);
  KVQ_CHECK(options.score_from >= 0 && options.score_from < options.window, "scoring from position ",
            options.score_from, " leaves nothing to score in windows of ", options.window, " tokens");
  KVQ_CHECK(options.chunk >= 1, "forward chunk ", options.chunk, " must be at least 1 token");
  KVQ_CHECK(!tokens.empty(), "perplexity of an empty text");
  KVQ_CHECK(!options.caches.empty(), "perplexity needs at least one cache to measure");
  const int vocab = model.config().vocab_size;

  // The reference (if any) first, then the caches under test.
  std::vector<Measured> runs;
  if (options.reference) runs.push_back({{*options.reference}, nullptr, {}});
  for (const KVCacheSpec& spec : options.caches) runs.push_back({{spec}, nullptr, {}});
  for (Measured& m : runs) {
    m.runner = std::make_unique<LlamaRunner>(model, options.window + bos, options.threads, m.q.cache);
    m.runner->set_product_input(options.product_input);
  }
  // One f16 pass captures the calibration keys and values; every compressed cache trains on them.
  if (!options.calibration.empty()) {
    const auto start = std::chrono::steady_clock::now();
    const KVSample sample = runs.front().runner->capture_kv(options.calibration, options.chunk);
    for (Measured& m : runs)
      if (m.runner->cache()) m.runner->train_cache(sample);
    runs.front().q.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  for (Measured& m : runs) {
    KVQ_CHECK(!m.runner->needs_calibration(), "the key/value codecs ", m.q.cache.label(),
              " need training: give calibration tokens (kvq ppl --calib-tokens N)");
    describe_codecs(m, model.config().head_dim(), options.window);
  }
  Measured* reference = options.reference ? &runs.front() : nullptr;

  const size_t from = static_cast<size_t>(options.score_from);
  size_t scored = 0;
  ReferenceDistribution ref_row;
  const std::vector<PerplexityWindow> windows = perplexity_windows(tokenizer, tokens, options.window);
  for (size_t w = 0; w < windows.size(); ++w) {
    const std::vector<int>& inputs = windows[w].inputs;
    const std::vector<int>& targets = windows[w].targets;
    for (Measured& m : runs) m.runner->reset();
    for (size_t first = 0; first < inputs.size(); first += static_cast<size_t>(options.chunk)) {
      const size_t n = std::min(inputs.size() - first, static_cast<size_t>(options.chunk));
      const std::span<const int> chunk(inputs.data() + first, n);
      for (Measured& m : runs) run_chunk(m, chunk, static_cast<int>(first));
      for (size_t j = first < from ? from - first : 0; j < n; ++j) {
        const auto at = [&](const Measured& m) { return m.logits.subspan(j * vocab, static_cast<size_t>(vocab)); };
        const int target = targets[first + j];
        int top_ref = 0;
        if (reference) ref_row.assign(at(*reference)), top_ref = argmax(at(*reference));
        for (Measured& m : runs) {
          const std::span<const float> logits = at(m);
          const double lse = &m == reference ? ref_row.log_sum_exp() : log_sum_exp(logits);
          m.nll += lse - logits[target];
          if (reference && &m != reference) {
            m.kld += ref_row.kl_divergence(logits, lse);
            m.agree += argmax(logits) == top_ref ? 1 : 0;
          } else {
            ++m.agree;
          }
        }
        ++scored;
      }
    }
    if (w == 0)
      for (Measured& m : runs) m.q.cache_bytes = m.runner->cache_bytes();
    if (options.progress) options.progress(w + 1, windows.size());
  }
  KVQ_CHECK(scored > 0, "no token was scored (windows of one token without BOS, or scoring from past every window's last position)");

  PerplexityResult r;
  r.tokens = scored;
  for (Measured& m : runs) {
    const double count = static_cast<double>(scored);
    m.q.mean_nll = m.nll / count;
    m.q.ppl = std::exp(m.q.mean_nll);
    m.q.kld = m.kld / count;
    m.q.top1_agree = static_cast<double>(m.agree) / count;
    if (&m == reference) {
      r.reference = m.q;
    } else {
      r.caches.push_back(m.q);
    }
  }
  r.mean_nll = r.caches.front().mean_nll;
  r.ppl = r.caches.front().ppl;
  return r;
}

double log_sum_exp(std::span<const float> logits) {
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(l - max_logit);
  return std::log(sum) + max_logit;
}

void ReferenceDistribution::assign(std::span<const float> logits) {
  lse_ = kvq::log_sum_exp(logits);
  log_p_.resize(logits.size());
  p_.resize(logits.size());
  for (size_t v = 0; v < logits.size(); ++v) {
    log_p_[v] = logits[v] - lse_;
    p_[v] = std::exp(log_p_[v]);
  }
}

double ReferenceDistribution::kl_divergence(std::span<const float> q, double lse_q) const {
  double kl = 0;
  for (size_t v = 0; v < p_.size(); ++v) kl += p_[v] * (log_p_[v] - (q[v] - lse_q));
  return std::max(kl, 0.0);  // rounding can leave a tiny negative sum for identical distributions
}

std::vector<PerplexityWindow> perplexity_windows(const Tokenizer& tokenizer, std::span<const int> tokens,
                                                 int window) {
  KVQ_CHECK(window >= 1, "perplexity window ", window);
  const size_t size = static_cast<size_t>(window);
  std::vector<PerplexityWindow> windows;
  for (size_t first = 0; first < tokens.size(); first += size) {
    const std::span<const int> part = tokens.subspan(first, std::min(size, tokens.size() - first));
    PerplexityWindow& w = windows.emplace_back();
    w.inputs.assign(part.begin(), part.end() - 1);
    w.targets.assign(part.begin() + 1, part.end());
    if (tokenizer.add_bos()) {
      w.inputs.insert(w.inputs.begin(), tokenizer.bos());
      w.targets.insert(w.targets.begin(), part[0]);
    }
  }
  return windows;
}

std::vector<int> tokenize_prefix(const Tokenizer& tokenizer, std::string_view text, size_t max_tokens,
                                 size_t* bytes_used) {
  // Tokenize a prefix cut at a line end, growing it until it yields enough tokens; the tokens of the last line
  // could change with what follows, so one line more than needed is always tokenized.
  for (size_t bytes = std::max<size_t>(4096, 8 * max_tokens);; bytes *= 2) {
    if (bytes >= text.size()) {
      std::vector<int> all = tokenizer.encode(text);
      if (all.size() > max_tokens) all.resize(max_tokens);
      if (bytes_used) *bytes_used = text.size();
      return all;
    }
    const size_t cut = text.find('\n', bytes);
    if (cut == std::string_view::npos) continue;
    std::vector<int> t = tokenizer.encode(text.substr(0, cut));
    if (t.size() > max_tokens + 64) {  // far enough from the cut that the cut cannot have changed them
      t.resize(max_tokens);
      if (bytes_used) *bytes_used = cut;
      return t;
    }
  }
}

std::vector<int> tokenize_tail(const Tokenizer& tokenizer, std::string_view text, size_t n_tokens,
                               size_t not_before) {
  // Tokenize a tail that starts after a line end, growing it until it yields enough tokens.
  for (size_t bytes = std::max<size_t>(4096, 8 * n_tokens);; bytes *= 2) {
    const bool whole = bytes >= text.size() - std::min(not_before, text.size());
    size_t start = whole ? not_before : text.size() - bytes;
    if (start > 0 && start < text.size() && text[start - 1] != '\n') {
      const size_t line = text.find('\n', start);
      start = line == std::string_view::npos ? text.size() : line + 1;
    }
    std::vector<int> t = tokenizer.encode(text.substr(std::min(start, text.size())));
    if (t.size() >= n_tokens) {
      t.erase(t.begin(), t.end() - static_cast<std::ptrdiff_t>(n_tokens));
      return t;
    }
    KVQ_CHECK(!whole, "the text after byte ", not_before, " holds ", t.size(), " tokens, fewer than the ", n_tokens,
              " calibration tokens asked for (use a longer text or fewer --max-tokens / --calib-tokens)");
  }
}

}  // namespace kvq
