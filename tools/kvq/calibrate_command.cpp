// kvq calibrate --model M [--tokenizer F] --text FILE --budget-bits B [--tokens N] [--ctx N] [--codecs LIST]
//               [--threads K] --out FILE
// Measures, on the text's last N tokens, the KL divergence against f16 of each candidate codec in each layer for
// keys and for values alone, chooses per layer the key and value codecs of least predicted total KL divergence
// within B stored bits per element, writes them to a calibration file (kvq ppl / generate --calib), then runs the
// chosen cache on the same tokens to compare the measured KL divergence with the prediction.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "cache_options.hpp"
#include "commands.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/calibrate.hpp"
#include "kvq/detail/calibration.hpp"
#include "kvq/error.hpp"

namespace kvq::cli {
namespace {

struct CalibrateOptions {
  std::string model, tokenizer, text, out;
  double budget_bits = 0;
  size_t tokens = 512;
  int ctx = 512;
  int threads = 0;
  // The codecs with fused attention kernels on both the CPU and the GPU, from 16 bits down to 2.
  std::vector<std::string> codecs{"f16", "int8", "int4", "kivi:4", "turbo_mse:4", "turbo_mse:3", "kivi:2",
                                  "turbo_mse:2"};
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void run_calibrate(const CalibrateOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& c : o.codecs) make_codec(c, CodecParams{});  // an unknown codec fails before any work
  const LlamaModel model = LlamaModel::load(o.model);
  const auto tokenizer = load_tokenizer(model, o.tokenizer);
  // The text's tail: kvq ppl scores its start, so calibration and evaluation text stay apart.
  const std::vector<int> tokens = tokenize_tail(*tokenizer, read_text_file(o.text), o.tokens, 0);
  const LlamaConfig& c = model.config();
  KVCacheSpec cache;  // T 64, R 0, seed 0: the defaults of kvq ppl
  PerplexityOptions options;
  options.window = std::min(o.ctx, static_cast<int>(tokens.size()));
  options.threads = o.threads;
  std::fprintf(stderr, "kvq calibrate: %zu tokens in windows of %d, %d layers x 2 roles x %zu codecs\n",
               tokens.size(), options.window, c.n_layers, o.codecs.size());
  const LayerSensitivity s = measure_layer_sensitivity(
      model, *tokenizer, tokens, o.codecs, options, cache, [&](int done, int layers) {
        std::fprintf(stderr, "kvq calibrate: layer %d/%d measured, %.0f s\n", done, layers, seconds_since(start));
      });
  const CodecChoice choice = choose_layer_codecs(s, o.budget_bits, c.head_dim(), cache.block_tokens);

  Calibration calibration;
  calibration.model = model_identity(model);
  calibration.budget_bits = o.budget_bits;
  calibration.predicted_kld = choice.predicted_kld;
  calibration.layers = choice.layers;
  save_calibration(calibration, o.out);

  std::printf("layer  key codec     KLD key    value codec   KLD value\n");
  for (size_t l = 0; l < choice.layers.size(); ++l) {
    const auto kld = [&](int role, const std::string& codec) {
      const auto& v = s.kld[l][static_cast<size_t>(role)];
      return v[static_cast<size_t>(std::find(s.codecs.begin(), s.codecs.end(), codec) - s.codecs.begin())];
    };
    std::printf("%5zu  %-12s  %.6f   %-12s  %.6f\n", l, choice.layers[l].key.c_str(), kld(0, choice.layers[l].key),
                choice.layers[l].value.c_str(), kld(1, choice.layers[l].value));
  }
  std::printf("budget %.3f bits, chosen %.4f bits per element; predicted KLD %.6f (sum of single-layer KLDs)\n",
              o.budget_bits, choice.bits_per_element, choice.predicted_kld);

  // The chosen cache on the same tokens: how far the additive prediction is from the measured KL divergence.
  cache.layer_codecs = choice.layers;
  options.caches = {cache};
  options.reference = f16_cache_like(KVCacheSpec{});
  const PerplexityResult r = measure_perplexity(model, *tokenizer, tokens, options);
  const CacheQuality& q = r.caches.front();
  std::printf("measured on the calibration tokens: KLD %.6f (predicted/measured %.3f), ppl %.4f vs f16 %.4f "
              "(%+.3f%%), top-1 %.4f\n",
              q.kld, q.kld > 0 ? choice.predicted_kld / q.kld : 0.0, q.ppl, r.reference->ppl,
              100.0 * (q.ppl - r.reference->ppl) / r.reference->ppl, q.top1_agree);
  std::printf("wrote %s in %.1f s\n", o.out.c_str(), seconds_since(start));
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* cmd = app.add_subcommand("calibrate", "choose each layer's key and value codec under a bit budget from "
                                                  "measured KL divergences; write a calibration file");
  cmd->add_option("--model", o->model, "checkpoint: .gguf or llama2.c .bin")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file (llama2.c tokenizer.bin); default: the GGUF's own");
  cmd->add_option("--text", o->text, "UTF-8 text file; its last --tokens tokens are measured")->required();
  cmd->add_option("--budget-bits", o->budget_bits,
                  "mean stored bits per key and value element (codec block bytes counted), e.g. 3.5")
      ->required()->check(CLI::Range(0.5, 64.0));
  cmd->add_option("--tokens", o->tokens, "calibration tokens, from the text's end")
      ->check(CLI::Range(2, 1 << 20))->capture_default_str();
  cmd->add_option("--ctx", o->ctx, "tokens per window")->check(CLI::Range(2, 1 << 20))->capture_default_str();
  cmd->add_option("--codecs", o->codecs, "candidate codec specs (each layer and role picks one)")
      ->delimiter(',')->capture_default_str();
  cmd->add_option("--threads", o->threads, "threads (0 = all cores)")
      ->check(CLI::Range(0, 1024))->capture_default_str();
  cmd->add_option("--out", o->out, "the calibration file to write")->required();
  cmd->callback([o] { run_calibrate(*o); });
}

}  // namespace kvq::cli
