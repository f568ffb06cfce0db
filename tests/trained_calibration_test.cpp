// kvq calibrate with candidates that need training (vecinfer): each layer and role trained on the calibration
// tokens' keys and values, the chosen states carried by the calibration file into the cache, and the file's refusal
// of states that are damaged or do not fit their codec. (stories260K's heads of 8 channels hold no codec: the
// synthetic model stands in for a tiny real one, as in calibration_test.cpp.)
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/crc32c.hpp"
#include "expect_error.hpp"
#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/calibrate.hpp"
#include "kvq/detail/calibration.hpp"
#include "kvq/detail/random.hpp"
#include "synthetic_llama.hpp"
#include "temp_file.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::SyntheticLlama;

const std::vector<std::string> kCandidates{"f16", "int4", "vecinfer:8/4"};

// The synthetic model's sensitivities on 128 random tokens, one window, keys plain and centered.
struct Measured {
  explicit Measured(uint64_t seed) : m(seed) {
    Rng rng(seed + 1);
    tokens = test::random_tokens(rng, 128);
    options.window = 128, options.threads = 2;
    s = measure_layer_sensitivity(m.model(), tok, tokens, kCandidates, options, KVCacheSpec{},
                                  KeyCandidates::plain_and_centered);
  }
  const SyntheticLlama m;
  const test::ByteTokenizer tok;
  std::vector<int> tokens;
  PerplexityOptions options;
  LayerSensitivity s;
};

// The measured window's inputs: BOS and the tokens but the last (perplexity_windows).
std::vector<int> inputs_of(const Measured& x) {
  std::vector<int> inputs{x.tok.bos()};
  inputs.insert(inputs.end(), x.tokens.begin(), x.tokens.end() - 1);
  return inputs;
}

// Runs the window through a runner with `spec` and returns every position's logits.
std::vector<float> logits(const Measured& x, const KVCacheSpec& spec) {
  LlamaRunner r(x.m.model(), static_cast<int>(x.tokens.size()) + 1, 2, spec);
  const std::span<const float> out = r.forward_chunk(inputs_of(x), 0);
  return {out.begin(), out.end()};
}

Calibration calibration_of(const LlamaModel& model, const CodecChoice& choice) {
  Calibration c;
  c.model = model_identity(model);
  c.budget_bits = 3;
  c.calibration_tokens = 128;
  c.predicted_kld = choice.predicted_kld;
  c.layers = choice.layers;
  return c;
}

