// kvq calibrate's two steps: measure what each codec costs in each layer, then choose a codec per (layer, role)
// under a bit budget.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvq/detail/perplexity.hpp"
#include "kvq/model.hpp"

namespace kvq {

/// Which key variants kvq calibrate measures: the keys as they are, or also centered (LayerCodecs::center_keys) for
/// every key codec that quantizes.
enum class KeyCandidates { plain, plain_and_centered };

/// The states (Codec::state()) one candidate that needs training (vecinfer) learned in one layer: as its keys, as
/// its values, as its centered keys (empty where not measured).
struct TrainedStates {
  std::vector<uint8_t> key, value, centered_key;
};

/// KL divergence against the f16 cache with one layer's keys (or values) compressed, everything else f16.
struct LayerSensitivity {
  std::vector<std::string> codecs;                       ///< the candidates
  std::vector<std::array<std::vector<double>, 2>> kld;   ///< [layer][Role: key 0, value 1][codec], nats per token
  /// [layer][codec]: the same with the layer's keys centered; NaN for a codec centering does not apply to (f16);
  /// empty when only plain keys were measured.
  std::vector<std::vector<double>> centered_kld;
  size_t tokens = 0;                                     ///< scored tokens behind each figure
  int window = 0;                                        ///< tokens per window (the sequence length measured)
  int sink_tokens = 0;  ///< the measured caches' CacheConfig::sink_tokens (f16 tokens, in the budget of every choice)
  /// [layer][codec]: what each candidate that needs training learned there, the state its figures were measured
  /// with; empty states for the others. Empty when no candidate needs training.
  std::vector<std::vector<TrainedStates>> states;

  bool measured_centered() const { return !centered_kld.empty(); }
};

/// Runs `tokens` once per (layer, role, codec) with only that layer's keys or values in that codec, against the
/// f16 cache, in measure_perplexity's windows and chunks. The f16 cache runs once and keeps its residual stream;
/// each measured cache runs only from its layer on, starting from that stream (the layers before it are the
/// reference's), with the same figures as a whole measure_perplexity run of it. `options` gives the windows, chunks,
/// scored positions, threads and product input (its caches, reference and calibration are not used); `cache` the
/// block size, window and seed (not its codecs or centering). `keys`: whether each key codec that quantizes is
/// also measured with the layer's keys centered (LayerSensitivity::centered_kld). A codec named "f16" is not run:
/// its KL divergence against the f16 reference is 0. progress(layers done, layers), first with 0 when the
/// reference has run.
///
/// Candidates that need training (Codec::needs_training: vecinfer) are trained in each layer and role (and as
/// centered keys) on that layer's f16 keys or values of the measured tokens, as that layer's codec of the measured
/// cache (its seeds), and measured with that state (LayerSensitivity::states).
///
/// With an `anchor` (one of the candidates), only the anchor's figures are run to the logits; every other
/// codec's is predicted as the anchor's times the ratio of their local errors: the mean squared distance of the
/// residual stream leaving layer l (that layer alone run, from the reference's stream) from the reference's, for
/// the same role (centered keys: the anchor's plain keys). Each layer then costs two passes of the layers after it
/// and one layer's pass per codec and role, instead of one pass of the layers after it per codec and role. A
/// prediction: check it against the measured figures (kvq calibrate reports the chosen allocation's measured KL
/// divergence).
LayerSensitivity measure_layer_sensitivity(const LlamaModel& model, const Tokenizer& tokenizer,
                                           std::span<const int> tokens, const std::vector<std::string>& codecs,
                                           const PerplexityOptions& options, const KVCacheSpec& cache,
                                           KeyCandidates keys = KeyCandidates::plain, const std::string& anchor = {},
                                           const std::function<void(int, int)>& progress = {});

struct CodecChoice {
  std::vector<LayerCodecs> layers;  ///< [n_layers], key centering and trained states included
  double predicted_kld = 0;         ///< sum of the chosen single-layer KL divergences
  double bits_per_element = 0;      ///< stored bits per key and value element, block bytes, key offsets and sink
                                    ///< tokens (over windows of the sensitivity's length) counted, over all layers
};

/// The bytes a centered layer's key offsets add to each key block of a kv head in a budget: the cache keeps one
/// fp32 offset of head_dim channels per (sequence, layer, kv head) (KVCache::memory), spread over the
/// sequence_tokens / block_tokens blocks of a sequence of that length, rounded up.
size_t key_offset_bytes_per_block(int head_dim, int block_tokens, int sequence_tokens);

/// The key and value codec of every layer, and whether its keys are centered (with the trained states they were
/// measured with, LayerCodecs::key_state / value_state, for codecs that need training), that minimize the predicted KL
/// divergence (the sum of the measured single-layer, single-role divergences: errors assumed additive) with the
/// mean stored bits per element, keys and values of every layer alike (8 block_bytes / (T head_dim) of each chosen
/// codec, plus key_offset_bytes_per_block for centered keys in sequences of sequence_tokens tokens (0: the
/// measured window, sensitivity.window)), at most
/// `budget_bits`. Centered keys are candidates where they were measured. Sink tokens (sensitivity.sink_tokens) are
/// charged first: min(S, n) of a sequence's n = sequence_tokens tokens at 16 bits (sink_bits), the blocks share the
/// rest. Exact over the integer bytes
/// (codec_allocation.hpp); kvq::Error when the cheapest choice exceeds the budget.
CodecChoice choose_layer_codecs(const LayerSensitivity& sensitivity, double budget_bits, int head_dim,
                                int block_tokens, int sequence_tokens = 0);

}  // namespace kvq
