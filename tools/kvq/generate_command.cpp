// kvq generate --model M [--tokenizer F] --prompt P -n N [--temperature T] [--seed S] [--threads K]
//              [--k SPEC --v SPEC] [--residual R] [--calib FILE] [--calib-text FILE --calib-tokens N]
#include <cstdio>
#include <memory>

#include "cache_options.hpp"
#include "commands.hpp"
#include "kvq/detail/perplexity.hpp"
#include "kvq/error.hpp"
#include "kvq/model.hpp"
#include "model_file.hpp"

namespace kvq::cli {
namespace {

struct GenerateOptions {
  std::string model, tokenizer, prompt;
  int steps = 256;
  float temperature = 0.0f;
  uint64_t seed = 1;
  int threads = 0;
  KVCacheSpec cache;
  std::string calib, calib_text;
  size_t calib_tokens = 2048;
};

void run_generate(const GenerateOptions& o) {
  const LlamaModel model = load_model(o.model, "kvq generate");
  const auto tokenizer = load_tokenizer(model, o.tokenizer);
  std::vector<int> prompt;
  if (tokenizer->add_bos()) prompt.push_back(tokenizer->bos());
  for (int t : tokenizer->encode(o.prompt)) prompt.push_back(t);
  KVQ_CHECK(!prompt.empty(), "an empty prompt needs a tokenizer with a BOS token");
  KVQ_CHECK(prompt.size() + static_cast<size_t>(o.steps) <= static_cast<size_t>(model.config().max_seq_len),
            "prompt (", prompt.size(), " tokens) + ", o.steps, " new tokens exceed the model's context of ",
            model.config().max_seq_len);
  const KVCacheSpec cache = o.calib.empty() ? o.cache : calibrated_cache(o.calib, model, o.cache).spec;
  LlamaRunner runner(model, static_cast<int>(prompt.size()) + o.steps, o.threads, cache);
  if (runner.needs_calibration()) {
    KVQ_CHECK(!o.calib_text.empty(), "the key/value codecs ", cache.label(),
              " need training: give a calibration text (--calib-text FILE --calib-tokens N)");
    runner.calibrate(tokenize_prefix(*tokenizer, read_text_file(o.calib_text), o.calib_tokens));
  }
  Sampler sampler(o.temperature, o.seed);
  std::fputs(tokenizer->decode(prompt).c_str(), stdout);
  std::fflush(stdout);
  const Generation g = generate(runner, *tokenizer, prompt, o.steps, sampler, [&](int previous, int next) {
    std::fputs(tokenizer->decode(previous, next).c_str(), stdout);
    std::fflush(stdout);
  });
  std::printf("\n");
  std::fprintf(stderr,
               "kvq: %zu prompt tokens (%.1f tokens/s), %zu generated, %.1f tokens/s (%d threads); cache %s: %zu "
               "bytes\n",
               prompt.size(), g.prefill_tokens_per_second(), g.tokens.size(), g.decode_tokens_per_second(),
               runner.threads(), cache.label().c_str(), runner.cache_bytes());
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text with a Llama-family model (GGUF or llama2.c)");
  cmd->add_option("--model", o->model, "checkpoint: .gguf or llama2.c .bin")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file (llama2.c tokenizer.bin); default: the GGUF's own");
  cmd->add_option("--prompt", o->prompt, "text to continue")->capture_default_str();
  cmd->add_option("-n,--steps", o->steps, "tokens to generate")->check(CLI::Range(0, 1 << 20))->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0 = greedy")->check(CLI::Range(0.0, 1000.0))->capture_default_str();
  cmd->add_option("--seed", o->seed, "random seed for sampling")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--threads", o->threads, "threads (0 = all cores)")
      ->check(CLI::Range(0, 1024))->capture_default_str();
  add_cache_options(*cmd, o->cache);
  cmd->add_option("--calib", o->calib, "a calibration file (kvq calibrate --out): its per-layer codecs");
  cmd->add_option("--calib-text", o->calib_text, "text whose keys and values train codecs that need training");
  cmd->add_option("--calib-tokens", o->calib_tokens, "calibration tokens taken from the start of --calib-text")
      ->check(CLI::Range(1, 1 << 24))->capture_default_str();
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace kvq::cli
