// kvq generate --model M [--tokenizer F] --prompt P -n N [--temperature T] [--seed S] [--threads K]
//              [--k SPEC --v SPEC] [--residual R] [--calib-text FILE --calib-tokens N]
#include <chrono>
#include <cstdio>
#include <memory>

#include "cache_options.hpp"
#include "commands.hpp"
#include "kvq/error.hpp"
#include "kvq/model.hpp"
#include "kvq/perplexity.hpp"
#include "kvq/sampler.hpp"

namespace kvq::cli {
namespace {

struct GenerateOptions {
  std::string model, tokenizer, prompt;
  int steps = 256;
  float temperature = 0.0f;
  uint64_t seed = 1;
  int threads = 0;
  KvCacheSpec cache;
  std::string calib_text;
  size_t calib_tokens = 2048;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void run_generate(const GenerateOptions& o) {
  const LlamaModel model = LlamaModel::load(o.model);
  const auto tokenizer = load_tokenizer(model, o.tokenizer);
  std::vector<int> prompt;
  if (tokenizer->add_bos()) prompt.push_back(tokenizer->bos());
  for (int t : tokenizer->encode(o.prompt)) prompt.push_back(t);
  KVQ_CHECK(!prompt.empty(), "an empty prompt needs a tokenizer with a BOS token");
  KVQ_CHECK(o.steps >= 0, "-n ", o.steps, " must be >= 0");
  KVQ_CHECK(prompt.size() + static_cast<size_t>(o.steps) <= static_cast<size_t>(model.config().max_seq_len),
            "prompt (", prompt.size(), " tokens) + ", o.steps, " new tokens exceed the model's context of ",
            model.config().max_seq_len);
  const int total = static_cast<int>(prompt.size()) + o.steps;

  LlamaRunner runner(model, total, o.threads, o.cache);
  if (runner.needs_calibration()) {
    KVQ_CHECK(!o.calib_text.empty(), "the key/value codecs ", o.cache.label(),
              " need training: give a calibration text (--calib-text FILE --calib-tokens N)");
    runner.calibrate(tokenize_prefix(*tokenizer, read_text_file(o.calib_text), o.calib_tokens));
  }
  Sampler sampler(o.temperature, o.seed);
  std::fputs(tokenizer->decode(prompt).c_str(), stdout);
  std::fflush(stdout);
  // The prompt but its last token as one chunk, then one token at a time.
  const auto prefill_start = std::chrono::steady_clock::now();
  const int prefill = static_cast<int>(prompt.size()) - 1;
  if (prefill > 0) runner.forward_chunk({prompt.data(), static_cast<size_t>(prefill)}, 0, false);
  const double prefill_seconds = seconds_since(prefill_start);
  int token = prompt.back(), generated = 0;
  auto start = std::chrono::steady_clock::now();
  for (int pos = prefill; pos + 1 < total; ++pos) {
    const int next = sampler.sample(runner.forward(token, pos));
    if (generated == 0) start = std::chrono::steady_clock::now();  // time the decode steps after the first
    if (next == tokenizer->eos() || next == tokenizer->bos()) break;
    std::fputs(tokenizer->decode(token, next).c_str(), stdout);
    std::fflush(stdout);
    ++generated;
    token = next;
  }
  const double seconds = seconds_since(start);
  std::printf("\n");
  std::fprintf(stderr,
               "kvq: %zu prompt tokens (%.1f tokens/s), %d generated, %.1f tokens/s (%d threads); cache %s: %zu "
               "bytes\n",
               prompt.size(), prefill > 0 ? prefill / prefill_seconds : 0.0, generated,
               generated > 1 ? (generated - 1) / seconds : 0.0, runner.threads(), o.cache.label().c_str(),
               runner.cache_bytes());
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
  cmd->add_option("--calib-text", o->calib_text, "text whose keys and values train codecs that need training");
  cmd->add_option("--calib-tokens", o->calib_tokens, "calibration tokens taken from the start of --calib-text")
      ->check(CLI::Range(1, 1 << 24))->capture_default_str();
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace kvq::cli
