// kvq demo: the main job on a real model. Loads SmolLM2-135M (or stories260K when the GGUF is absent), continues a
// fixed prompt greedily, then measures on a short text, for the f16 cache and a few compressed ones in lockstep:
// bits per element, true cache bytes, compression, decode speed, perplexity change, KL divergence and top-1
// agreement against f16. --calib FILE adds the cache of a calibration file (kvq calibrate) to the comparison.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cache_options.hpp"
#include "commands.hpp"
#include "decode_speed.hpp"
#include "default_files.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/perplexity.hpp"
#include "kvq/error.hpp"
#include "kvq/model.hpp"
#include "model_file.hpp"
#include "progress.hpp"

namespace kvq::cli {
namespace {

const char* const kPrompt = "Once upon a time, a little fox";
constexpr int kSpeedSteps = 32;  // timed decode steps per cache

struct DemoOptions {
  std::string model, tokenizer, text;
  size_t tokens = 1024;
  int ctx = 512;
  int steps = 32;
  int speed_depth = 2048;
  int threads = 0;
  std::vector<std::string> calib;
  bool json = false;
};

struct DemoCache {
  std::string k, v;
};

const std::vector<DemoCache> kCaches = {{"int8", "int8"},
                                        {"int4", "int4"},
                                        {"turbo_mse:4", "turbo_mse:4"},
                                        {"turbo_mse:3", "turbo_mse:3"},
                                        {"turbo_prod:3", "turbo_mse:3"},
                                        {"kivi:2", "kivi:2"}};

// Greedy decode of `steps` tokens after `prompt` with one cache: the prompt and its continuation.
std::string greedy_text(const LlamaModel& model, const Tokenizer& tok, const std::vector<int>& prompt, int steps,
                        int threads, const KVCacheSpec& cache) {
  LlamaRunner runner(model, static_cast<int>(prompt.size()) + steps, threads, cache);
  Sampler greedy(0.0f, 0);
  const Generation g = generate(runner, tok, prompt, steps, greedy);
  std::vector<int> all = prompt;  // decoded with the prompt, so that the first new token keeps its space
  all.insert(all.end(), g.tokens.begin(), g.tokens.end());
  return tok.decode(all);
}

void run_demo(DemoOptions o) {
  if (o.model.empty()) {
    const ModelFiles files = default_model("kvq demo");
    o.model = files.model;
    if (o.tokenizer.empty()) o.tokenizer = files.tokenizer;
  }
  const LlamaModel model = load_model(o.model, "kvq demo");
  const auto tok = load_tokenizer(model, o.tokenizer);
  const LlamaConfig& c = model.config();
  std::vector<CalibratedCache> calibrated;  // loaded first: a file for another model fails before any work
  for (const std::string& path : o.calib) calibrated.push_back(calibrated_cache(path, model, KVCacheSpec{}));
  std::vector<int> prompt;
  if (tok->add_bos()) prompt.push_back(tok->bos());
  for (int t : tok->encode(kPrompt)) prompt.push_back(t);

  const TextFile text = default_text(o.text);
  const std::string& text_name = text.name;
  const std::vector<int> tokens = tokenize_prefix(*tok, text.text, o.tokens);
  const int ctx = std::min(o.ctx, c.max_seq_len - 1);

  const std::string refusal = codec_refusal(c);
  const KVCacheSpec f16 = refusal.empty() ? KVCacheSpec{"f16", "f16"} : KVCacheSpec{};
  const std::string continuation = greedy_text(model, *tok, prompt, o.steps, o.threads, f16);
  if (!o.json)
    std::printf("kvq demo: %s (%d layers, %d kv heads of dimension %d)\n\n%s\n\n", o.model.c_str(), c.n_layers,
                c.n_kv_heads, c.head_dim(), continuation.c_str());
  if (!refusal.empty()) {  // e.g. stories260K: heads of dimension 8
    PerplexityOptions options;
    options.window = ctx;
    options.threads = o.threads;
    const PerplexityResult r = measure_perplexity(model, *tok, tokens, options);
    std::fprintf(stderr, "kvq demo: perplexity with exact fp32 attention %.4f on %zu tokens of %s; the cache codecs "
                 "cannot hold this model's heads (%s), so no cache is compared: run scripts/fetch-models.sh for "
                 "SmolLM2-135M\n", r.ppl, r.tokens, text_name.c_str(), refusal.c_str());
    if (o.json) std::printf("[]\n");
    return;
  }
  // A page is encoded once full; until then its tokens are attended in f16.
  const int page = KVCacheSpec{}.block_tokens;
  KVQ_CHECK(ctx > page, "--ctx ", o.ctx, ": a window must be longer than one page of ", page, " tokens, or no page is "
            "encoded in it and every cache would read as f16 (the partial page is kept in f16); use --ctx ", 2 * page,
            " or more");
  if (!o.json) {
    std::printf("Perplexity on %zu tokens of %s (windows of %d), every cache against f16:\n\n", tokens.size(),
                text_name.c_str(), ctx);
  }

  PerplexityOptions options;
  options.window = ctx;
  options.threads = o.threads;
  options.reference = f16;
  options.caches.clear();
  std::vector<std::string> names = {f16.label()};  // per row: f16, the built-in caches, the --calib files
  for (const DemoCache& dc : kCaches) {
    options.caches.push_back({dc.k, dc.v});
    names.push_back(options.caches.back().label());
  }
  for (const CalibratedCache& cc : calibrated) {
    options.caches.push_back(cc.spec);
    names.push_back(cc.name);
  }
  Progress bar("perplexity");
  options.progress = [&bar](size_t done, size_t total) { bar.update(done, total); };
  const PerplexityResult r = measure_perplexity(model, *tok, tokens, options);

  // Decode speed where the cache matters: after speed_depth tokens of the text (kvq bench decode's measurement).
  std::vector<KVCacheSpec> speed_caches = {f16};
  speed_caches.insert(speed_caches.end(), options.caches.begin(), options.caches.end());
  const std::vector<int> speed_prompt =
      tokenize_prefix(*tok, text.text, std::max(tokens.size(), static_cast<size_t>(o.speed_depth)));
  std::vector<double> rates;
  Progress speed_bar("decode speed");
  for (const KVCacheSpec& spec : speed_caches) {
    speed_bar.update(rates.size(), speed_caches.size());
    const DecodeSpeed s = measure_decode_speed(model, *tok, speed_prompt, spec, o.speed_depth, kSpeedSteps, o.threads);
    rates.push_back(s.decode_tokens_per_second);
  }

  std::vector<CacheQuality> rows = {*r.reference};
  rows.insert(rows.end(), r.caches.begin(), r.caches.end());
  nlohmann::ordered_json json_rows = nlohmann::ordered_json::array();
  const size_t first_calibrated = 1 + kCaches.size();
  int width = 26;
  for (const std::string& name : names) width = std::max(width, static_cast<int>(name.size()));
  if (!o.json)
    std::printf("%-*s %6s %12s %8s %9s %9s %9s %8s\n", width, "codec (k/v)", "bits", "cache bytes", "vs f16",
                "tokens/s", "dPPL %", "KLD", "top-1");
  for (size_t i = 0; i < rows.size(); ++i) {
    const CacheQuality& q = rows[i];
    const double bits = (q.bits_per_element_k + q.bits_per_element_v) / 2;
    const double compression = static_cast<double>(rows[0].cache_bytes) / static_cast<double>(q.cache_bytes);
    const double delta = 100.0 * (q.ppl - rows[0].ppl) / rows[0].ppl;
    nlohmann::ordered_json row = {{"k", q.cache.key_codec},
                                  {"v", q.cache.value_codec},
                                  {"bits_per_element_k", q.bits_per_element_k},
                                  {"bits_per_element_v", q.bits_per_element_v},
                                  {"cache_bytes", q.cache_bytes},
                                  {"compression_vs_f16", compression},
                                  {"decode_tokens_per_second", rates[i]},
                                  {"decode_depth", o.speed_depth},
                                  {"ppl", q.ppl},
                                  {"delta_ppl_pct", delta},
                                  {"kld", q.kld},
                                  {"top1_agree", q.top1_agree}};
    if (i >= first_calibrated) row["calib"] = o.calib[i - first_calibrated];  // k and v empty: codecs per layer
    json_rows.push_back(row);
    if (!o.json)
      std::printf("%-*s %6.2f %12zu %7.2fx %9.1f %+8.2f%% %9.5f %8.4f\n", width, names[i].c_str(), bits,
                  q.cache_bytes, compression, rates[i], delta, q.kld, q.top1_agree);
  }
  if (o.json) {
    std::printf("%s\n", json_rows.dump(2).c_str());
  } else {
    std::printf("\nf16 perplexity %.4f over %zu tokens. bits: per cached element, keys and values averaged; cache "
                "bytes: the whole cache after a full window (pages, fp32 window, tables); tokens/s: greedy decode after %d "
                "tokens of the text, %s (kvq bench decode --depth %d).\n",
                rows[0].ppl, r.tokens, o.speed_depth,
                o.threads > 0 ? (std::to_string(o.threads) + " threads").c_str() : "all cores", o.speed_depth);
  }
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand("demo", "run a real model with compressed KV caches: text, bytes, speed and "
                                             "quality (perplexity, KL divergence, top-1) against f16");
  cmd->add_option("--model", o->model, kDefaultModelHelp);
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file for a llama2.c checkpoint");
  cmd->add_option("--text", o->text, "text for perplexity and the speed's prompt; default: TinyStories, else a "
                                     "built-in paragraph");
  cmd->add_option("--tokens", o->tokens, "tokens of the text to score")
      ->check(CLI::Range(1, 1 << 24))->capture_default_str();
  cmd->add_option("--ctx", o->ctx, "tokens per perplexity window")
      ->check(CLI::Range(2, 1 << 20))->capture_default_str();
  cmd->add_option("-n,--steps", o->steps, "tokens to generate")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  cmd->add_option("--speed-depth", o->speed_depth, "tokens of the text in the cache when decode speed is measured")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  cmd->add_option("--threads", o->threads, "threads (0 = all cores)")
      ->check(CLI::Range(0, 1024))->capture_default_str();
  cmd->add_option("--calib", o->calib, "a calibration file (kvq calibrate --out): one more cache with its per-layer "
                  "codecs, named by the file and its budget; repeatable");
  cmd->add_flag("--json", o->json, "print the table as a JSON array");
  cmd->callback([o] { run_demo(*o); });
}

}  // namespace kvq::cli
