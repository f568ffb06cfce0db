// kvq generate --model M [--tokenizer F] --prompt P -n N [--temperature T] [--seed S] [--threads K]
#include <chrono>
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "kvq/error.hpp"
#include "kvq/model.hpp"
#include "kvq/sampler.hpp"

namespace kvq::cli {
namespace {

struct GenerateOptions {
  std::string model, tokenizer, prompt;
  int steps = 256;
  float temperature = 0.0f;
  uint64_t seed = 1;
  int threads = 0;
};

void run_generate(const GenerateOptions& o) {
  const LlamaModel model = LlamaModel::load(o.model);
  const auto tokenizer = load_tokenizer(model, o.tokenizer);
  std::vector<int> prompt;
  if (tokenizer->add_bos()) prompt.push_back(tokenizer->bos());
  for (int t : tokenizer->encode(o.prompt)) prompt.push_back(t);
  KVQ_CHECK(!prompt.empty(), "an empty prompt needs a tokenizer with a BOS token");
  KVQ_CHECK(o.steps >= 0, "-n ", o.steps, " must be >= 0");
  const int total = static_cast<int>(prompt.size()) + o.steps;
  KVQ_CHECK(total <= model.config().max_seq_len, "prompt (", prompt.size(), " tokens) + ", o.steps,
            " new tokens exceed the model's context of ", model.config().max_seq_len);

  LlamaRunner runner(model, total, o.threads);
  Sampler sampler(o.temperature, o.seed);
  std::fputs(tokenizer->decode(prompt).c_str(), stdout);
  std::fflush(stdout);
  int token = prompt[0], generated = 0;
  auto start = std::chrono::steady_clock::now();
  for (int pos = 0; pos + 1 < total; ++pos) {
    const auto logits = runner.forward(token, pos);
    const bool in_prompt = pos + 1 < static_cast<int>(prompt.size());
    const int next = in_prompt ? prompt[pos + 1] : sampler.sample(logits);
    if (!in_prompt) {
      if (generated == 0) start = std::chrono::steady_clock::now();  // time the generation, not the prompt
      if (next == tokenizer->eos() || next == tokenizer->bos()) break;
      std::fputs(tokenizer->decode(token, next).c_str(), stdout);
      std::fflush(stdout);
      ++generated;
    }
    token = next;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("\n");
  std::fprintf(stderr, "kvq: %zu prompt tokens, %d generated, %.1f tokens/s (%d threads)\n", prompt.size(),
               generated, generated > 1 ? (generated - 1) / seconds : 0.0, runner.threads());
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text with a Llama-family model (GGUF or llama2.c)");
  cmd->add_option("--model", o->model, "checkpoint: .gguf or llama2.c .bin")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file (llama2.c tokenizer.bin); default: the GGUF's own");
  cmd->add_option("--prompt", o->prompt, "text to continue")->capture_default_str();
  cmd->add_option("-n,--steps", o->steps, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--seed", o->seed, "random seed for sampling")->capture_default_str();
  cmd->add_option("--threads", o->threads, "threads (0 = all cores)")->capture_default_str();
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace kvq::cli
