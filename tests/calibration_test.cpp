// kvq calibrate's parts: the knapsack against brute force, per-layer codecs in the runner's cache, the measured
// sensitivities and the choice under a budget, and the calibration file's round trip and its refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/crc32c.hpp"
#include "expect_error.hpp"
#include "kvq/detail/calibrate.hpp"
#include "kvq/detail/calibration.hpp"
#include "kvq/detail/codec_allocation.hpp"
#include "kvq/detail/random.hpp"
#include "synthetic_llama.hpp"
#include "temp_file.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::SyntheticLlama;

// Every combination of one item per group: the least loss within the budget (infinity when none fits).
double brute_force(const std::vector<std::vector<AllocationItem>>& groups, size_t budget, size_t g = 0,
                   size_t cost = 0) {
  if (g == groups.size()) return cost <= budget ? 0.0 : std::numeric_limits<double>::infinity();
  double best = std::numeric_limits<double>::infinity();
  for (const AllocationItem& item : groups[g])
    best = std::min(best, item.loss + brute_force(groups, budget, g + 1, cost + item.cost));
  return best;
}

TEST(CodecAllocation, MatchesBruteForce) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n_groups = 1 + rng.next_u64() % 5;
    std::vector<std::vector<AllocationItem>> groups(n_groups);
    size_t cheapest = 0, dearest = 0;
    for (auto& g : groups) {
      const size_t n_items = 1 + rng.next_u64() % 4;
      size_t lo = SIZE_MAX, hi = 0;
      for (size_t i = 0; i < n_items; ++i) {
        g.push_back({16 * (1 + rng.next_u64() % 8), rng.uniform()});
        lo = std::min(lo, g.back().cost), hi = std::max(hi, g.back().cost);
      }
      cheapest += lo, dearest += hi;
    }
    const size_t budget = cheapest + rng.next_u64() % (dearest - cheapest + 17);
    const std::vector<size_t> chosen = choose_min_loss(groups, budget);
    ASSERT_EQ(chosen.size(), n_groups);
    double loss = 0;
    size_t cost = 0;
    for (size_t g = 0; g < n_groups; ++g) loss += groups[g][chosen[g]].loss, cost += groups[g][chosen[g]].cost;
    EXPECT_LE(cost, budget);
    EXPECT_NEAR(loss, brute_force(groups, budget), 1e-12) << "trial " << trial;
  }
  test::expect_error([] { choose_min_loss({{{32, 0.0}}, {{16, 1.0}}}, 40); }, "below the cheapest");
}

// measure_perplexity of the synthetic model on 160 random tokens, one window, the caches against f16.
PerplexityResult synthetic_perplexity(uint64_t seed, std::vector<KVCacheSpec> caches) {
  const SyntheticLlama m(seed);
  const test::ByteTokenizer tok;
  Rng rng(seed + 1);
  const std::vector<int> tokens = test::random_tokens(rng, 160);
  PerplexityOptions o;
  o.window = 160, o.threads = 2;
  o.reference = KVCacheSpec{"f16", "f16"};
  o.caches = std::move(caches);
  return measure_perplexity(m.model(), tok, tokens, o);
}

// Per-layer codecs that are the same in every layer are the uniform cache: the same seeds, the same figures.
TEST(PerLayerCodecs, SameInEveryLayerIsTheUniformCache) {
  KVQ_FRESH_SEED();
  KVCacheSpec per_layer;
  per_layer.layer_codecs.assign(SyntheticLlama::kLayers, LayerCodecs{"int4", "turbo_mse:3"});
  KVCacheSpec mixed;
  mixed.layer_codecs = {LayerCodecs{"int8", "kivi:2"}, LayerCodecs{"int4", "f16"}};
  const PerplexityResult r = synthetic_perplexity(seed, {KVCacheSpec{"int4", "turbo_mse:3"}, per_layer, mixed});
  EXPECT_EQ(r.caches[1].kld, r.caches[0].kld);
  EXPECT_EQ(r.caches[1].ppl, r.caches[0].ppl);
  EXPECT_GT(r.caches[2].kld, 0.0);
  EXPECT_DOUBLE_EQ(r.caches[2].bits_per_element_k, (8.5 + 4.5) / 2);
  EXPECT_DOUBLE_EQ(r.caches[2].bits_per_element_v, (3.0 + 16.0) / 2);
  EXPECT_EQ(mixed.label(), "per layer: int8/kivi:2 x1, int4/f16 x1");
}

