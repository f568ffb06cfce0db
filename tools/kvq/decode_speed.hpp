// Decode speed of a model with one cache at one depth: the measurement behind kvq bench decode and the speed
// column of kvq demo.
#pragma once

#include <cstddef>
#include <span>

#include "kvq/model.hpp"

namespace kvq::cli {

struct DecodeSpeed {
  KVCacheSpec cache;
  int depth = 0;                          ///< positions in the cache before the timed steps
  bool beyond_trained_context = false;    ///< depth + steps past the model's max_seq_len: speed only
  double prefill_tokens_per_second = 0;   ///< the depth's tokens as a prompt; 0 at depth 0
  size_t decoded = 0;                     ///< timed decode steps (fewer than asked when the model ends its text)
  double decode_tokens_per_second = 0;    ///< Generation::decode_tokens_per_second
  StageTimes per_token;                   ///< seconds per timed step by stage; total: the whole step
  size_t cache_bytes = 0;                 ///< the cache after the last step
};

/// Runs BOS (where the tokenizer has one) and `depth` tokens of `text` (repeated as often as needed) as a prompt
/// through a runner with `cache`, then `steps` greedy decode steps (generate()); codecs that need training are
/// calibrated on the text's first tokens. text: at least one token.
DecodeSpeed measure_decode_speed(const LlamaModel& model, const Tokenizer& tokenizer, std::span<const int> text,
                                 const KVCacheSpec& cache, int depth, int steps, int threads);

}  // namespace kvq::cli
