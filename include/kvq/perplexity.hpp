// Perplexity of a model over a token sequence, in consecutive windows that are each evaluated from scratch.
#pragma once

#include <cstddef>
#include <functional>
#include <span>

#include "kvq/model.hpp"

namespace kvq {

struct PerplexityOptions {
  int window = 256;  ///< text tokens per window
  int threads = 0;   ///< 0 = all cores
  /// Called after each window with (windows done, windows in all).
  std::function<void(size_t, size_t)> progress;
};

struct PerplexityResult {
  size_t tokens = 0;     ///< tokens scored
  double mean_nll = 0;   ///< mean negative log-likelihood (nats)
  double ppl = 0;        ///< exp(mean_nll)
};

/// Splits `tokens` (text tokens, no BOS) into windows of options.window tokens (the last may be shorter). Where
/// the tokenizer adds BOS, each window is run after a BOS and all its tokens are scored; otherwise its first token
/// is context only and the rest are scored.
PerplexityResult measure_perplexity(const LlamaModel& model, const Tokenizer& tokenizer, std::span<const int> tokens,
                                    const PerplexityOptions& options);

/// The first `max_tokens` tokens of `text` (or all of them), tokenizing only as much of the text as needed.
std::vector<int> tokenize_prefix(const Tokenizer& tokenizer, std::string_view text, size_t max_tokens);

}  // namespace kvq