// Centering chosen per layer: in every layer it is the uniformly centered cache (--center-keys), and a layer
// centered alone is that layer of the centered cache and the others of the plain one.
TEST(PerLayerCodecs, CenteringInEveryLayerIsTheCenteredCache) {
  KVQ_FRESH_SEED();
  KVCacheSpec uniform{"int4", "turbo_mse:3"};
  uniform.center_keys = true;
  KVCacheSpec per_layer;
  per_layer.layer_codecs.assign(SyntheticLlama::kLayers, LayerCodecs{"int4", "turbo_mse:3", true});
  KVCacheSpec first_only = per_layer;
  first_only.layer_codecs.back().center_keys = false;
  KVCacheSpec every_by_spec = first_only;  // the spec's center_keys centers every layer
  every_by_spec.center_keys = true;
  const PerplexityResult r =
      synthetic_perplexity(seed, {uniform, per_layer, first_only, every_by_spec, KVCacheSpec{"int4", "turbo_mse:3"}});
  EXPECT_EQ(r.caches[1].kld, r.caches[0].kld);
  EXPECT_EQ(r.caches[3].kld, r.caches[0].kld);
  EXPECT_NE(r.caches[2].kld, r.caches[0].kld);
  EXPECT_NE(r.caches[2].kld, r.caches[4].kld);
  EXPECT_EQ(r.caches[1].cache_bytes, r.caches[0].cache_bytes);  // the key offsets counted alike
  EXPECT_LT(r.caches[2].cache_bytes, r.caches[1].cache_bytes);  // one layer's offsets fewer
  EXPECT_EQ(first_only.label(), "per layer: centered int4/turbo_mse:3 x1, int4/turbo_mse:3 x1");
}

// A runner started at layer l on the reference's residual stream computes, bit for bit, what the whole forward of
// the same cache computes, wherever the layers before l are the reference's: every product, norm and attention
// call sees the same floats in the same order.
TEST(ForwardFromLayer, EqualsTheWholeForwardBitForBit) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  Rng rng(seed + 1);
  const std::vector<int> tokens = test::random_tokens(rng, 150);
  const int n_layers = SyntheticLlama::kLayers, dim = SyntheticLlama::kDim, chunk = 48;
  const int context = static_cast<int>(tokens.size());
  LlamaRunner reference(m.model(), context, 2, KVCacheSpec{"f16", "f16"});
  for (int l = 0; l <= n_layers; ++l) {
    KVCacheSpec spec;  // f16 before layer l, int4 keys and turbo_mse:2 values from l on
    for (int i = 0; i < n_layers; ++i)
      spec.layer_codecs.push_back(i < l ? LayerCodecs{"f16", "f16"} : LayerCodecs{"int4", "turbo_mse:2"});
    LlamaRunner whole(m.model(), context, 2, spec), from(m.model(), context, 2, spec);
    reference.reset();
    for (int pos = 0; pos < context; pos += chunk) {
      const std::span<const int> part(tokens.data() + pos, std::min<size_t>(chunk, tokens.size() - pos));
      const int n = static_cast<int>(part.size());
      std::vector<float> residuals(reference.residual_floats(n));
      const std::span<const float> ref_logits = reference.forward_chunk_residuals(part, pos, residuals);
      const std::vector<float> ref(ref_logits.begin(), ref_logits.end());
      const std::span<const float> whole_logits = whole.forward_chunk(part, pos);
      const std::vector<float> expected(whole_logits.begin(), whole_logits.end());
      const std::span<const float> x(residuals.data() + static_cast<size_t>(l) * n * dim, static_cast<size_t>(n) * dim);
      const std::span<const float> got = from.forward_chunk_from(l, x, pos);
      ASSERT_EQ(got.size(), expected.size());
      EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0) << "layer " << l;
      if (l == n_layers) {  // past the last layer both are the reference's logits
        EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0);
      }
    }
  }
  const std::vector<float> x(static_cast<size_t>(dim));
  test::expect_error([&] { reference.forward_chunk_from(n_layers + 1, x, 0); }, "forward from layer");
  test::expect_error([&] { reference.forward_chunk_from(0, std::span(x).first(dim - 1), 0); }, "not whole positions");
  reference.reset();
  test::expect_error([&] { reference.forward_chunk_from(1, x, 3); }, "forward at position 3");
}

