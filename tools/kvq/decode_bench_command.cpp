// kvq bench decode [--model M] [--depth 0,4096,...] [--k SPEC --v SPEC ...] [--calib FILE ...] [--steps N]
//   [--threads T] [--json FILE]
//
// Whole-model decode speed: for every depth and cache, the depth's tokens run as a prompt (prefill tokens/s), then
// greedy decode steps are timed (tokens/s) and split by the runner's stages: weights (matrix products), attention,
// cache append and the rest. The caches take turns at each depth, so that drifting load from other processes hits
// them alike. Depths past the model's trained context run on (RoPE extrapolates): speed only, marked in the output.
// Each --calib file is one more row, its per-layer codecs (kvq calibrate), named by the file and its budget.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cache_options.hpp"
#include "commands.hpp"
#include "decode_speed.hpp"
#include "default_files.hpp"
#include "kvq/attention.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/perplexity.hpp"
#include "kvq/error.hpp"
#include "model_file.hpp"
#include "system_info.hpp"

namespace kvq::cli {
namespace {

struct DecodeBenchOptions {
  std::string model, tokenizer, text, json_file;
  std::vector<int> depths = {0, 4096};
  CacheListOptions caches;
  std::vector<std::string> calib;
  int steps = 32;
  int threads = 2;
};

// One row's cache: a --k/--v pair (or the default) or a --calib file's per-layer codecs.
struct BenchCache {
  KVCacheSpec spec;
  std::string name;   // the row's label
  std::string calib;  // the --calib file, or empty
};

nlohmann::ordered_json row_json(const DecodeSpeed& s) {
  const auto ms = [](double seconds) { return seconds * 1e3; };
  return {{"k", s.cache.key_codec},
          {"v", s.cache.value_codec},
          {"depth", s.depth},
          {"beyond_trained_context", s.beyond_trained_context},
          {"prefill_tokens_per_second", s.prefill_tokens_per_second},
          {"decoded_tokens", s.decoded},
          {"decode_tokens_per_second", s.decode_tokens_per_second},
          {"ms_per_token",
           {{"weights", ms(s.per_token.weights)},
            {"attention", ms(s.per_token.attention)},
            {"append", ms(s.per_token.append)},
            {"rest", ms(s.per_token.rest())},
            {"total", ms(s.per_token.total)}}},
          {"cache_bytes", s.cache_bytes}};
}

void run_decode_bench(DecodeBenchOptions o) {
  if (o.model.empty()) {
    const ModelFiles files = default_model("kvq bench decode");
    o.model = files.model;
    if (o.tokenizer.empty()) o.tokenizer = files.tokenizer;
  }
  std::sort(o.depths.begin(), o.depths.end());
  o.depths.erase(std::unique(o.depths.begin(), o.depths.end()), o.depths.end());
  std::vector<KVCacheSpec> specs = o.caches.specs();
  const LlamaModel model = load_model(o.model, "kvq bench decode");
  const auto tok = load_tokenizer(model, o.tokenizer);
  const LlamaConfig& c = model.config();
  // No --k/--v: the f16 cache, or the fp32 store where the codecs cannot hold the model's heads.
  if (o.caches.keys.empty() && codec_refusal(c).empty()) specs = {f16_cache_like(o.caches.common)};
  std::vector<BenchCache> caches;
  for (const KVCacheSpec& spec : specs) {  // a bad spec fails here, before any row runs
    if (spec.compressed()) {
      make_codec(spec.key_codec, {c.head_dim(), spec.block_tokens, 0, Role::key});
      make_codec(spec.value_codec, {c.head_dim(), spec.block_tokens, 0, Role::value});
    }
    caches.push_back({spec, spec.label(), ""});
  }
  for (const std::string& path : o.calib) {  // so does a file for another model
    CalibratedCache calibrated = calibrated_cache(path, model, o.caches.common);
    caches.push_back({std::move(calibrated.spec), std::move(calibrated.name), path});
  }
  const TextFile text = default_text(o.text);
  const std::vector<int> tokens = tokenize_prefix(*tok, text.text, 1 << 16);
  KVQ_CHECK(!tokens.empty(), "kvq bench decode: ", text.name, " holds no tokens");

  std::printf("kvq bench decode: %s (%d layers, %d query heads on %d kv heads of dimension %d, trained context %d)\n"
              "cpu %s, isa %s, %d threads; prompt: %s, repeated to each depth; %d greedy steps per row\n\n",
              o.model.c_str(), c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim(), c.max_seq_len,
              cpu_model().c_str(), attention_isa().c_str(), o.threads, text.name.c_str(), o.steps);
  int width = 24;
  for (const BenchCache& cache : caches) width = std::max(width, static_cast<int>(cache.name.size()));
  std::printf("%-*s %6s %9s %9s %8s %8s %8s %8s %8s %11s\n", width, "k/v", "depth", "prefill", "decode", "ms/tok",
              "weights", "attn", "append", "rest", "cache MB");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  bool beyond = false;
  for (int depth : o.depths)
    for (const BenchCache& cache : caches) {
      const DecodeSpeed s = measure_decode_speed(model, *tok, tokens, cache.spec, depth, o.steps, o.threads);
      beyond = beyond || s.beyond_trained_context;
      const StageTimes& t = s.per_token;
      std::printf("%-*s %6d %9.1f %9.1f %8.2f %8.2f %8.2f %8.2f %8.2f %11.1f%s\n", width, cache.name.c_str(), depth,
                  s.prefill_tokens_per_second, s.decode_tokens_per_second, t.total * 1e3, t.weights * 1e3,
                  t.attention * 1e3, t.append * 1e3, t.rest() * 1e3, static_cast<double>(s.cache_bytes) / 1e6,
                  s.beyond_trained_context ? "  *" : "");
      std::fflush(stdout);
      rows.push_back(row_json(s));
      if (!cache.calib.empty()) rows.back()["calib"] = cache.calib;  // k and v empty: the file's codecs are per layer
    }
  std::printf("\nprefill, decode: tokens/s; ms/tok: time per decode step, split into weights (matrix products), "
              "attention, cache append and the rest (norms, RoPE, sampling)%s\n",
              beyond ? "; *: past the model's trained context (synthetic positions, RoPE extrapolated): speed only"
                     : "");
  if (o.json_file.empty()) return;
  const nlohmann::ordered_json result = {{"model", o.model},
                                         {"cpu", cpu_model()},
                                         {"isa", attention_isa()},
                                         {"threads", o.threads},
                                         {"steps", o.steps},
                                         {"trained_context", c.max_seq_len},
                                         {"prompt", text.name},
                                         {"rows", rows}};
  std::ofstream out(o.json_file);
  out << result.dump(2) << "\n";
  KVQ_CHECK(out.good(), "kvq bench decode: cannot write ", o.json_file);
}

}  // namespace

void add_decode_bench_command(CLI::App& bench) {
  auto o = std::make_shared<DecodeBenchOptions>();
  CLI::App* cmd = bench.add_subcommand("decode", "whole-model decode and prefill tokens/s at given depths, per cache, "
                                                 "with the time per token by stage");
  cmd->add_option("--model", o->model, kDefaultModelHelp);
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file for a llama2.c checkpoint");
  cmd->add_option("--text", o->text, "prompt text, repeated to each depth; default: TinyStories, else a paragraph");
  cmd->add_option("--depth", o->depths, "positions in the cache before decoding, comma-separated")
      ->delimiter(',')->check(CLI::Range(0, 1 << 20))->capture_default_str();
  add_cache_list_options(*cmd, o->caches);
  cmd->add_option("--calib", o->calib, "a calibration file (kvq calibrate --out): one more row with its per-layer "
                  "codecs, named by the file and its budget; repeatable");
  cmd->add_option("-n,--steps", o->steps, "timed decode steps per row")
      ->check(CLI::Range(2, 1 << 16))->capture_default_str();
  cmd->add_option("--threads", o->threads, "threads")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--json", o->json_file, "also write the rows to this file as JSON");
  cmd->footer("Without --k/--v: the f16 cache (the fp32 store where the codecs cannot hold the model's heads). The "
              "--calib rows come after these.");
  cmd->callback([o] { run_decode_bench(*o); });
}

}  // namespace kvq::cli
