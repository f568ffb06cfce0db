#include "cache_options.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/calibration.hpp"
#include "kvq/detail/mapped_file.hpp"
#include "kvq/error.hpp"

namespace kvq::cli {

namespace {

const char* const kKeyHelp =
    "key codec spec, e.g. f16, int8, int4:16, turbo_prod:3 (default, with --v: no KVCache, fp32 keys and values "
    "with exact attention)";
const char* const kValueHelp = "value codec spec, e.g. f16, int4, kivi:2, turbo_mse:3";

void add_layout_options(CLI::App& cmd, KVCacheSpec& spec) {
  cmd.add_option("--residual", spec.residual_tokens, "newest tokens kept in fp32 (a multiple of the block size)")
      ->check(CLI::Range(0, 65536))->capture_default_str();
  cmd.add_option("--sink", spec.sink_tokens,
                 "the first N tokens of each sequence kept in f16, never quantized (the attention sink; N (16 - b) "
                 "/ ctx bits per element more, counted in the bits reported)")
      ->check(CLI::Range(0, kMaxSinkTokens))->capture_default_str();
  cmd.add_option("--block-tokens", spec.block_tokens, "tokens per cache page: 64 or 128")
      ->check(CLI::IsMember({64, 128}))->capture_default_str();
  cmd.add_option("--cache-seed", spec.seed, "seed of the codecs' rotations and sketches")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd.add_flag("--center-keys", spec.center_keys,
               "store quantized keys minus their first-page mean (attention is the same either way; the codecs "
               "quantize the per-token part more finely: Gemma 3 gains, SmolLM2 loses, docs/quality.md)");
  cmd.add_option("--layers", spec.layers,
                 "compress only these layers (e.g. --layers 0 5), the others f16: which layers a codec hurts")
                     ->check(CLI::Range(0, 4095));
}

}  // namespace

void add_cache_options(CLI::App& cmd, KVCacheSpec& spec) {
  cmd.add_option("--k", spec.key_codec, kKeyHelp);
  cmd.add_option("--v", spec.value_codec, kValueHelp);
  add_layout_options(cmd, spec);
}

void add_cache_list_options(CLI::App& cmd, CacheListOptions& o) {
  cmd.add_option("--k", o.keys, std::string(kKeyHelp) + "; repeat --k and --v to measure several caches at once");
  cmd.add_option("--v", o.values, kValueHelp);
  add_layout_options(cmd, o.common);
}

std::vector<KVCacheSpec> CacheListOptions::specs() const {
  KVQ_CHECK(keys.size() == values.size(), "give as many --v as --k (", keys.size(), " --k, ", values.size(),
            " --v): the i-th key codec goes with the i-th value codec");
  if (keys.empty()) return {KVCacheSpec{}};
  std::vector<KVCacheSpec> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    KVCacheSpec spec = common;
    spec.key_codec = keys[i];
    spec.value_codec = values[i];
    out.push_back(spec);
  }
  return out;
}

std::string read_text_file(const std::string& path) {
  const MappedFile file(path);  // only regular files: a FIFO or a device would block or never end
  return {reinterpret_cast<const char*>(file.bytes().data()), file.bytes().size()};
}

KVCacheSpec f16_cache_like(const KVCacheSpec& like) {
  KVCacheSpec f16 = like;
  f16.key_codec = f16.value_codec = "f16";
  return f16;
}

std::string codec_refusal(const LlamaConfig& config) {
  try {
    make_codec("f16", {config.head_dim(), 64, 0, Role::key});
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

CalibratedCache calibrated_cache(const std::string& path, const LlamaModel& model, const KVCacheSpec& like) {
  const Calibration calibration = load_calibration(path);
  try {
    check_calibration_model(calibration, model);
  } catch (const Error& e) {  // several --calib files: say which one
    throw Error(path + ": " + e.what());
  }
  if (calibration.block_tokens != like.block_tokens)
    std::fprintf(stderr, "kvq: %s chose its codecs for pages of %d tokens, this cache has %d: its bits per element "
                 "differ from the budget of %g\n", path.c_str(), calibration.block_tokens, like.block_tokens,
                 calibration.budget_bits);
  if (like.sink_tokens != 0 && like.sink_tokens != calibration.sink_tokens)
    std::fprintf(stderr, "kvq: %s chose its codecs with %d sink tokens, --sink asks for %d: the calibration's are "
                 "kept\n", path.c_str(), calibration.sink_tokens, like.sink_tokens);
  // Trained states belong to codecs of a seed-0 cache's seeds (a codebook lives in its codec's rotated space).
  const bool trained = std::any_of(calibration.layers.begin(), calibration.layers.end(), [](const LayerCodecs& c) {
    return !c.key_state.empty() || !c.value_state.empty();
  });
  if (trained && like.seed != 0)
    std::fprintf(stderr, "kvq: %s holds codec states trained for cache seed 0, --cache-seed asks for %llu: seed 0 "
                 "is kept\n", path.c_str(), static_cast<unsigned long long>(like.seed));
  KVCacheSpec spec = like;
  if (trained) spec.seed = 0;
  spec.sink_tokens = calibration.sink_tokens;
  spec.key_codec = spec.value_codec = "";
  spec.layers.clear();
  spec.layer_codecs = calibration.layers;
  const std::string name = std::filesystem::path(path).filename().string();
  return {spec, detail::concat(name, " (", calibration.budget_bits, " bits)")};
}

bool is_f16_cache(const KVCacheSpec& spec) { return spec.key_codec == "f16" && spec.value_codec == "f16"; }

}  // namespace kvq::cli