// The measured sensitivities equal a whole measure_perplexity run of each single-layer cache against f16 (the slow
// path, every layer of every cache run), so kvq calibrate chooses what that path would.
TEST(Calibrate, SensitivitiesEqualWholePerplexityRuns) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  const test::ByteTokenizer tok;
  Rng rng(seed + 1);
  const std::vector<int> tokens = test::random_tokens(rng, 200);
  PerplexityOptions o;
  o.window = 96, o.chunk = 40, o.score_from = 10, o.threads = 2;
  const std::vector<std::string> codecs{"f16", "int4", "turbo_mse:2"};
  const LayerSensitivity s =
      measure_layer_sensitivity(m.model(), tok, tokens, codecs, o, KVCacheSpec{}, KeyCandidates::plain_and_centered);
  ASSERT_TRUE(s.measured_centered());
  o.reference = KVCacheSpec{"f16", "f16"};
  for (int l = 0; l < SyntheticLlama::kLayers; ++l) {
    EXPECT_TRUE(std::isnan(s.centered_kld[l][0])) << "f16 keys are not centered";
    o.caches.clear();
    for (size_t c = 1; c < codecs.size(); ++c)
      for (int role = 0; role < 3; ++role) {  // keys, values, centered keys
        KVCacheSpec spec;
        spec.layer_codecs.assign(SyntheticLlama::kLayers, LayerCodecs{"f16", "f16"});
        (role == 1 ? spec.layer_codecs[l].value : spec.layer_codecs[l].key) = codecs[c];
        spec.layer_codecs[l].center_keys = role == 2;
        o.caches.push_back(spec);
      }
    const PerplexityResult r = measure_perplexity(m.model(), tok, tokens, o);
    EXPECT_EQ(s.tokens, r.tokens);
    for (size_t c = 1, i = 0; c < codecs.size(); ++c, i += 3) {
      const std::string what = "layer " + std::to_string(l) + " " + codecs[c];
      EXPECT_EQ(s.kld[l][0][c], r.caches[i].kld) << what << " keys";
      EXPECT_EQ(s.kld[l][1][c], r.caches[i + 1].kld) << what << " values";
      EXPECT_EQ(s.centered_kld[l][c], r.caches[i + 2].kld) << what << " centered keys";
      EXPECT_NE(s.centered_kld[l][c], s.kld[l][0][c]) << what;
    }
  }
}

