// kvq distortion --codec SPEC --dim D --n N --seed S [--json]
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "kvq/detail/distortion.hpp"
#include "progress.hpp"

namespace kvq::cli {

void add_distortion_command(CLI::App& app) {
  auto opts = std::make_shared<DistortionOptions>();
  auto json = std::make_shared<bool>(false);
  auto role = std::make_shared<std::string>("key");
  CLI::App* cmd = app.add_subcommand("distortion", "MSE and inner-product error of a codec on random unit vectors");
  cmd->add_option("--codec", opts->codec, "codec spec, e.g. turbo_mse:3, int4:16, vecinfer:10/4")->required();
  cmd->add_option("--dim", opts->dim, "vector dimension")->check(CLI::Range(16, 512))->capture_default_str();
  cmd->add_option("--n", opts->n, "vectors for the MSE and inner-product trials")
      ->check(CLI::Range(1, 1 << 24))->capture_default_str();
  cmd->add_option("--seed", opts->seed, "random seed")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--block", opts->block_tokens, "tokens per encoded block")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--role", *role, "key or value (codecs such as kivi lay them out differently)")
      ->check(CLI::IsMember({"key", "value"}))->capture_default_str();
  cmd->add_flag("--json", *json, "print one JSON object");
  cmd->callback([opts, json, role] {
    opts->role = *role == "value" ? Role::value : Role::key;
    Progress bar("distortion " + opts->codec);
    opts->progress = [&bar](size_t done, size_t total) { bar.update(done, total); };
    const DistortionResult r = measure_distortion(*opts);
    opts->progress = nullptr;
    if (*json) {
      const nlohmann::ordered_json j = {{"codec", r.codec},
                                        {"dim", r.dim},
                                        {"n", r.n},
                                        {"bits_per_element", r.bits_per_element},
                                        {"mse", r.mse},
                                        {"ip_bias", r.ip_bias},
                                        {"ip_bias_stderr", r.ip_bias_stderr},
                                        {"ip_mse_d", r.ip_mse_d}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("codec %s  d=%d  n=%zu\n  bits/element %.4f\n  mse          %.6f\n"
                  "  ip_bias      %+.6f (stderr %.6f)\n  ip_mse_d     %.6f\n",
                  r.codec.c_str(), r.dim, r.n, r.bits_per_element, r.mse, r.ip_bias, r.ip_bias_stderr, r.ip_mse_d);
    }
  });
}

}  // namespace kvq::cli
