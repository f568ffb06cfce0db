#include "decode_speed.hpp"

#include <algorithm>
#include <vector>

#include "kvq/error.hpp"
#include "kvq/model.hpp"

namespace kvq::cli {
namespace {

constexpr size_t kCalibrationTokens = 1024;

}  // namespace

DecodeSpeed measure_decode_speed(const LlamaModel& model, const Tokenizer& tokenizer, std::span<const int> text,
                                 const KVCacheSpec& cache, int depth, int steps, int threads) {
  KVQ_CHECK(!text.empty(), "decode speed: an empty text");
  KVQ_CHECK(depth >= 0 && steps >= 2, "decode speed: depth ", depth, ", steps ", steps, " (need >= 0 and >= 2)");
  std::vector<int> prompt;
  if (tokenizer.add_bos()) prompt.push_back(tokenizer.bos());
  const size_t prompt_tokens = static_cast<size_t>(depth) + 1;  // the last one runs as the first decode step
  while (prompt.size() < prompt_tokens) {
    const size_t n = std::min(text.size(), prompt_tokens - prompt.size());
    prompt.insert(prompt.end(), text.begin(), text.begin() + static_cast<std::ptrdiff_t>(n));
  }
  const int context = depth + 1 + steps;
  DecodeSpeed s;
  s.cache = cache;
  s.depth = depth;
  s.beyond_trained_context = context > model.config().max_seq_len;
  LlamaRunner runner(model, context, threads, cache, ContextLimit::any);
  if (runner.needs_calibration()) {
    runner.calibrate(text.first(std::min(text.size(), kCalibrationTokens)));
  }
  Sampler greedy(0.0f, 0);
  const Generation g = generate(runner, tokenizer, prompt, steps, greedy);
  s.prefill_tokens_per_second = g.prefill_tokens_per_second();
  s.decoded = g.tokens.size() > 1 ? g.tokens.size() - 1 : 0;
  s.decode_tokens_per_second = g.decode_tokens_per_second();
  if (s.decoded > 0) {
    const double n = static_cast<double>(s.decoded);
    const StageTimes& t = g.decode_stages;
    s.per_token = {t.weights / n, t.attention / n, t.append / n, g.decode_seconds / n};
  }
  s.cache_bytes = runner.cache_bytes();
  return s;
}

}  // namespace kvq::cli