// With an anchor, the anchor's figures are the measured ones and the others are predictions from local errors.
TEST(Calibrate, AnchorFiguresAreMeasuredOthersPredicted) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  const test::ByteTokenizer tok;
  Rng rng(seed + 1);
  const std::vector<int> tokens = test::random_tokens(rng, 100);
  PerplexityOptions o;
  o.window = 100, o.threads = 2;
  const std::vector<std::string> codecs{"f16", "int4", "turbo_mse:2"};
  const LayerSensitivity measured = measure_layer_sensitivity(m.model(), tok, tokens, codecs, o, KVCacheSpec{});
  const LayerSensitivity scaled =
      measure_layer_sensitivity(m.model(), tok, tokens, codecs, o, KVCacheSpec{}, KeyCandidates::plain, "turbo_mse:2");
  for (size_t l = 0; l < scaled.kld.size(); ++l)
    for (size_t role = 0; role < 2; ++role) {
      EXPECT_EQ(scaled.kld[l][role][0], 0.0);
      EXPECT_GT(scaled.kld[l][role][1], 0.0);
      EXPECT_LT(scaled.kld[l][role][1], scaled.kld[l][role][2]);  // int4's local error is the smaller
      EXPECT_EQ(scaled.kld[l][role][2], measured.kld[l][role][2]);
    }
  // Centered keys are predicted from the anchor's plain keys, the anchor's own centered keys included.
  const LayerSensitivity centered = measure_layer_sensitivity(m.model(), tok, tokens, codecs, o, KVCacheSpec{},
                                                              KeyCandidates::plain_and_centered, "turbo_mse:2");
  for (size_t l = 0; l < centered.kld.size(); ++l) {
    EXPECT_EQ(centered.kld[l], scaled.kld[l]);
    EXPECT_TRUE(std::isnan(centered.centered_kld[l][0]));
    for (size_t c = 1; c < codecs.size(); ++c) {
      EXPECT_GT(centered.centered_kld[l][c], 0.0);
      EXPECT_NE(centered.centered_kld[l][c], centered.kld[l][0][c]);
    }
  }
  for (const char* anchor : {"f16", "int8"})
    test::expect_error(
        [&] {
          measure_layer_sensitivity(m.model(), tok, tokens, codecs, o, KVCacheSpec{}, KeyCandidates::plain, anchor);
        },
        std::string("anchor codec ") + anchor);
}

TEST(Calibrate, ChoosesWithinTheBudgetAndPredictsTheSum) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  const test::ByteTokenizer tok;
  Rng rng(seed + 1);
  const std::vector<int> tokens = test::random_tokens(rng, 128);
  PerplexityOptions o;
  o.window = 128, o.threads = 2;
  const LayerSensitivity s =
      measure_layer_sensitivity(m.model(), tok, tokens, {"f16", "int4", "turbo_mse:2"}, o, KVCacheSpec{});
  ASSERT_EQ(s.kld.size(), static_cast<size_t>(SyntheticLlama::kLayers));
  for (const auto& layer : s.kld)
    for (const auto& role : layer) {
      EXPECT_EQ(role[0], 0.0);  // f16 against the f16 reference
      EXPECT_GT(role[2], 0.0);
    }
  const int d = SyntheticLlama::kHeadDim;
  const CodecChoice all_f16 = choose_layer_codecs(s, 16, d, 64);
  EXPECT_EQ(all_f16.predicted_kld, 0.0);
  EXPECT_EQ(all_f16.bits_per_element, 16.0);
  const CodecChoice tight = choose_layer_codecs(s, 3.0, d, 64);
  EXPECT_LE(tight.bits_per_element, 3.0);
  double sum = 0;
  for (size_t l = 0; l < tight.layers.size(); ++l)
    for (int role = 0; role < 2; ++role) {
      const std::string& codec = role == 0 ? tight.layers[l].key : tight.layers[l].value;
      const size_t c = static_cast<size_t>(std::find(s.codecs.begin(), s.codecs.end(), codec) - s.codecs.begin());
      sum += s.kld[l][static_cast<size_t>(role)][c];
    }
  EXPECT_DOUBLE_EQ(tight.predicted_kld, sum);
  test::expect_error([&] { choose_layer_codecs(s, 1.0, d, 64); }, "below the cheapest");
  test::expect_error([&] { choose_layer_codecs(s, -1.0, d, 64); }, "must be positive");
  test::expect_error(
      [&] { measure_layer_sensitivity(m.model(), tok, tokens, {"int3"}, o, KVCacheSpec{}); }, "int3");

  // Sink tokens are charged first, at 16 bits, over the measured window or the sequence length asked for.
  LayerSensitivity sinks = s;
  sinks.sink_tokens = 8;  // of 128: 1/16 of the tokens
  const CodecChoice with_sinks = choose_layer_codecs(sinks, 3.5, d, 64);
  EXPECT_LE(with_sinks.bits_per_element, 3.5);
  const CodecChoice blocks = choose_layer_codecs(s, (3.5 - 1.0) / (1 - 1.0 / 16), d, 64);
  EXPECT_EQ(with_sinks.layers, blocks.layers) << "the blocks share what the sinks leave";
  EXPECT_DOUBLE_EQ(with_sinks.bits_per_element, sink_bits(blocks.bits_per_element, 8, 128));
  EXPECT_DOUBLE_EQ(choose_layer_codecs(sinks, 3.5, d, 64, 1024).bits_per_element,
                   sink_bits(choose_layer_codecs(s, (3.5 - 0.125) / (1 - 1.0 / 128), d, 64).bits_per_element, 8, 1024));
  test::expect_error([&] { choose_layer_codecs(sinks, 0.9, d, 64); }, "spent on 8 f16 sink tokens");
}

