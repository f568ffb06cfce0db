// The decode loop shared by `kvq generate`, `kvq demo` and the benchmarks: prompt, then sampled tokens, timed one
// way for all of them.
#include <algorithm>
#include <chrono>

#include "kvq/error.hpp"
#include "kvq/model.hpp"

namespace kvq {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

double Generation::prefill_tokens_per_second() const {
  return prompt_tokens > 1 && prefill_seconds > 0 ? static_cast<double>(prompt_tokens - 1) / prefill_seconds : 0.0;
}

double Generation::decode_tokens_per_second() const {
  return tokens.size() > 1 && decode_seconds > 0 ? static_cast<double>(tokens.size() - 1) / decode_seconds : 0.0;
}

Generation generate(LlamaRunner& runner, const Tokenizer& tokenizer, std::span<const int> prompt, int steps,
                    Sampler& sampler, const std::function<void(int, int)>& on_token) {
  KVQ_CHECK(!prompt.empty(), "generate: an empty prompt (a tokenizer with a BOS token starts every prompt with it)");
  KVQ_CHECK(steps >= 0, "generate: steps = ", steps, " (need >= 0)");
  KVQ_CHECK(prompt.size() + static_cast<size_t>(steps) <= static_cast<size_t>(runner.context()), "generate: the "
            "prompt (", prompt.size(), " tokens) and ", steps, " new tokens exceed the runner's context of ",
            runner.context());
  KVQ_CHECK(runner.position() == 0, "generate: the runner is at position ", runner.position(), " (reset it first)");
  Generation g;
  g.prompt_tokens = prompt.size();
  const int prefill = static_cast<int>(prompt.size()) - 1;
  const auto prefill_start = std::chrono::steady_clock::now();
  for (int pos = 0; pos < prefill; pos += kPrefillChunk) {
    const int n = std::min(kPrefillChunk, prefill - pos);
    runner.forward_chunk(prompt.subspan(static_cast<size_t>(pos), static_cast<size_t>(n)), pos, false);
  }
  g.prefill_seconds = seconds_since(prefill_start);

  int token = prompt.back();
  auto first = std::chrono::steady_clock::now();
  StageTimes first_stages = runner.stage_times();
  for (int pos = prefill; pos < prefill + steps; ++pos) {
    const int next = sampler.sample(runner.forward(token, pos));
    if (g.tokens.empty()) {
      first = std::chrono::steady_clock::now();
      first_stages = runner.stage_times();
    }
    if (next == tokenizer.eos() || next == tokenizer.bos()) break;
    if (on_token) on_token(token, next);
    g.tokens.push_back(next);
    token = next;
  }
  g.decode_seconds = seconds_since(first);
  g.decode_stages = runner.stage_times() - first_stages;
  return g;
}

}  // namespace kvq
