// kvq ppl --model M [--tokenizer F] --text FILE --ctx N --max-tokens N [--threads K] [--json]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "kvq/error.hpp"
#include "kvq/perplexity.hpp"

namespace kvq::cli {
namespace {

struct PplOptions {
  std::string model, tokenizer, text;
  int ctx = 256;
  size_t max_tokens = 1000;
  int threads = 0;
  bool json = false;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVQ_CHECK(f.good(), "cannot open ", path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void run_ppl(const PplOptions& o) {
  const LlamaModel model = LlamaModel::load(o.model);
  const auto tokenizer = load_tokenizer(model, o.tokenizer);
  const std::string text = read_file(o.text);
  const std::vector<int> tokens = tokenize_prefix(*tokenizer, text, o.max_tokens);
  PerplexityOptions options;
  options.window = o.ctx;
  options.threads = o.threads;
  Progress bar("ppl");
  options.progress = [&bar](size_t done, size_t total) { bar.update(done, total); };
  const auto start = std::chrono::steady_clock::now();
  const PerplexityResult r = measure_perplexity(model, *tokenizer, tokens, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (o.json) {
    const nlohmann::ordered_json j = {{"model", o.model}, {"ctx", o.ctx},           {"tokens", r.tokens},
                                      {"mean_nll", r.mean_nll}, {"ppl", r.ppl}, {"seconds", seconds}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model %s  ctx %d\n  tokens    %zu\n  mean_nll  %.6f\n  ppl       %.4f\n  %.1f tokens/s\n",
                o.model.c_str(), o.ctx, r.tokens, r.mean_nll, r.ppl, static_cast<double>(r.tokens) / seconds);
  }
}

}  // namespace

void add_ppl_command(CLI::App& app) {
  auto o = std::make_shared<PplOptions>();
  CLI::App* cmd = app.add_subcommand("ppl", "perplexity of a model on a text, in windows evaluated from scratch");
  cmd->add_option("--model", o->model, "checkpoint: .gguf or llama2.c .bin")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer file (llama2.c tokenizer.bin); default: the GGUF's own");
  cmd->add_option("--text", o->text, "UTF-8 text file")->required();
  cmd->add_option("--ctx", o->ctx, "tokens per window")->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "score the first N tokens of the text")->capture_default_str();
  cmd->add_option("--threads", o->threads, "threads (0 = all cores)")->capture_default_str();
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->callback([o] { run_ppl(*o); });
}

}  // namespace kvq::cli
