// The runner with key/value caches: chunked forward passes against token-by-token ones (fp32 store and f32
// KVCache), the f32 KVCache against the fp32 store, cache bytes, calibration, and the errors for bad cache specs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"
#include "kvq/model.hpp"
#include "synthetic_llama.hpp"
#include "test_data.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::SyntheticLlama;

// Largest |a - b| over the logits of every position, relative to the range of b's logits at that position.
double relative_error(const std::vector<float>& a, const std::vector<float>& b, int vocab) {
  double worst = 0;
  for (size_t p = 0; p < b.size(); p += static_cast<size_t>(vocab)) {
    const auto first = b.begin() + static_cast<long>(p);
    const auto [lo, hi] = std::minmax_element(first, first + vocab);
    double err = 0;
    for (int i = 0; i < vocab; ++i) err = std::max(err, static_cast<double>(std::abs(a[p + i] - b[p + i])));
    worst = std::max(worst, err / (*hi - *lo));
  }
  return worst;
}

// The logits of every position, running `ids` through forward_chunk in chunks of `chunk`.
std::vector<float> run(LlamaRunner& runner, const std::vector<int>& ids, int chunk) {
  runner.reset();
  std::vector<float> logits;
  for (size_t i = 0; i < ids.size(); i += static_cast<size_t>(chunk)) {
    const size_t n = std::min(ids.size() - i, static_cast<size_t>(chunk));
    const auto out = runner.forward_chunk({ids.data() + i, n}, static_cast<int>(i));
    logits.insert(logits.end(), out.begin(), out.end());
  }
  return logits;
}

// The logits of every position, running `ids` through forward one token at a time.
std::vector<float> run_tokens(LlamaRunner& runner, const std::vector<int>& ids) {
  runner.reset();
  std::vector<float> logits;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto out = runner.forward(ids[i], static_cast<int>(i));
    logits.insert(logits.end(), out.begin(), out.end());
  }
  return logits;
}

// `tolerance`: of the logits' range; the chunked projections sum in another order than the token-by-token ones.
void expect_chunks_match_tokens(const LlamaModel& model, const std::vector<int>& ids, const KVCacheSpec& cache,
                                double tolerance = 1e-4, ProductInput input = ProductInput::f32) {
  LlamaRunner runner(model, static_cast<int>(ids.size()), 2, cache);
  runner.set_product_input(input);
  const std::vector<float> one_by_one = run_tokens(runner, ids);
  for (int chunk : {1, 7, 64}) {
    const std::vector<float> chunked = run(runner, ids, chunk);
    ASSERT_EQ(chunked.size(), one_by_one.size());
    EXPECT_LT(relative_error(chunked, one_by_one, model.config().vocab_size), tolerance)
        << cache.label() << ", chunks of " << chunk;
  }
}

// A compressed cache: the token-by-token projections (matrix-vector) and the chunked ones (blocked matrix product)
// differ in the last bits, enough to round a code the other way now and then, so chunk sizes are compared with
// each other instead: every chunked row is computed the same way, and every position must see the cache as
// decoding would (its own unfinished block in fp32) whatever chunk it falls in.
void expect_chunk_sizes_agree(const LlamaModel& model, const std::vector<int>& ids, const KVCacheSpec& cache) {
  LlamaRunner runner(model, static_cast<int>(ids.size()), 2, cache);
  const std::vector<float> whole = run(runner, ids, static_cast<int>(ids.size()));
  for (int chunk : {5, 7, 64}) {
    EXPECT_LT(relative_error(run(runner, ids, chunk), whole, model.config().vocab_size), 1e-5)
        << cache.label() << ", chunks of " << chunk;
  }
}

TEST(ModelCacheChunks, SyntheticChunkedEqualsTokenByToken) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  Rng rng(seed + 1);
  const std::vector<int> ids = test::random_tokens(rng, 150);  // two full pages and a partial one
  expect_chunks_match_tokens(m.model(), ids, {});
  expect_chunks_match_tokens(m.model(), ids, {"f32", "f32"});
  expect_chunks_match_tokens(m.model(), ids, {"f32", "f32", 64, 64});  // an fp32 window of 64 + 0..63 tokens
  // With 8-bit activations a last-bit difference (attention's summation order) may round an activation code the
  // other way, which the following layers carry on: over 40 draws 2.2e-4 at the median, 2.4e-3 at most.
  expect_chunks_match_tokens(m.model(), ids, {}, 1e-2, ProductInput::q8);
  // Compressed: each position of a chunk sees the cache as decoding would (its unfinished block in fp32).
  expect_chunk_sizes_agree(m.model(), ids, {"int4", "kivi:2"});
  expect_chunk_sizes_agree(m.model(), ids, {"turbo_prod:3", "turbo_mse:3", 64, 64});
  // Sink tokens: the first ones go to the sinks, not the window, and a chunk is still split where a block is encoded.
  // (Their f16 rounding, like a codec's, turns the last-bit differences of token-by-token projections into
  // roundings the other way: chunk sizes are compared with each other.)
  for (int sinks : {1, 5, 64, 200})
    for (const char* codec : {"f32", "int4"}) {
      KVCacheSpec spec{codec, codec};
      spec.sink_tokens = sinks;
      expect_chunk_sizes_agree(m.model(), ids, spec);
    }
}

TEST(ModelCacheChunks, Stories260KChunkedEqualsTokenByToken) {
  KVQ_REQUIRE_FILE(test::shared_data("models/stories260K.bin"), "the shared data folder lies beside the repository");
  KVQ_FRESH_SEED();
  const LlamaModel m = LlamaModel::load(test::shared_data("models/stories260K.bin"));
  Rng rng(seed);
  std::vector<int> ids = {1};
  while (ids.size() < 100) ids.push_back(static_cast<int>(rng.next_u64() % 512));
  // Its heads (dimension 8) are narrower than any codec holds, so only the fp32 store runs it.
  expect_chunks_match_tokens(m, ids, {});
  try {
    LlamaRunner runner(m, 64, 1, {"f32", "f32"});
    ADD_FAILURE() << "a KVCache of heads of dimension 8 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dimension 8"), std::string::npos) << e.what();
  }
}

TEST(ModelCacheChunks, SmolLM2ChunkedEqualsTokenByToken) {
  KVQ_REQUIRE_FILE(test::smollm2_path(), "run scripts/fetch-models.sh");
  KVQ_FRESH_SEED();
  const LlamaModel m = LlamaModel::load(test::smollm2_path());
  Rng rng(seed);
  std::vector<int> ids;
  while (ids.size() < 16) ids.push_back(static_cast<int>(rng.next_u64() % 49152));
  // 30 layers carry the summation-order difference further than the small models' 2-5: over 210 draws the error
  // was 4.5e-6 at the median, 5.6e-5 at the 99th percentile and 3.1e-4 at most (1e-4 failed about 1 draw in 50).
  expect_chunks_match_tokens(m, ids, {"f32", "f32"}, 2e-3);
}

TEST(ModelCache, F32CacheEqualsTheFloatStore) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  Rng rng(seed + 1);
  const std::vector<int> ids = test::random_tokens(rng, 140);
  LlamaRunner exact(m.model(), 140, 2), cached(m.model(), 140, 2, {"f32", "f32"});
  for (LlamaRunner* r : {&exact, &cached}) r->set_product_input(ProductInput::f32);  // no 8-bit rounding to amplify
  EXPECT_LT(relative_error(run(cached, ids, 64), run(exact, ids, 64), SyntheticLlama::kVocab), 1e-4);
  EXPECT_LT(relative_error(run_tokens(cached, ids), run_tokens(exact, ids), SyntheticLlama::kVocab), 1e-4);
}

TEST(ModelCache, CompressedCacheChangesLogitsALittle) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  Rng rng(seed + 1);
  const std::vector<int> ids = test::random_tokens(rng, 130);
  LlamaRunner exact(m.model(), 130, 2), int8(m.model(), 130, 2, {"int8", "int8"}),
      kivi(m.model(), 130, 2, {"kivi:2", "kivi:2"});
  const std::vector<float> ref = run(exact, ids, 64);
  const double err8 = relative_error(run(int8, ids, 64), ref, SyntheticLlama::kVocab);
  const double err2 = relative_error(run(kivi, ids, 64), ref, SyntheticLlama::kVocab);
  EXPECT_GT(err8, 0.0);   // the codec does act
  EXPECT_LT(err8, 0.1);   // measured 0.005..0.03 (the largest error over 130 positions)
  EXPECT_GT(err2, err8);  // 2 bits lose more than 8
}

TEST(ModelCache, BytesAndCodecsOfTheCache) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  Rng rng(seed + 1);
  LlamaRunner runner(m.model(), 200, 2, {"int4", "kivi:2", 64, 64});
  ASSERT_NE(runner.cache(), nullptr);
  EXPECT_EQ(runner.cache()->config().key_codec, "int4");
  EXPECT_EQ(runner.cache()->value_codec(1).spec().str(), "kivi:2");
  run(runner, test::random_tokens(rng, 200), 64);
  const CacheMemory mem = runner.cache()->memory();
  EXPECT_EQ(runner.cache_bytes(), mem.used_bytes);
  // 200 tokens with a window of 64: 2 pages per layer (128 tokens), 72 tokens in fp32.
  EXPECT_EQ(mem.pages_in_use, 2u * SyntheticLlama::kLayers);
  EXPECT_EQ(runner.cache()->view(runner.cache()->sequences().front(), 0).residual_count, 72);
  LlamaRunner exact(m.model(), 200, 2);
  EXPECT_EQ(exact.cache(), nullptr);
  run(exact, test::random_tokens(rng, 200), 64);
  EXPECT_EQ(exact.cache_bytes(), 200u * SyntheticLlama::kLayers * 2 * SyntheticLlama::kKvHeads *
                                     SyntheticLlama::kHeadDim * sizeof(float));
  runner.reset();
  EXPECT_EQ(runner.position(), 0);
  EXPECT_EQ(runner.cache()->memory().pages_in_use, 0u);
}

// KVCacheSpec::layers: the listed layers use the codecs, the others f16.
TEST(ModelCache, CodecsOnSomeLayers) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  Rng rng(seed + 1);
  const std::vector<int> ids = test::random_tokens(rng, 130);
  const auto logits = [&](const KVCacheSpec& spec) {
    LlamaRunner runner(m.model(), 130, 2, spec);
    return run(runner, ids, 64);
  };
  KVCacheSpec all{"kivi:2", "kivi:2"}, both = all, first = all, none{"f16", "f16"};
  both.layers = {0, 1};
  first.layers = {0};
  EXPECT_EQ(logits(both), logits(all));
  const std::vector<float> mixed = logits(first);
  EXPECT_NE(mixed, logits(all));
  EXPECT_NE(mixed, logits(none));
  EXPECT_EQ(first.label(), "kivi:2/kivi:2@layers 0");
  KVCacheSpec outside = all;
  outside.layers = {2};
  EXPECT_THROW(LlamaRunner(m.model(), 16, 1, outside), Error);
}

TEST(ModelCache, BadSpecsAreNamed) {
  const SyntheticLlama m(1);
  const auto message = [&](const KVCacheSpec& spec) {
    try {
      LlamaRunner runner(m.model(), 64, 1, spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message({"int3", "int8"}).find("int3"), std::string::npos) << message({"int3", "int8"});
  EXPECT_NE(message({"int8", ""}).find("both"), std::string::npos) << message({"int8", ""});
  EXPECT_NE(message({"int8", "turbo_mse:9"}).find("turbo_mse"), std::string::npos) << message({"int8", "turbo_mse:9"});
  EXPECT_NE(message({"int8", "int8", 64, 10}).find("10"), std::string::npos) << message({"int8", "int8", 64, 10});
  EXPECT_NE(message({"int8", "int8", 48}).find("48"), std::string::npos) << message({"int8", "int8", 48});
}

TEST(ModelCache, ChunkArgumentsAreChecked) {
  const SyntheticLlama m(2);
  LlamaRunner runner(m.model(), 16, 1, {"f16", "f16"});
  const std::vector<int> ids(17, 5);
  EXPECT_THROW(runner.forward_chunk({ids.data(), 17}, 0), Error);  // beyond the context
  EXPECT_THROW(runner.forward_chunk({ids.data(), 0}, 0), Error);   // empty
  EXPECT_THROW(runner.forward_chunk({ids.data(), 4}, 3), Error);   // not at the next position
  const std::vector<int> bad = {5, SyntheticLlama::kVocab};
  EXPECT_THROW(runner.forward_chunk(bad, 0), Error);  // outside the vocabulary
  EXPECT_EQ(runner.position(), 0);
  EXPECT_EQ(runner.forward_chunk({ids.data(), 4}, 0, false).size(), static_cast<size_t>(SyntheticLlama::kVocab));
  EXPECT_EQ(runner.position(), 4);
}

// Codecs that need training learn from the model's own keys and values.
TEST(ModelCache, CalibrationTrainsCodecs) {
  const auto names = codec_names();
  if (std::find(names.begin(), names.end(), "vecinfer") == names.end())
    GTEST_SKIP() << "no registered codec needs training yet (vecinfer is not in this build's codec registry)";
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  Rng rng(seed + 1);
  LlamaRunner runner(m.model(), 128, 2, {"vecinfer", "vecinfer"});
  EXPECT_TRUE(runner.needs_calibration());
  try {
    runner.forward_chunk(test::random_tokens(rng, 8), 0);
    ADD_FAILURE() << "an untrained codec accepted keys";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("calib"), std::string::npos) << e.what();
  }
  runner.calibrate(test::random_tokens(rng, 300));  // longer than the context: windows of 128
  EXPECT_FALSE(runner.needs_calibration());
  EXPECT_EQ(runner.position(), 0);
  const auto logits = runner.forward_chunk(test::random_tokens(rng, 100), 0);
  for (float l : logits) ASSERT_TRUE(std::isfinite(l));
}

// int4 learns per-channel scales from a sample; f16 has nothing to learn.
TEST(ModelCache, CalibrationSetsChannelScales) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  Rng rng(seed + 1);
  const std::vector<int> ids = test::random_tokens(rng, 70);
  LlamaRunner plain(m.model(), 70, 2, {"int4", "f16"}), calibrated(m.model(), 70, 2, {"int4", "f16"});
  EXPECT_FALSE(calibrated.needs_calibration());
  const KVSample sample = calibrated.capture_kv(test::random_tokens(rng, 40));
  EXPECT_EQ(calibrated.position(), 0);
  ASSERT_EQ(sample.keys.size(), static_cast<size_t>(SyntheticLlama::kLayers));
  EXPECT_EQ(sample.keys[1].size(), 40u * SyntheticLlama::kKvHeads * SyntheticLlama::kHeadDim);
  calibrated.train_cache(sample);
  EXPECT_FALSE(calibrated.cache()->key_codec(0).state().empty());
  EXPECT_TRUE(calibrated.cache()->value_codec(0).state().empty());
  EXPECT_TRUE(plain.cache()->key_codec(0).state().empty());
  EXPECT_NE(run(calibrated, ids, 64), run(plain, ids, 64));
  KVSample wrong = sample;
  wrong.keys.pop_back();
  EXPECT_THROW(calibrated.train_cache(wrong), Error);
}

}  // namespace
}  // namespace kvq