// Centered keys are chosen in the layers where they measure better, their offsets paid for from the budget.
TEST(Calibrate, ChoosesCenteredKeysWhereTheyMeasureBetter) {
  const int d = 64, T = 64, window = 256;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  LayerSensitivity s;
  s.codecs = {"f16", "int4"};
  s.window = window;
  // [layer][role][codec]: int4 keys cost 0.010 plain in both layers; centered 0.002 in layer 0, 0.030 in layer 1.
  s.kld = {{std::vector<double>{0, 0.010}, std::vector<double>{0, 0.001}},
           {std::vector<double>{0, 0.010}, std::vector<double>{0, 0.001}}};
  s.centered_kld = {{nan, 0.002}, {nan, 0.030}};
  const size_t offset = key_offset_bytes_per_block(d, T, window);
  EXPECT_EQ(offset, 64u);  // 4 bytes x 64 channels, over 256 / 64 blocks
  EXPECT_EQ(key_offset_bytes_per_block(d, T, 100), 164u);  // rounded up
  // int4 everywhere (4.5 bits) plus one layer's offsets: 64 bytes in 4 groups of 64 x 64 elements.
  const double int4_bits = 4.5, one_offset_bits = 8.0 * offset / (4.0 * T * d);
  const CodecChoice c = choose_layer_codecs(s, int4_bits + one_offset_bits, d, T);
  const std::vector<LayerCodecs> want{{"int4", "int4", true}, {"int4", "int4", false}};
  EXPECT_EQ(c.layers, want);
  EXPECT_DOUBLE_EQ(c.predicted_kld, 0.002 + 0.010 + 2 * 0.001);
  EXPECT_DOUBLE_EQ(c.bits_per_element, int4_bits + one_offset_bits);
  // Without room for the offsets the plain keys are chosen, better measured or not.
  const CodecChoice tight = choose_layer_codecs(s, int4_bits, d, T);
  for (const LayerCodecs& layer : tight.layers) EXPECT_EQ(layer, (LayerCodecs{"int4", "int4", false}));
  // Plain keys only: nothing is centered.
  s.centered_kld.clear();
  for (const LayerCodecs& layer : choose_layer_codecs(s, 16, d, T).layers) EXPECT_FALSE(layer.center_keys);
}