std::string read_all(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// `body` (a file without its checksum line) with a valid checksum.
void write_checksummed(const std::filesystem::path& path, const std::string& body) {
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x", crc32c(body.data(), body.size()));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << body << "crc32c " << crc << "\n";
}

TEST(Calibrate, TrainsCandidatesThatNeedTraining) {
  KVQ_FRESH_SEED();
  const Measured x(seed);
  ASSERT_EQ(x.s.states.size(), static_cast<size_t>(SyntheticLlama::kLayers));
  for (size_t l = 0; l < x.s.states.size(); ++l) {
    for (size_t c : {0, 1}) {  // f16 and int4 learn nothing
      EXPECT_TRUE(x.s.states[l][c].key.empty() && x.s.states[l][c].value.empty());
      EXPECT_TRUE(x.s.states[l][c].centered_key.empty());
    }
    const TrainedStates& v = x.s.states[l][2];
    EXPECT_FALSE(v.key.empty() || v.value.empty() || v.centered_key.empty()) << "layer " << l;
    EXPECT_NE(v.key, v.value);
    EXPECT_NE(v.key, v.centered_key);  // learned from the centered keys
    for (int role = 0; role < 2; ++role) EXPECT_GT(x.s.kld[l][role][2], 0.0);
    EXPECT_GT(x.s.centered_kld[l][2], 0.0);
  }
  // Without a candidate that needs training, nothing is kept.
  const LayerSensitivity untrained =
      measure_layer_sensitivity(x.m.model(), x.tok, x.tokens, {"f16", "int4"}, x.options, KVCacheSpec{});
  EXPECT_TRUE(untrained.states.empty());
}

// A layer's state is what that layer's codec of the cache learns from the same keys and values (train_cache on the
// f16 keys and values of the same window), and a cache built with it computes what the trained cache computes.
TEST(Calibrate, TrainedStateIsTheCachesOwn) {
  KVQ_FRESH_SEED();
  const Measured x(seed);
  LlamaRunner trained(x.m.model(), static_cast<int>(x.tokens.size()) + 1, 2,
                      KVCacheSpec{"vecinfer:8/4", "vecinfer:8/4"});
  trained.train_cache(trained.capture_kv(inputs_of(x)));
  KVCacheSpec loaded;
  for (size_t l = 0; l < x.s.states.size(); ++l) {
    const TrainedStates& st = x.s.states[l][2];
    EXPECT_EQ(trained.cache()->key_codec(static_cast<int>(l)).state(), st.key) << "layer " << l;
    EXPECT_EQ(trained.cache()->value_codec(static_cast<int>(l)).state(), st.value) << "layer " << l;
    LayerCodecs& c = loaded.layer_codecs.emplace_back(LayerCodecs{"vecinfer:8/4", "vecinfer:8/4"});
    c.key_state = st.key, c.value_state = st.value;
  }
  const std::vector<float> a = logits(x, loaded);
  const std::span<const float> b = trained.forward_chunk(inputs_of(x), 0);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// The choice carries the states its figures were measured with; through the file (version 5) the reloaded cache
// computes bit for bit what the chosen one does, with no training text.
TEST(CalibrationFile, TrainedStatesRoundTrip) {
  KVQ_FRESH_SEED();
  const Measured x(seed);
  const CodecChoice choice = choose_layer_codecs(x.s, 2.5, SyntheticLlama::kHeadDim, 64);
  size_t states = 0;
  for (size_t l = 0; l < choice.layers.size(); ++l) {
    const LayerCodecs& c = choice.layers[l];
    const TrainedStates& st = x.s.states[l][2];
    if (c.key == "vecinfer:8/4") EXPECT_EQ(c.key_state, c.center_keys ? st.centered_key : st.key);
    else EXPECT_TRUE(c.key_state.empty());
    if (c.value == "vecinfer:8/4") EXPECT_EQ(c.value_state, st.value);
    else EXPECT_TRUE(c.value_state.empty());
    states += !c.key_state.empty() + !c.value_state.empty();
  }
  ASSERT_GT(states, 0u) << "2.5 bits leave int4 (4.5 bits) for some layers only";

  const test::TempFile file("calibration_trained.txt");
  save_calibration(calibration_of(x.m.model(), choice), file.path());
  EXPECT_NE(read_all(file.path()).find("kvq-calibration 5\n"), std::string::npos);
  EXPECT_NE(read_all(file.path()).find("trained_states " + std::to_string(states) + "\n"), std::string::npos);
  const Calibration back = load_calibration(file.path());
  EXPECT_EQ(back.layers, choice.layers);

  KVCacheSpec chosen, reloaded;
  chosen.layer_codecs = choice.layers;
  reloaded.layer_codecs = back.layers;
  EXPECT_FALSE(LlamaRunner(x.m.model(), 8, 1, reloaded).needs_calibration());
  const std::vector<float> a = logits(x, chosen), b = logits(x, reloaded);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  // Without the states the same codecs need training.
  for (LayerCodecs& c : reloaded.layer_codecs) c.key_state.clear(), c.value_state.clear();
  EXPECT_TRUE(LlamaRunner(x.m.model(), 8, 1, reloaded).needs_calibration());
}

// A cache takes a layer's states only as a whole and only before that layer holds pages.
TEST(Calibrate, LoadLayerStateIsAllOrNothing) {
  KVQ_FRESH_SEED();
  CacheConfig config;
  config.n_layers = 2, config.head_dim = 64, config.capacity_pages = 4;
  config.key_codec = config.value_codec = "vecinfer:8/4";
  Rng rng(seed);
  std::vector<float> x(512 * 64);
  for (float& v : x) v = static_cast<float>(rng.normal());
  KVCache trained(config);
  trained.train_layer(1, x.data(), x.data(), 512);
  const std::vector<uint8_t> state = trained.key_codec(1).state();

  KVCache cache(config);
  std::vector<uint8_t> short_state(state.begin(), state.end() - 4);
  test::expect_error([&] { cache.load_layer_state(1, state, short_state); }, "vecinfer:8/4: state of");
  EXPECT_FALSE(cache.key_codec(1).trained());  // the key's good state was not taken either
  cache.load_layer_state(1, state, trained.value_codec(1).state());
  EXPECT_TRUE(cache.ready(1));
  EXPECT_FALSE(cache.ready(0));
  EXPECT_EQ(cache.key_codec(1).state(), state);
  const SeqId seq = cache.add_sequence();
  cache.append(seq, 1, x.data(), x.data(), 64);  // one page
  test::expect_error([&] { cache.load_layer_state(1, state, state); }, "already holds encoded tokens");
}

TEST(CalibrationFile, RefusesDamagedStates) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  // Layer 0's keys in vecinfer:8/4 with a state trained on random vectors; layer 1 without states.
  Rng rng(seed + 1);
  const int d = SyntheticLlama::kHeadDim;
  std::vector<float> train(512 * static_cast<size_t>(d));
  for (float& v : train) v = static_cast<float>(rng.normal());
  const auto codec = make_codec("vecinfer:8/4", {d, 64, 0, Role::key});
  codec->train(train.data(), 512);
  Calibration c = calibration_of(m.model(), CodecChoice{});
  c.layers = {LayerCodecs{"vecinfer:8/4", "int4"}, LayerCodecs{"int4", "int4"}};
  c.layers[0].key_state = codec->state();
  const std::string bytes = std::to_string(codec->state().size());

  const test::TempFile file("calibration_damaged_states.txt");
  save_calibration(c, file.path());
  const std::string good = read_all(file.path());
  EXPECT_EQ(load_calibration(file.path()).layers, c.layers);
  const std::string body = good.substr(0, good.rfind("crc32c "));
  const size_t state_line = body.find("state 0 key ");
  ASSERT_NE(state_line, std::string::npos);
  const size_t hex = state_line + std::string("state 0 key ").size() + bytes.size() + 1;

  // Cut short: the checksum no longer matches, or (re-checksummed) the line lacks its digits or its line.
  std::ofstream(file.path(), std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 100);
  test::expect_error([&] { load_calibration(file.path()); }, "truncated");
  std::string altered = good;
  altered[hex + 10] = altered[hex + 10] == '0' ? '1' : '0';
  std::ofstream(file.path(), std::ios::binary | std::ios::trunc) << altered;
  test::expect_error([&] { load_calibration(file.path()); }, "corrupt");
  const auto rewritten = [&](std::string text) { write_checksummed(file.path(), text); };
  rewritten(body.substr(0, body.size() - 9) + "\n");  // 4 bytes of digits short of BYTES
  test::expect_error([&] { load_calibration(file.path()); }, "2 BYTES hex digits");
  rewritten(body.substr(0, state_line));  // the state line gone
  test::expect_error([&] { load_calibration(file.path()); }, "ends before its 'state' line");

  // Digits and lengths that do not fit the codec, or are absurd.
  std::string shorter = body.substr(0, body.size() - 9) + "\n";  // 4 bytes fewer, BYTES to match
  shorter.replace(hex - bytes.size() - 1, bytes.size(), std::to_string(codec->state().size() - 4));
  rewritten(shorter);
  test::expect_error([&] { load_calibration(file.path()); }, "layer 0's key codec refuses: vecinfer:8/4: state of");
  std::string nan = body;
  nan.replace(hex, 8, "ffffffff");  // channel 0's smoothing factor a NaN
  rewritten(nan);
  test::expect_error([&] { load_calibration(file.path()); }, "smoothing factor");
  std::string upper = body;
  upper.replace(hex, 2, "GG");
  rewritten(upper);
  test::expect_error([&] { load_calibration(file.path()); }, "where 2 lowercase hex digits belong");
  std::string huge = body;
  huge.replace(hex - bytes.size() - 1, bytes.size(), "99999999999999999999");
  rewritten(huge);
  test::expect_error([&] { load_calibration(file.path()); }, "should be 'state LAYER key|value BYTES HEX'");
  std::string count = body;
  count.replace(count.find("trained_states 1"), 16, "trained_states 5");
  rewritten(count);
  test::expect_error([&] { load_calibration(file.path()); }, "trained_states 5 is outside [0, 4]");

  // States where they cannot belong: a codec without trained state, a layer out of range, a repeated state.
  const std::string line = body.substr(state_line);
  rewritten(body.substr(0, state_line) + "state 0 value" + line.substr(11));
  test::expect_error([&] { load_calibration(file.path()); }, "layer 0's value codec refuses: int4");
  rewritten(body.substr(0, state_line) + "state 2 key" + line.substr(11));
  test::expect_error([&] { load_calibration(file.path()); }, "LAYER in [0, 2)");
  std::string twice = body + line;
  twice.replace(twice.find("trained_states 1"), 16, "trained_states 2");
  rewritten(twice);
  test::expect_error([&] { load_calibration(file.path()); }, "repeats or reorders the states");
}

}  // namespace
}  // namespace kvq
