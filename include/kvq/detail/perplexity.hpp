// Perplexity of a model over a token sequence, in consecutive windows that are each evaluated from scratch, and
// the quality of compressed key/value caches against a reference cache on the same windows.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kvq/model.hpp"

namespace kvq {

struct PerplexityOptions {
  int window = 256;  ///< text tokens per window
  int chunk = 64;    ///< positions per forward call (1: token by token)
  /// Positions of each window before this one are context only, not scored (llama.cpp's perplexity scores the
  /// second half of each window: score_from = window / 2); below window.
  int score_from = 0;
  int threads = 0;   ///< 0 = all cores
  /// Caches measured in lockstep: one runner each, the same windows and chunks. Default: the fp32 store.
  std::vector<KVCacheSpec> caches{KVCacheSpec{}};
  /// When set, a runner with this cache runs alongside, and every cache's KL divergence and top-1 agreement are
  /// measured against its next-token distributions.
  std::optional<KVCacheSpec> reference;
  /// Tokens (not among the scored ones) whose keys and values, captured once through an f16 cache, train every
  /// compressed cache's codecs (LlamaRunner::train_cache). Required when a cache needs training (vecinfer);
  /// int8/int4 use it for their per-channel scales; empty: no training.
  std::vector<int> calibration;
  /// What every runner's matrix products take (LlamaRunner::set_product_input): q8 as the runner does by default;
  /// f32 where two caches are compared so closely that an activation rounding to the other 8-bit step would show.
  ProductInput product_input = ProductInput::q8;
  /// Called after each window with (windows done, windows in all).
  std::function<void(size_t, size_t)> progress;
};

/// One cache's figures over all windows.
/// Bits per element of a sequence of `tokens` tokens whose first `sinks` are kept in f16, the others at `bits`:
/// bits + min(sinks, tokens) (16 - bits) / tokens.
double sink_bits(double bits, int sinks, int tokens);

struct CacheQuality {
  KVCacheSpec cache;
  double mean_nll = 0;    ///< mean negative log-likelihood (nats)
  double ppl = 0;         ///< exp(mean_nll)
  double kld = 0;         ///< mean over scored positions of KL(p_reference || p_cache), nats; 0 without reference
  double top1_agree = 1;  ///< share of scored positions whose most likely next token equals the reference's
  size_t cache_bytes = 0; ///< bytes the cache holds at the end of the first window (the largest)
  /// Codec storage, padding excluded (fp32 store: 32); with sink tokens, their f16 share of a full window counted:
  /// b + min(S, window) (16 - b) / window (sink_bits).
  double bits_per_element_k = 32, bits_per_element_v = 32;
  double seconds = 0;     ///< time in this cache's forward passes
};

struct PerplexityResult {
  size_t tokens = 0;     ///< tokens scored
  double mean_nll = 0;   ///< of caches[0]
  double ppl = 0;        ///< of caches[0]
  std::vector<CacheQuality> caches;      ///< one per PerplexityOptions::caches
  std::optional<CacheQuality> reference; ///< when PerplexityOptions::reference is set
};

/// Splits `tokens` (text tokens, no BOS) into windows of options.window tokens (the last may be shorter). Where
/// the tokenizer adds BOS, each window is run after a BOS and all its tokens are scored; otherwise its first token
/// is context only and the rest are scored.
PerplexityResult measure_perplexity(const LlamaModel& model, const Tokenizer& tokenizer, std::span<const int> tokens,
                                    const PerplexityOptions& options);

/// One window of measure_perplexity: inputs[j] runs at position j and predicts targets[j].
struct PerplexityWindow {
  std::vector<int> inputs, targets;
};

/// measure_perplexity's windows of `tokens`: consecutive runs of `window` tokens (the last may be shorter), each
/// after a BOS where the tokenizer adds one (then all its tokens are targets), else with its first token as
/// context only.
std::vector<PerplexityWindow> perplexity_windows(const Tokenizer& tokenizer, std::span<const int> tokens,
                                                 int window);

/// log sum_v exp(logits[v]), in double.
double log_sum_exp(std::span<const float> logits);

/// A reference's next-token distribution, its probabilities computed once for the KL divergences of several
/// caches against it.
class ReferenceDistribution {
 public:
  void assign(std::span<const float> logits);
  double log_sum_exp() const { return lse_; }
  /// KL(p_reference || q) for the softmax of logits q, whose log-sum-exp is lse_q.
  double kl_divergence(std::span<const float> q, double lse_q) const;

 private:
  double lse_ = 0;
  std::vector<double> log_p_, p_;
};

/// The first `max_tokens` tokens of `text` (or all of them), tokenizing only as much of the text as needed.
/// bytes_used (optional): how many leading bytes of `text` those tokens came from, at most.
std::vector<int> tokenize_prefix(const Tokenizer& tokenizer, std::string_view text, size_t max_tokens,
                                 size_t* bytes_used = nullptr);

/// The last `n_tokens` tokens of the text's tail that starts at a line start at or after byte `not_before`
/// (tokenized from there); kvq::Error when that tail holds fewer tokens.
std::vector<int> tokenize_tail(const Tokenizer& tokenizer, std::string_view text, size_t n_tokens, size_t not_before);

}  // namespace kvq
