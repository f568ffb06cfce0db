// A calibration (kvq calibrate): the key and value codec of every layer of one model and whether its keys are
// centered, chosen under a bit budget, and the file that carries it to kvq ppl / generate (--calib FILE).
//
// File format, text, one field per line in this order:
//   kvq-calibration 5
//   architecture NAME            GGUF general.architecture, or llama2.c
//   layers N | heads N | kv_heads N | head_dim N
//   model_crc32c XXXXXXXX        of the GGUF's header, metadata and tensor infos; of the llama2.c header's fields
//   channel_layout NAME          rope_adjacent_pairs or rope_halves: the key channels the codecs were measured on
//   budget_bits B | block_tokens T | calibration_tokens N | sink_tokens S | predicted_kld K
//                                T: the page's tokens the budget's block bytes assume; N: the tokens scored
//   layer L KEY_SPEC VALUE_SPEC CENTERING
//                                one per layer, in order; CENTERING: plain, or centered (LayerCodecs::center_keys)
//   trained_states M             the number of state lines that follow, at most 2 per layer
//   state L ROLE BYTES HEX       ROLE key or value: Codec::state() of that layer's codec (LayerCodecs::key_state,
//                                value_state), BYTES bytes in 2 BYTES lowercase hex digits; in order of layer, key
//                                before value, each at most once; only non-empty states. The states are those of
//                                codecs seeded as layer L's of a cache of seed 0 (kvq calibrate's).
//   crc32c XXXXXXXX              CRC-32C of every byte before this line
// Version 4 (without trained_states and state lines) is read with no states; version 3 also without sink_tokens
// (S = 0); version 2 (layer lines without CENTERING) with every layer plain; version 1 (also without block_tokens
// and calibration_tokens) so too, with T = 64, the only T it was written for, and N = 0 (unknown); later versions
// are refused.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kvq/model.hpp"

namespace kvq {

/// What a calibration is valid for: a model's shape and a checksum of its file's description of itself.
struct ModelIdentity {
  std::string architecture;
  int n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  uint32_t model_crc32c = 0;
  /// kvq's runner keeps GGUF's channel order: RoPE pairs (2i, 2i+1) for llama ("rope_adjacent_pairs"), halves
  /// (i, i + d/2) for qwen2 and gemma3 ("rope_halves"); transformers' llama keys are in halves (docs/python.md).
  std::string channel_layout;
  bool operator==(const ModelIdentity&) const = default;
};

ModelIdentity model_identity(const LlamaModel& model);

struct Calibration {
  ModelIdentity model;
  double budget_bits = 0;     ///< the average stored bits per element asked for
  int block_tokens = 64;      ///< T of the pages whose block bytes the budget counts
  size_t calibration_tokens = 0;  ///< scored positions behind the measured KL divergences; 0: unknown
  int sink_tokens = 0;        ///< CacheConfig::sink_tokens the codecs were measured and budgeted with (f16 tokens)
  double predicted_kld = 0;   ///< the sum of the chosen codecs' single-layer KL divergences
  std::vector<LayerCodecs> layers;  ///< [n_layers], key centering and trained states included
};

/// Writes `path` (through path.tmp, then renamed).
void save_calibration(const Calibration& calibration, const std::filesystem::path& path);
/// Reads and checks a calibration file: kvq::Error naming what is wrong (not a regular file, too large, another
/// format or version, a checksum mismatch, a field out of order or out of range, an unknown codec spec, centering
/// asked of keys stored as they are, a trained state its codec refuses).
Calibration load_calibration(const std::filesystem::path& path);
/// kvq::Error naming the first difference when `calibration` was made for another model than `model`.
void check_calibration_model(const Calibration& calibration, const LlamaModel& model);

}  // namespace kvq
