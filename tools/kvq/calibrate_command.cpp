// kvq calibrate --model M [--tokenizer F] --text FILE --budget-bits B[,B...] [--tokens N] [--ctx N] [--codecs LIST]
//               [--anchor SPEC] [--plain-keys] [--threads K] --out FILE
// Measures, on the text's last N tokens, the KL divergence against f16 of each candidate codec in each layer for
// keys (as they are, and centered unless --plain-keys) and for values alone, chooses per layer the key and value
// codecs and the key centering of least predicted total KL divergence
// within B stored bits per element, writes them to a calibration file (kvq ppl / generate --calib), then runs the
// chosen cache on the same tokens to compare the measured KL divergence with the prediction. The measurement does
// not depend on B: several budgets share it, each written to FILE with "{}" replaced by the budget. Candidates that
// need training (vecinfer) learn each layer's codebook from that layer's f16 keys or values of the same tokens; the
// file keeps the chosen ones' states, so the calibrated cache needs no training text.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "cache_options.hpp"
#include "commands.hpp"
#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/calibrate.hpp"
#include "kvq/detail/calibration.hpp"
#include "kvq/error.hpp"
#include "model_file.hpp"

namespace kvq::cli {
namespace {

struct CalibrateOptions {
  std::string model, tokenizer, text, out;
  std::vector<double> budget_bits;
  size_t tokens = 512;
  int ctx = 512;
  int threads = 0;
  std::string anchor;  // empty: every figure measured
  bool plain_keys = false;  // measure no centered keys
  int sink_tokens = 0;      // the first tokens of each window kept in f16, measured and charged to the budget
  int budget_ctx = 0;       // the sequence length key offsets and sinks are charged over; 0: ctx
  int block_tokens = 64;    // T of the cache measured and budgeted
  // The codecs with fused attention kernels on both the CPU and the GPU, from 16 bits down to 2.
  std::vector<std::string> codecs{"f16",    "int8",        "int4",   "kivi:4",     "turbo_mse:4",
                                  "kivi:3", "turbo_mse:3", "kivi:2", "turbo_mse:2"};
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// --out, with "{}" replaced by the budget where several budgets are asked for.
std::string output_path(const std::string& out, double budget, size_t budgets) {
  const size_t at = out.find("{}");
  if (budgets == 1 && at == std::string::npos) return out;
  char b[32];
  std::snprintf(b, sizeof(b), "%g", budget);
  return std::string(out).replace(at, 2, b);
}

void print_sensitivity(const LayerSensitivity& s, const std::string& anchor) {
  std::printf("KL divergence against f16 with one layer's keys (k) or values (v) in each codec%s\nlayer",
              anchor.empty() ? "" : (", predicted from " + anchor + "'s by local error").c_str());
  for (const std::string& c : s.codecs) std::printf(" %12s", c.c_str());
  std::printf("\n");
  const auto row = [](size_t l, char what, const std::vector<double>& klds) {
    std::printf("%4zu%c", l, what);
    for (double kld : klds) std::isnan(kld) ? std::printf(" %12s", "-") : std::printf(" %12.6f", kld);
    std::printf("\n");
  };
  for (size_t l = 0; l < s.kld.size(); ++l) {
    row(l, 'k', s.kld[l][0]);
    if (s.measured_centered()) row(l, 'c', s.centered_kld[l]);
    row(l, 'v', s.kld[l][1]);
  }
  if (s.measured_centered()) std::printf("(c: the layer's keys centered)\n");
}

void print_choice(const LayerSensitivity& s, const CodecChoice& choice, double budget) {
  std::printf("layer  key codec          KLD key    value codec   KLD value\n");
  std::string centered;
  for (size_t l = 0; l < choice.layers.size(); ++l) {
    const LayerCodecs& c = choice.layers[l];
    const auto at = [&](const std::string& codec) {
      return static_cast<size_t>(std::find(s.codecs.begin(), s.codecs.end(), codec) - s.codecs.begin());
    };
    const double key_kld = c.center_keys ? s.centered_kld[l][at(c.key)] : s.kld[l][0][at(c.key)];
    std::printf("%5zu  %-17s  %.6f   %-12s  %.6f\n", l, (c.key + (c.center_keys ? " (c)" : "")).c_str(), key_kld,
                c.value.c_str(), s.kld[l][1][at(c.value)]);
    if (c.center_keys) centered += " " + std::to_string(l);
  }
  std::printf("budget %.3f bits, chosen %.4f bits per element; predicted KLD %.6f (sum of single-layer KLDs)\n",
              budget, choice.bits_per_element, choice.predicted_kld);
  if (s.measured_centered())
    std::printf("layers with centered keys (c):%s\n", centered.empty() ? " none" : centered.c_str());
}

// --codecs is split at commas; a piece holding '=' is an option of the spec before it ("int4,learn=16").
std::vector<std::string> candidate_specs(const std::vector<std::string>& pieces) {
  std::vector<std::string> specs;
  for (const std::string& piece : pieces) {
    KVQ_CHECK(piece.find('=') == std::string::npos || !specs.empty(), "--codecs: option '", piece,
              "' before any codec");
    if (piece.find('=') != std::string::npos)
      specs.back() += "," + piece;
    else
      specs.push_back(piece);
  }
  return specs;
}

void run_calibrate(const CalibrateOptions& o) {
  KVQ_CHECK(o.budget_bits.size() == 1 || o.out.find("{}") != std::string::npos, "--out ", o.out,
            " must hold '{}' (replaced by each budget) when several budgets are asked for");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> codecs = candidate_specs(o.codecs);
  for (const std::string& c : codecs) make_codec(c, CodecParams{});  // an unknown codec fails before any work
  const LlamaModel model = load_model(o.model, "kvq calibrate");
  const auto tokenizer = load_tokenizer(model, o.tokenizer);
  // The text's tail: kvq ppl scores its start, so calibration and evaluation text stay apart.
  const std::vector<int> tokens = tokenize_tail(*tokenizer, read_text_file(o.text), o.tokens, 0);
  const LlamaConfig& c = model.config();
  KVCacheSpec cache;  // R 0, seed 0: the defaults of kvq ppl
  cache.block_tokens = o.block_tokens;
  cache.sink_tokens = o.sink_tokens;
  PerplexityOptions options;
  options.window = std::min(o.ctx, static_cast<int>(tokens.size()));
  options.threads = o.threads;
  // fp32 activations into the products: with 8-bit ones, any change in a layer flips some activation roundings
  // downstream, a KLD floor (~0.0013 on SmolLM2 at ctx 128, turbo_mse:3 keys in one layer: 0.0001-0.001 with fp32)
  // that every single-layer figure carries and the sum over 60 of them multiplies.
  options.product_input = ProductInput::f32;
  std::fprintf(stderr, "kvq calibrate: %zu tokens in windows of %d, %d layers x 2 roles x %zu codecs%s\n",
               tokens.size(), options.window, c.n_layers, codecs.size(),
               o.plain_keys ? "" : ", and keys centered");
  const KeyCandidates keys = o.plain_keys ? KeyCandidates::plain : KeyCandidates::plain_and_centered;
  const LayerSensitivity s = measure_layer_sensitivity(
      model, *tokenizer, tokens, codecs, options, cache, keys, o.anchor, [&](int done, int layers) {
        if (done == 0)
          std::fprintf(stderr, "kvq calibrate: f16 reference run, %.0f s\n", seconds_since(start));
        else
          std::fprintf(stderr, "kvq calibrate: layer %d/%d measured, %.0f s\n", done, layers, seconds_since(start));
      });
  print_sensitivity(s, o.anchor);
  std::vector<CodecChoice> choices;
  for (double budget : o.budget_bits) {
    const CodecChoice& choice =
        choices.emplace_back(choose_layer_codecs(s, budget, c.head_dim(), cache.block_tokens, o.budget_ctx));
    Calibration calibration;
    calibration.model = model_identity(model);
    calibration.budget_bits = budget;
    calibration.block_tokens = cache.block_tokens;
    calibration.calibration_tokens = s.tokens;
    calibration.sink_tokens = s.sink_tokens;
    calibration.predicted_kld = choice.predicted_kld;
    calibration.layers = choice.layers;
    save_calibration(calibration, output_path(o.out, budget, o.budget_bits.size()));
    print_choice(s, choice, budget);
  }

  // The chosen caches on the same tokens, in one lockstep pass: how far the additive prediction is from the
  // measured KL divergence.
  options.caches.clear();
  for (const CodecChoice& choice : choices) {
    cache.layer_codecs = choice.layers;
    options.caches.push_back(cache);
  }
  options.reference = f16_cache_like(KVCacheSpec{});  // without sinks: they are f16 anyway
  std::fprintf(stderr, "kvq calibrate: measuring the chosen caches, %.0f s\n", seconds_since(start));
  const PerplexityResult r = measure_perplexity(model, *tokenizer, tokens, options);
  for (size_t i = 0; i < choices.size(); ++i) {
    const CacheQuality& q = r.caches[i];
    std::printf("budget %.3f measured on the calibration tokens: KLD %.6f (predicted/measured %.3f), ppl %.4f vs "
                "f16 %.4f (%+.3f%%), top-1 %.4f; wrote %s\n",
                o.budget_bits[i], q.kld, q.kld > 0 ? choices[i].predicted_kld / q.kld : 0.0, q.ppl,
                r.reference->ppl, 100.0 * (q.ppl - r.reference->ppl) / r.reference->ppl, q.top1_agree,
                output_path(o.out, o.budget_bits[i], o.budget_bits.size()).c_str());
  }
  std::printf("calibrated in %.1f s\n", seconds_since(start));
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
                  "mean stored bits per key and value element (codec block bytes counted), e.g. 3.5; several "
                  "(3,3.5,4) share one measurement")
      ->required()->delimiter(',')->check(CLI::Range(0.5, 64.0));
  cmd->add_option("--tokens", o->tokens, "calibration tokens, from the text's end")
      ->check(CLI::Range(2, 1 << 20))->capture_default_str();
  cmd->add_option("--ctx", o->ctx, "tokens per window")->check(CLI::Range(2, 1 << 20))->capture_default_str();
  cmd->add_option("--codecs", o->codecs,
                  "candidate codec specs (each layer and role picks one), a piece with '=' an option of the one "
                  "before it (int4,learn=16); those that need training (vecinfer:c/s, int4/int8 with learn=K) are "
                  "trained per layer and role on the calibration tokens' keys and values")
      ->delimiter(',')->capture_default_str();
  cmd->add_option("--anchor", o->anchor,
                  "measure only this candidate's KL divergences to the logits and predict the others' from their "
                  "error at the layer's output (faster; the prediction is reported against the chosen caches' "
                  "measured KLD); default: measure every candidate");
  cmd->add_flag("--plain-keys", o->plain_keys,
                "measure and choose keys as they are only; default: each quantizing key codec also with the "
                "layer's keys centered (stored minus their first-page mean, as --center-keys does in every layer), "
                "its offsets' bytes counted in the budget over sequences of --budget-ctx tokens");
  cmd->add_option("--sink", o->sink_tokens,
                  "the first N tokens of each window kept in f16, never quantized: every figure is measured with "
                  "them, and their 16 bits are charged to the budget over sequences of --budget-ctx tokens (N (16 - "
                  "b) / ctx bits per element more); kvq ppl --calib keeps them too")
      ->check(CLI::Range(0, kMaxSinkTokens))->capture_default_str();
  cmd->add_option("--budget-ctx", o->budget_ctx,
                  "the sequence length the budget counts the key offsets' and sink tokens' bytes over (the context "
                  "the cache will serve); default: --ctx")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  cmd->add_option("--block-tokens", o->block_tokens,
                  "tokens per cache page, 64 or 128: per-channel codecs (kivi keys) store their ranges once per page, "
                  "so 128 costs them fewer bits; kvq ppl --calib takes the same --block-tokens")
      ->check(CLI::IsMember({64, 128}))->capture_default_str();
  cmd->add_option("--threads", o->threads, "threads (0 = all cores)")
      ->check(CLI::Range(0, 1024))->capture_default_str();
  cmd->add_option("--out", o->out, "the calibration file to write; '{}' in it is replaced by the budget")
      ->required();
  cmd->callback([o] { run_calibrate(*o); });
}

}  // namespace kvq::cli
