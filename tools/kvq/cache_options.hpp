// What kvq ppl, generate, demo and bench decode share: the key/value cache options and text files.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "kvq/model.hpp"

namespace kvq::cli {

/// --k, --v, --residual, --block-tokens, --cache-seed: a compressed KVCache; none given: the fp32 store.
void add_cache_options(CLI::App& cmd, KVCacheSpec& spec);

/// The same with --k and --v repeatable: the i-th --k goes with the i-th --v.
struct CacheListOptions {
  std::vector<std::string> keys, values;
  KVCacheSpec common;  // T, R, seed
  /// One spec per --k/--v pair; {fp32 store} when none is given; kvq::Error when the counts differ.
  std::vector<KVCacheSpec> specs() const;
};
void add_cache_list_options(CLI::App& cmd, CacheListOptions& o);

std::string read_text_file(const std::string& path);

/// The f16/f16 cache that compressed caches are compared with, with the block size and window of `like`.
KVCacheSpec f16_cache_like(const KVCacheSpec& like);

/// Why the cache codecs cannot hold the attention heads of a model with this config (e.g. stories260K's heads of
/// dimension 8), or "" when they can.
std::string codec_refusal(const LlamaConfig& config);

/// A --calib file's cache.
struct CalibratedCache {
  KVCacheSpec spec;   ///< `like` with the file's per-layer codecs, centering, trained states and sink tokens
  std::string name;   ///< what its rows are called: the file's name and budget, e.g. "s-bc512-3.calib (3 bits)"
};

/// `like` with the per-layer codecs of a calibration file (kvq calibrate --out), checked against `model`.
CalibratedCache calibrated_cache(const std::string& path, const LlamaModel& model, const KVCacheSpec& like);

/// Whether `spec` is the f16/f16 cache.
bool is_f16_cache(const KVCacheSpec& spec);

}  // namespace kvq::cli
