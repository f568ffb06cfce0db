#include "kvq/perplexity.hpp"

#include <algorithm>
#include <cmath>

#include "kvq/error.hpp"

namespace kvq {
namespace {

// -log softmax(logits)[target], in double.
double nll(std::span<const float> logits, int target) {
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(l - max_logit);
  return std::log(sum) + max_logit - logits[target];
}

}  // namespace

PerplexityResult measure_perplexity(const LlamaModel& model, const Tokenizer& tokenizer, std::span<const int> tokens,
                                    const PerplexityOptions& options) {
  const int bos = tokenizer.add_bos() ? 1 : 0;
  KVQ_CHECK(options.window >= 2, "perplexity window ", options.window, " must be at least 2 tokens");
  KVQ_CHECK(options.window + bos <= model.config().max_seq_len, "perplexity window ", options.window,
            bos ? " + BOS" : "", " exceeds the model's context of ", model.config().max_seq_len);
  KVQ_CHECK(!tokens.empty(), "perplexity of an empty text");
  const size_t window = static_cast<size_t>(options.window);
  const size_t n_windows = (tokens.size() + window - 1) / window;
  LlamaRunner runner(model, options.window + bos, options.threads);
  double total = 0;
  size_t scored = 0;
  for (size_t w = 0; w < n_windows; ++w) {
    const std::span<const int> part = tokens.subspan(w * window, std::min(window, tokens.size() - w * window));
    runner.reset();
    int pos = 0;
    int current = bos ? tokenizer.bos() : part[0];
    for (size_t i = bos ? 0 : 1; i < part.size(); ++i) {
      total += nll(runner.forward(current, pos++), part[i]);
      ++scored;
      current = part[i];
    }
    if (options.progress) options.progress(w + 1, n_windows);
  }
  KVQ_CHECK(scored > 0, "no token was scored (windows of one token without BOS)");
  PerplexityResult r;
  r.tokens = scored;
  r.mean_nll = total / static_cast<double>(scored);
  r.ppl = std::exp(r.mean_nll);
  return r;
}

std::vector<int> tokenize_prefix(const Tokenizer& tokenizer, std::string_view text, size_t max_tokens) {
  // Tokenize a prefix cut at a line end, growing it until it yields enough tokens; the tokens of the last line
  // could change with what follows, so one line more than needed is always tokenized.
  for (size_t bytes = std::max<size_t>(4096, 8 * max_tokens);; bytes *= 2) {
    if (bytes >= text.size()) {
      std::vector<int> all = tokenizer.encode(text);
      if (all.size() > max_tokens) all.resize(max_tokens);
      return all;
    }
    const size_t cut = text.find('\n', bytes);
    if (cut == std::string_view::npos) continue;
    std::vector<int> t = tokenizer.encode(text.substr(0, cut));
    if (t.size() > max_tokens + 64) {  // far enough from the cut that the cut cannot have changed them
      t.resize(max_tokens);
      return t;
    }
  }
}

}  // namespace kvq
