// Perplexity with key/value caches: the f32 KVCache against exact attention, compressed caches against f16 in
// lockstep (KL divergence, top-1 agreement), SmolLM2's int8 perplexity change, calibration and the text's tail.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kvq/codec.hpp"
#include "kvq/detail/perplexity.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"
#include "synthetic_llama.hpp"
#include "test_data.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::SyntheticLlama;

std::string tinystories() {
  std::ifstream f(test::shared_data("text/tinystories_val.txt"));
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(PerplexityCache, F32CacheEqualsExactAttention) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  const test::ByteTokenizer tok;
  Rng rng(seed + 1);
  const std::vector<int> tokens = test::random_tokens(rng, 300);
  for (int chunk : {1, 64}) {
    PerplexityOptions o;
    o.window = 150, o.chunk = chunk, o.threads = 2;
    o.caches = {KVCacheSpec{}, KVCacheSpec{"f32", "f32"}};
    o.product_input = ProductInput::f32;  // the two attentions differ in float order only: no 8-bit steps between
    const PerplexityResult r = measure_perplexity(m.model(), tok, tokens, o);
    EXPECT_EQ(r.tokens, 300u);  // BOS first: every token scored
    ASSERT_EQ(r.caches.size(), 2u);
    EXPECT_NEAR(r.caches[1].ppl, r.caches[0].ppl, 1e-4 * r.caches[0].ppl) << "chunks of " << chunk;
    EXPECT_EQ(r.ppl, r.caches[0].ppl);
    EXPECT_GT(r.ppl, 2.0);  // a random model: not far below the vocabulary of 64
    EXPECT_EQ(r.caches[0].bits_per_element_k, 32.0);
    EXPECT_EQ(r.caches[1].bits_per_element_v, 32.0);
    EXPECT_FALSE(r.reference.has_value());
  }
}

TEST(PerplexityCache, ScoreFromScoresTheTailOfEachWindow) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  const test::ByteTokenizer tok;
  Rng rng(seed + 1);
  const std::vector<int> tokens = test::random_tokens(rng, 300);
  PerplexityOptions o;
  o.window = 150, o.threads = 2;
  const PerplexityResult all = measure_perplexity(m.model(), tok, tokens, o);
  o.score_from = 100;  // BOS at position 0: positions 100..149 of each window predict its tokens 100..149
  const PerplexityResult tail = measure_perplexity(m.model(), tok, tokens, o);
  EXPECT_EQ(all.tokens, 300u);
  EXPECT_EQ(tail.tokens, 100u);
  EXPECT_NE(tail.mean_nll, all.mean_nll);
  EXPECT_TRUE(std::isfinite(tail.ppl));
  o.score_from = 150;
  EXPECT_THROW(measure_perplexity(m.model(), tok, tokens, o), Error);
}

TEST(PerplexityCache, CompressedCachesAgainstF16) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  const test::ByteTokenizer tok;
  Rng rng(seed + 1);
  const std::vector<int> tokens = test::random_tokens(rng, 200);
  PerplexityOptions o;
  o.window = 200, o.threads = 2;
  o.reference = KVCacheSpec{"f16", "f16"};
  o.caches = {{"f16", "f16"}, {"int8", "int8"}, {"int4", "turbo_mse:3"}, {"turbo_prod:3", "kivi:2"}};
  const PerplexityResult r = measure_perplexity(m.model(), tok, tokens, o);
  ASSERT_TRUE(r.reference.has_value());
  ASSERT_EQ(r.caches.size(), 4u);
  // f16 against f16: the same computation, so exactly the same distributions.
  EXPECT_EQ(r.caches[0].kld, 0.0);
  EXPECT_EQ(r.caches[0].top1_agree, 1.0);
  EXPECT_EQ(r.caches[0].ppl, r.reference->ppl);
  EXPECT_EQ(r.caches[0].cache_bytes, r.reference->cache_bytes);
  for (const CacheQuality& q : r.caches) {
    EXPECT_TRUE(std::isfinite(q.ppl)) << q.cache.label();
    EXPECT_GE(q.kld, 0.0) << q.cache.label();
    EXPECT_GE(q.top1_agree, 0.0) << q.cache.label();
    EXPECT_LE(q.top1_agree, 1.0) << q.cache.label();
    EXPECT_LE(q.cache_bytes, r.reference->cache_bytes) << q.cache.label();
  }
  EXPECT_GT(r.caches[1].kld, 0.0);
  EXPECT_LT(r.caches[1].kld, r.caches[3].kld);  // 8 bits beat 3-bit keys and 2-bit values
  EXPECT_EQ(r.caches[1].bits_per_element_k, 8.5);  // int8: fp16 scale per group of 32 channels
  EXPECT_EQ(r.caches[2].bits_per_element_v, 3.25);
  EXPECT_LT(r.caches[3].cache_bytes, r.caches[1].cache_bytes);
}

