// kvq attention-error --k SPEC --v SPEC [--k SPEC --v SPEC ...] --dim D --ctx N --seed S [--device cpu|cuda] [--exact]
//   [--json]
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "exact_attention_option.hpp"
#include "kvq/detail/attention_error.hpp"
#include "kvq/error.hpp"

namespace kvq::cli {

void add_attention_error_command(CLI::App& app) {
  auto opts = std::make_shared<AttentionErrorOptions>();
  auto keys = std::make_shared<std::vector<std::string>>();
  auto values = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "attention-error", "decode attention over a compressed cache against fp32 attention, on outlier-heavy data");
  cmd->add_option("--k", *keys, "key codec spec (repeatable, paired with --v in order)")->required();
  cmd->add_option("--v", *values, "value codec spec (repeatable)")->required();
  cmd->add_option("--dim", opts->dim, "head dimension")->check(CLI::Range(16, 512))->capture_default_str();
  cmd->add_option("--ctx", opts->ctx, "tokens in the cache")->check(CLI::Range(1, 1 << 22))->capture_default_str();
  cmd->add_option("--q-heads", opts->q_heads, "query heads")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--kv-heads", opts->kv_heads, "kv heads")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--queries", opts->queries, "decode calls with fresh queries")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--logit-std", opts->logit_std, "spread of each query's logits over the context")
      ->check(CLI::Range(0.0, 1000.0))->capture_default_str();
  cmd->add_option("--seed", opts->seed, "random seed")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--device", opts->device, "cpu, or cuda / cuda:N (the CUDA kernels on a copy of the cache)")
      ->capture_default_str();
  add_exact_attention_option(*cmd);
  cmd->add_flag("--json", *json, "print one JSON object per pair");
  cmd->callback([opts, keys, values, json] {
    KVQ_CHECK(keys->size() == values->size(), "give as many --k as --v (", keys->size(), " and ", values->size(), ")");
    if (!*json)
      std::printf("%-16s %-16s %7s %7s %12s %12s %12s %12s %12s %12s  %s\n", "keys", "values", "bits k", "bits v",
                  "rel err", "max rel err", "weights TV", "codec err", "kernel err", "max kern err", "kernel");
    for (size_t i = 0; i < keys->size(); ++i) {
      opts->key_codec = (*keys)[i];
      opts->value_codec = (*values)[i];
      const AttentionErrorResult r = measure_attention_error(*opts);
      if (*json) {
        const nlohmann::ordered_json j = {{"k", r.key_codec},     {"v", r.value_codec},
                                          {"dim", opts->dim},     {"ctx", opts->ctx},
                                          {"bits_k", r.bits_k},   {"bits_v", r.bits_v},
                                          {"rel_err_mean", r.rel_err_mean}, {"rel_err_max", r.rel_err_max},
                                          {"weights_tv", r.weights_tv},
                                          {"codec_err_mean", r.codec_err_mean},
                                          {"kernel_err_mean", r.kernel_err_mean},
                                          {"kernel_err_max", r.kernel_err_max},
                                          {"kernel", r.kernel}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%-16s %-16s %7.3f %7.3f %12.3e %12.3e %12.3e %12.3e %12.3e %12.3e  %s\n", r.key_codec.c_str(),
                    r.value_codec.c_str(), r.bits_k, r.bits_v, r.rel_err_mean, r.rel_err_max, r.weights_tv,
                    r.codec_err_mean, r.kernel_err_mean, r.kernel_err_max, r.kernel.c_str());
      }
      std::fflush(stdout);
    }
  });
}

}  // namespace kvq::cli