std::string read_all(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_all(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

Calibration example(const LlamaModel& model) {
  Calibration c;
  c.model = model_identity(model);
  c.budget_bits = 3.5;
  c.block_tokens = 128;
  c.calibration_tokens = 2048;
  c.sink_tokens = 4;
  c.predicted_kld = 0.0125;
  c.layers = {LayerCodecs{"int8", "turbo_mse:2", true}, LayerCodecs{"kivi:4", "int4"}};
  return c;
}

// A file as an older version wrote it: without trained states (before version 5), sink_tokens (before 4), the
// layer lines' centering (before 3), block_tokens and calibration_tokens (version 1); a fresh checksum.
std::string as_version(const std::string& file, int version) {
  std::istringstream lines(file.substr(0, file.rfind("crc32c ")));
  std::string body = "kvq-calibration " + std::to_string(version) + "\n", line;
  std::getline(lines, line);  // the current version's
  while (std::getline(lines, line)) {
    if (version == 1 && (line.starts_with("block_tokens ") || line.starts_with("calibration_tokens "))) continue;
    if (version < 4 && line.starts_with("sink_tokens ")) continue;
    if (line.starts_with("trained_states ") || line.starts_with("state ")) continue;
    if (version < 3 && line.starts_with("layer ")) line.resize(line.rfind(' '));  // without its centering
    body += line + "\n";
  }
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x", crc32c(body.data(), body.size()));
  return body + "crc32c " + crc + "\n";
}

TEST(CalibrationFile, RoundTrip) {
  const SyntheticLlama m(1);
  const test::TempFile file("calibration_round_trip.txt");
  const Calibration c = example(m.model());
  save_calibration(c, file.path());
  const Calibration back = load_calibration(file.path());
  EXPECT_EQ(back.model, c.model);
  EXPECT_EQ(back.model.architecture, "llama");
  EXPECT_EQ(back.model.channel_layout, "rope_adjacent_pairs");
  EXPECT_EQ(back.layers, c.layers);
  EXPECT_TRUE(back.layers[0].center_keys);
  EXPECT_FALSE(back.layers[1].center_keys);
  EXPECT_NE(read_all(file.path()).find("layer 0 int8 turbo_mse:2 centered\n"), std::string::npos);
  EXPECT_NE(read_all(file.path()).find("trained_states 0\n"), std::string::npos);  // none of these codecs trains
  EXPECT_EQ(back.budget_bits, c.budget_bits);
  EXPECT_EQ(back.block_tokens, c.block_tokens);
  EXPECT_EQ(back.calibration_tokens, c.calibration_tokens);
  EXPECT_EQ(back.sink_tokens, 4);
  EXPECT_EQ(back.predicted_kld, c.predicted_kld);
  check_calibration_model(back, m.model());
}

// Version 2 files (before per-layer centering) are read with every layer plain; version 1 files (also before
// block_tokens and calibration_tokens) so too, with the T they were written for.
TEST(CalibrationFile, ReadsVersions1And2AsPlainKeys) {
  const SyntheticLlama m(1);
  const test::TempFile file("calibration_old_versions.txt");
  const Calibration c = example(m.model());  // T 128, 2048 tokens, layer 0 centered
  save_calibration(c, file.path());
  const std::string current = read_all(file.path());
  std::vector<LayerCodecs> plain = c.layers;
  for (LayerCodecs& layer : plain) layer.center_keys = false;
  for (int version : {1, 2}) {
    write_all(file.path(), as_version(current, version));
    const Calibration back = load_calibration(file.path());
    EXPECT_EQ(back.block_tokens, version == 1 ? 64 : 128);
    EXPECT_EQ(back.calibration_tokens, version == 1 ? 0u : 2048u);
    EXPECT_EQ(back.sink_tokens, 0);
    EXPECT_EQ(back.layers, plain) << "version " << version;
  }
  // A version 2 file whose layer line carries a centering it could not have.
  std::string v2 = as_version(current, 2);
  v2 = v2.substr(0, v2.rfind("crc32c "));
  v2.replace(v2.find("turbo_mse:2\n"), 12, "turbo_mse:2 centered\n");
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x", crc32c(v2.data(), v2.size()));
  write_all(file.path(), v2 + "crc32c " + crc + "\n");
  test::expect_error([&] { load_calibration(file.path()); }, "has 'centered' after its layer's fields");
}

// Version 4 files (before trained states) and 3 (also before sink tokens) are read as they were written.
TEST(CalibrationFile, ReadsVersions3And4) {
  const SyntheticLlama m(1);
  const test::TempFile file("calibration_versions_3_4.txt");
  const Calibration c = example(m.model());
  save_calibration(c, file.path());
  const std::string current = read_all(file.path());
  for (int version : {3, 4}) {
    write_all(file.path(), as_version(current, version));
    const Calibration back = load_calibration(file.path());
    EXPECT_EQ(back.layers, c.layers) << "version " << version;
    EXPECT_EQ(back.block_tokens, c.block_tokens);
    EXPECT_EQ(back.sink_tokens, version == 4 ? c.sink_tokens : 0);
    EXPECT_EQ(back.predicted_kld, c.predicted_kld);
  }
  // A version 4 file with a state line it could not have.
  std::string v4 = as_version(current, 4);
  v4 = v4.substr(0, v4.rfind("crc32c ")) + "trained_states 0\n";
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x", crc32c(v4.data(), v4.size()));
  write_all(file.path(), v4 + "crc32c " + crc + "\n");
  test::expect_error([&] { load_calibration(file.path()); }, "follows the last layer's line");
}

TEST(CalibrationFile, RefusesDamageAndOtherModels) {
  const SyntheticLlama m(1);
  const test::TempFile file("calibration_refused.txt");
  save_calibration(example(m.model()), file.path());
  const std::string good = read_all(file.path());

  // Another file of the same shape (SyntheticLlama's files share one path, so one is loaded at a time).
  Calibration foreign = load_calibration(file.path());
  foreign.model.model_crc32c ^= 1;
  test::expect_error([&] { check_calibration_model(foreign, m.model()); }, "another model: its model checksum");
  Calibration wrong_shape = example(m.model());
  wrong_shape.model.n_kv_heads = 4;
  test::expect_error([&] { check_calibration_model(wrong_shape, m.model()); }, "kv head count is 4");

  std::string flipped = good;
  flipped[good.find("int8")] ^= 0x01;
  write_all(file.path(), flipped);
  test::expect_error([&] { load_calibration(file.path()); }, "corrupt");
  write_all(file.path(), good.substr(0, good.size() / 2));
  test::expect_error([&] { load_calibration(file.path()); }, "truncated");
  write_all(file.path(), "");
  test::expect_error([&] { load_calibration(file.path()); }, "not a kvq calibration file");

  // Valid checksums over contents that are not: `from` replaced by `to` in the good file.
  const auto rewritten = [&](const std::string& from, const std::string& to) {
    std::string body = good.substr(0, good.rfind("crc32c "));
    body.replace(body.find(from), from.size(), to);
    char crc[16];
    std::snprintf(crc, sizeof(crc), "%08x", crc32c(body.data(), body.size()));
    write_all(file.path(), body + "crc32c " + crc + "\n");
  };
  rewritten("kvq-calibration 5", "kvq-calibration 6");  // a later version
  test::expect_error([&] { load_calibration(file.path()); }, "format version 6; this kvq reads versions 1 to 5");
  rewritten("sink_tokens 4", "sink_tokens 5000");
  test::expect_error([&] { load_calibration(file.path()); }, "sink_tokens 5000 is outside [0, 4096]");
  rewritten("kivi:4", "kivi:9");  // an unknown codec
  EXPECT_THROW(load_calibration(file.path()), Error);
  rewritten("int4 plain", "int4");  // a layer without its centering
  test::expect_error([&] { load_calibration(file.path()); }, "should be 'layer 1 KEY_SPEC VALUE_SPEC plain|centered'");
  rewritten("int4 plain", "int4 centred");
  test::expect_error([&] { load_calibration(file.path()); }, "should be 'layer 1");
  rewritten("kivi:4 int4 plain", "f16 int4 centered");  // f16 keys are stored as they are
  test::expect_error([&] { load_calibration(file.path()); }, "centers keys of f16");

  test::expect_error([&] { load_calibration("absent_calibration.txt"); }, "not a regular file");
}

}  // namespace
}  // namespace kvq