TEST(PerplexityCache, MissingCalibrationIsNamed) {
  const auto names = codec_names();
  if (std::find(names.begin(), names.end(), "vecinfer") == names.end())
    GTEST_SKIP() << "no registered codec needs training yet (vecinfer is not in this build's codec registry)";
  const SyntheticLlama m(3);
  const test::ByteTokenizer tok;
  Rng rng(4);
  const std::vector<int> tokens = test::random_tokens(rng, 100);
  PerplexityOptions o;
  o.window = 100, o.threads = 2;
  o.caches = {{"vecinfer", "f16"}};
  try {
    measure_perplexity(m.model(), tok, tokens, o);
    ADD_FAILURE() << "a codec that needs training ran without calibration";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--calib-tokens"), std::string::npos) << e.what();
  }
  o.calibration = test::random_tokens(rng, 200);
  const PerplexityResult r = measure_perplexity(m.model(), tok, tokens, o);
  EXPECT_TRUE(std::isfinite(r.ppl));
}

TEST(PerplexityCache, CalibratedInt4) {
  KVQ_FRESH_SEED();
  const SyntheticLlama m(seed);
  const test::ByteTokenizer tok;
  Rng rng(seed + 1);
  const std::vector<int> tokens = test::random_tokens(rng, 128);
  PerplexityOptions o;
  o.window = 128, o.threads = 2;
  o.reference = KVCacheSpec{"f16", "f16"};
  o.caches = {{"int4", "int4"}};
  const PerplexityResult plain = measure_perplexity(m.model(), tok, tokens, o);
  o.calibration = test::random_tokens(rng, 256);
  const PerplexityResult calibrated = measure_perplexity(m.model(), tok, tokens, o);
  EXPECT_EQ(calibrated.reference->ppl, plain.reference->ppl);  // f16 has nothing to learn
  EXPECT_NE(calibrated.ppl, plain.ppl);                        // int4's channel scales do change
  EXPECT_GE(calibrated.caches[0].kld, 0.0);
}

TEST(PerplexitySmolLM2, Int8ChangesPerplexityLittle) {
  KVQ_REQUIRE_FILE(test::smollm2_path(), "run scripts/fetch-models.sh");
  KVQ_REQUIRE_FILE(test::shared_data("text/tinystories_val.txt"), "the shared data folder lies beside the repository");
  const LlamaModel m = LlamaModel::load(test::smollm2_path());
  const auto tok = load_tokenizer(m, "");
  const std::vector<int> tokens = tokenize_prefix(*tok, tinystories(), 128);
  PerplexityOptions o;
  o.window = 128, o.threads = 2;
  o.reference = KVCacheSpec{"f16", "f16"};
  o.caches = {{"int8", "int8"}};
  // The cache's effect alone: with 8-bit activations the two runs' roundings differ too (0.7% seen in a sanitizer
  // build on these 127 tokens), which is the weights path's effect, not the cache's.
  o.product_input = ProductInput::f32;
  const PerplexityResult r = measure_perplexity(m, *tok, tokens, o);
  EXPECT_EQ(r.tokens, 127u);  // no BOS: the first token is context only
  const double delta = std::abs(r.ppl / r.reference->ppl - 1);
  EXPECT_LT(delta, 0.005);                    // measured 0.0005 on these tokens
  EXPECT_LT(r.caches[0].kld, 0.002);          // measured 0.0001
  EXPECT_GT(r.caches[0].top1_agree, 0.95);    // measured 0.99
  EXPECT_NEAR(r.reference->ppl, 14.75, 1.0);  // the f16 perplexity of these 127 tokens, measured 14.75
}

TEST(PerplexityText, CalibrationTailAvoidsTheScoredPrefix) {
  KVQ_REQUIRE_FILE(test::shared_data("models/tok512.bin"), "the shared data folder lies beside the repository");
  const auto tok = load_llama2c_tokenizer(test::shared_data("models/tok512.bin"));
  std::string text;
  for (int i = 0; i < 400; ++i) text += "line " + std::to_string(i) + " of the text\n";
  size_t used = 0;
  const std::vector<int> head = tokenize_prefix(*tok, text, 50, &used);
  EXPECT_EQ(head.size(), 50u);
  EXPECT_GT(used, 0u);
  EXPECT_LT(used, text.size());
  const std::vector<int> tail = tokenize_tail(*tok, text, 40, used);
  ASSERT_EQ(tail.size(), 40u);
  // The end of the text, as tokenized from any line start after the prefix.
  const std::vector<int> after = tok->encode(text.substr(text.find('\n', used) + 1));
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), after.end() - 40));
  try {
    tokenize_tail(*tok, text, 100000, used);
    ADD_FAILURE() << "a tail longer than the text was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("calibration tokens"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvq
