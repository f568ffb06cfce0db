// kvq demo: the main job. Until the model runner lands it is a codec showcase on synthetic data: for every codec,
// the stored bits per element, the compression against an fp16 cache, and the reconstruction error on unit
// vectors and on key-like vectors with outlier channels.
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "commands.hpp"
#include "kvq/codec.hpp"
#include "kvq/synthetic.hpp"

namespace kvq::cli {
namespace {

// Relative reconstruction error sum ||x - x^||^2 / sum ||x||^2 of n vectors encoded in blocks.
double relative_error(const Codec& codec, const std::vector<float>& x, size_t n) {
  const int d = codec.dim(), T = codec.block_tokens();
  std::vector<uint8_t> block(codec.block_bytes());
  std::vector<float> xhat(static_cast<size_t>(T) * d);
  double err = 0, ref = 0;
  for (size_t start = 0; start < n; start += T) {
    const int m = static_cast<int>(std::min<size_t>(T, n - start));
    codec.encode(x.data() + start * d, m, block.data());
    codec.decode(block.data(), m, xhat.data());
    for (size_t i = 0; i < static_cast<size_t>(m) * d; ++i) {
      const double v = x[start * d + i], e = v - xhat[i];
      err += e * e;
      ref += v * v;
    }
  }
  return err / ref;
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto dim = std::make_shared<int>(128);
  CLI::App* cmd = app.add_subcommand("demo", "showcase every codec: bits, compression and error");
  cmd->add_option("--dim", *dim, "head dimension")->capture_default_str();
  cmd->add_flag("--json", *json, "print a JSON array");
  cmd->callback([json, dim] {
    const int d = *dim;
    constexpr size_t kVectors = 4096;
    const auto unit = unit_vectors(kVectors, d, 1);
    const auto profile = key_like_profile(d, 2);
    const auto keys = sample_profile(profile, kVectors, 3);
    const auto train = sample_profile(profile, 4 * kVectors, 4);
    const auto train_unit = unit_vectors(4 * kVectors, d, 5);
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    if (!*json)
      std::printf("kvq codec showcase, d=%d, %zu vectors, blocks of 64 tokens\n\n%-16s %8s %8s %12s %14s\n", d,
                  kVectors, "codec", "bits", "vs f16", "unit mse", "outlier relerr");
    const auto specs = codec_test_specs();
    Progress bar("demo");
    for (size_t s = 0; s < specs.size(); ++s) {
      bar.update(s, specs.size());
      CodecParams params{d, 64, 7, Role::key};
      auto on_unit = make_codec(specs[s], params);
      auto on_keys = make_codec(specs[s], params);
      on_unit->train(train_unit.data(), 4 * kVectors);
      on_keys->train(train.data(), 4 * kVectors);
      const double bits = on_unit->bits_per_element();
      const double mse = relative_error(*on_unit, unit, kVectors);  // unit vectors: relative error = mse
      const double rel = relative_error(*on_keys, keys, kVectors);
      rows.push_back({{"codec", specs[s]}, {"bits_per_element", bits}, {"compression_vs_f16", 16.0 / bits},
                      {"unit_mse", mse}, {"outlier_relative_error", rel}});
      if (!*json) std::printf("%-16s %8.3f %7.2fx %12.6f %14.6f\n", specs[s].c_str(), bits, 16.0 / bits, mse, rel);
    }
    if (*json) std::printf("%s\n", rows.dump(2).c_str());
  });
}

}  // namespace kvq::cli
