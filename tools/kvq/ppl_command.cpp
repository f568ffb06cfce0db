// kvq ppl --model M [--tokenizer F] --text FILE --ctx N --max-tokens N [--k SPEC --v SPEC ...] [--calib FILE ...]
//         [--residual R] [--skip-tokens N] [--score-from N] [--chunk N] [--calib-tokens N] [--threads K]
//         [--f32-products] [--exact] [--json]
// A compressed cache runs in lockstep with the f16/f16 cache on the same windows and chunks, which gives the
// perplexity change, the KL divergence and the top-1 agreement of the codecs. Several --k/--v pairs run together
// against one f16 pass (one line or JSON object each).
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cache_options.hpp"
#include "commands.hpp"
#include "exact_attention_option.hpp"
#include "kvq/detail/calibration.hpp"
#include "kvq/detail/perplexity.hpp"
#include "kvq/error.hpp"
#include "model_file.hpp"
#include "progress.hpp"

namespace kvq::cli {
namespace {

struct PplOptions {
  std::string model, tokenizer, text;
  int ctx = 256;
  size_t max_tokens = 1000;
  size_t skip_tokens = 0;
  int score_from = 0;
  int chunk = 64;
  size_t calib_tokens = 0;
  int threads = 0;
  CacheListOptions caches;
  std::vector<std::string> calib;
  bool sweep_layers = false;
  bool f32_products = false;
  bool json = false;
};

// The --calib file whose per-layer codecs `cache` runs (the first of equal ones).
std::string calib_file(const PplOptions& o, const KVCacheSpec& cache) {
  for (const std::string& path : o.calib)
    if (load_calibration(path).layers == cache.layer_codecs) return path;
  return "";
}

void print(const PplOptions& o, const PerplexityResult& r, const CacheQuality& q, size_t calib_tokens,
           double seconds) {
  const bool compressed = q.cache.compressed();
  const CacheQuality& f16 = r.reference ? *r.reference : q;  // f16/f16 is its own reference
  const double delta_pct = 100.0 * (q.ppl - f16.ppl) / f16.ppl;
  if (o.json) {
    nlohmann::ordered_json j = {{"model", o.model},
                                {"k", q.cache.key_codec},
                                {"v", q.cache.value_codec},
                                {"residual", q.cache.residual_tokens},
                                {"center_keys", q.cache.center_keys},
                                {"sink_tokens", q.cache.sink_tokens},
                                {"ctx", o.ctx},
                                {"chunk", o.chunk},
                                {"calib_tokens", calib_tokens},
                                {"skip_tokens", o.skip_tokens},
                                {"score_from", o.score_from},
                                {"tokens", r.tokens},
                                {"mean_nll", q.mean_nll},
                                {"ppl", q.ppl}};
    if (compressed) {
      j["ppl_f16"] = f16.ppl;
      j["delta_ppl_pct"] = delta_pct;
      j["kld"] = q.kld;
      j["top1_agree"] = q.top1_agree;
    }
    j["bits_per_element_k"] = q.bits_per_element_k;
    j["bits_per_element_v"] = q.bits_per_element_v;
    j["cache_bytes"] = q.cache_bytes;
    if (compressed) j["cache_bytes_f16"] = f16.cache_bytes;
    if (!q.cache.layers.empty()) j["layers"] = q.cache.layers;
    if (!q.cache.layer_codecs.empty()) {
      j["calib"] = calib_file(o, q.cache);
      for (size_t l = 0; l < q.cache.layer_codecs.size(); ++l) {
        const LayerCodecs& c = q.cache.layer_codecs[l];
        j["layer_codecs"].push_back({c.key, c.value});
        if (c.center_keys) j["centered_layers"].push_back(l);
      }
    }
    j["tokens_per_second"] = static_cast<double>(r.tokens) / q.seconds;
    j["seconds"] = seconds;
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("model %s  ctx %d  cache %s (bits/element k %.3f, v %.3f)\n", o.model.c_str(), o.ctx,
              q.cache.label().c_str(), q.bits_per_element_k, q.bits_per_element_v);
  std::printf("  tokens       %zu\n  ppl          %.4f\n", r.tokens, q.ppl);
  if (r.reference)
    std::printf("  ppl f16      %.4f  (%+.3f%%)\n  KLD          %.6f\n  top-1 agree  %.4f\n", f16.ppl, delta_pct, q.kld,
                q.top1_agree);
  std::printf("  cache bytes  %zu", q.cache_bytes);
  if (r.reference) std::printf(" (f16: %zu)", f16.cache_bytes);
  std::printf("\n  %.1f tokens/s, %.1f s\n", static_cast<double>(r.tokens) / q.seconds, seconds);
}

void run_ppl(const PplOptions& o) {
  const LlamaModel model = load_model(o.model, "kvq ppl");
  const auto tokenizer = load_tokenizer(model, o.tokenizer);
  const std::string text = read_text_file(o.text);
  size_t evaluated_bytes = 0;
  KVQ_CHECK(o.ctx > 0 && o.skip_tokens % static_cast<size_t>(o.ctx) == 0, "--skip-tokens (", o.skip_tokens,
            ") must be a multiple of --ctx (", o.ctx, ") so that the windows are those of a run from the start");
  std::vector<int> tokens = tokenize_prefix(*tokenizer, text, o.skip_tokens + o.max_tokens, &evaluated_bytes);
  KVQ_CHECK(tokens.size() > o.skip_tokens, "the text has ", tokens.size(), " tokens, none after --skip-tokens ",
            o.skip_tokens);
  tokens.erase(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(o.skip_tokens));
  PerplexityOptions options;
  options.window = o.ctx;
  options.chunk = o.chunk;
  options.score_from = o.score_from;
  options.threads = o.threads;
  options.product_input = o.f32_products ? ProductInput::f32 : ProductInput::q8;
  options.caches = o.caches.specs();
  if (!o.calib.empty()) {  // the calibrated caches alone, or after the --k/--v pairs
    if (o.caches.keys.empty()) options.caches.clear();
    // --calib-tokens trains every compressed cache: it would replace a file's trained codecs, and give its int
    // layers per-channel scales that kvq calibrate never measured.
    KVQ_CHECK(o.calib_tokens == 0, "--calib ", o.calib.front(), " is used as calibrated, which --calib-tokens ",
              o.calib_tokens, " would retrain: leave out --calib-tokens (measure the --k/--v caches that need "
              "training in another run)");
    for (const std::string& path : o.calib)
      options.caches.push_back(calibrated_cache(path, model, o.caches.common).spec);
  }
  if (o.sweep_layers) {  // each cache once per layer, compressing that layer only
    std::vector<KVCacheSpec> per_layer;
    for (const KVCacheSpec& spec : options.caches)
      for (int l = 0; l < model.config().n_layers; ++l) {
        per_layer.push_back(spec);
        per_layer.back().layers = {l};
      }
    options.caches = per_layer;
  }
  for (const KVCacheSpec& spec : options.caches)
    if (spec.compressed() && !is_f16_cache(spec)) options.reference = f16_cache_like(o.caches.common);
  // Calibration comes from the text's tail, after every evaluated token.
  if (o.calib_tokens > 0) options.calibration = tokenize_tail(*tokenizer, text, o.calib_tokens, evaluated_bytes);
  Progress bar("ppl");
  options.progress = [&bar](size_t done, size_t total) { bar.update(done, total); };
  const auto start = std::chrono::steady_clock::now();
  const PerplexityResult r = measure_perplexity(model, *tokenizer, tokens, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const CacheQuality& q : r.caches) print(o, r, q, options.calibration.size(), seconds);
}

}  // namespace

void add_ppl_command(CLI::App& app) {
  auto o = std::make_shared<PplOptions>();
  CLI::App* cmd = app.add_subcommand("ppl", "perplexity of a model on a text, in windows evaluated from scratch; "
                                            "with a compressed cache also KL divergence and top-1 agreement vs f16");
  cmd->add_option("--model", o->model, "checkpoint: .gguf or llama2.c .bin")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file (llama2.c tokenizer.bin); default: the GGUF's own");
  cmd->add_option("--text", o->text, "UTF-8 text file")->required();
  cmd->add_option("--ctx", o->ctx, "tokens per window")->check(CLI::Range(2, 1 << 20))->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "score the first N tokens of the text")
      ->check(CLI::Range(1, 1 << 30))->capture_default_str();
  cmd->add_option("--skip-tokens", o->skip_tokens,
                  "start after the first N tokens (a multiple of --ctx): a long run evaluated in pieces")
                      ->check(CLI::Range(0, 1 << 30))->capture_default_str();
  cmd->add_option("--score-from", o->score_from,
                  "score only positions >= N of each window, the earlier ones being context (N < --ctx; "
                  "llama.cpp's perplexity scores the second half: --ctx / 2)")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  cmd->add_option("--chunk", o->chunk, "positions per forward pass (1 = token by token)")
      ->check(CLI::Range(1, 1 << 16))->capture_default_str();
  cmd->add_option("--calib-tokens", o->calib_tokens,
                  "train the codecs (vecinfer needs it; int8/int4 set channel scales) on the keys and values of the "
                  "last N tokens of the text, never among the scored ones; every compressed cache, so not with "
                  "--calib (a file's codecs are used as calibrated)")->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  add_cache_list_options(*cmd, o->caches);
  cmd->add_option("--calib", o->calib, "a calibration file (kvq calibrate --out): its per-layer codecs, measured "
                  "alone or after the --k/--v caches; repeatable");
  cmd->add_flag("--sweep-layers", o->sweep_layers,
                "measure every cache once per layer, with only that layer compressed (the others f16)");
  cmd->add_option("--threads", o->threads, "threads (0 = all cores)")
      ->check(CLI::Range(0, 1024))->capture_default_str();
  cmd->add_flag("--f32-products", o->f32_products,
                "matrix products on fp32 activations, not 8-bit activation blocks: what an fp32 implementation "
                "(transformers) computes, for comparisons closer than the 8-bit rounding (about 0.3% of perplexity)");
  add_exact_attention_option(*cmd);
  cmd->add_flag("--json", o->json, "print one JSON object per cache (one line each)");
  cmd->callback([o] { run_ppl(*o); });
}

}  // namespace kvq::cli
