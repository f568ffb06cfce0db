// measure_attention_error: exact caches give fp32 rounding, fewer bits give more error, bad options are refused.
#include <gtest/gtest.h>

#include "expect_error.hpp"
#include "kvq/cuda.hpp"
#include "kvq/detail/attention_error.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

AttentionErrorResult measure(const char* k, const char* v, uint64_t seed) {
  AttentionErrorOptions o;
  o.key_codec = k;
  o.value_codec = v;
  o.dim = 64;
  o.ctx = 300;  // four full blocks and a partial one in the fp32 window
  o.q_heads = 4;
  o.kv_heads = 2;
  o.queries = 3;
  o.seed = seed;
  return measure_attention_error(o);
}

TEST(AttentionError, ExactCacheHasOnlyRoundingError) {
  KVQ_FRESH_SEED();
  const AttentionErrorResult r = measure("f32", "f32", seed);
  EXPECT_LT(r.rel_err_max, 1e-5);
  EXPECT_LT(r.weights_tv, 1e-9);
  EXPECT_DOUBLE_EQ(r.bits_k, 32.0);
}

TEST(AttentionError, FewerBitsMoreError) {
  KVQ_FRESH_SEED();
  const AttentionErrorResult r8 = measure("int8", "int8", seed), r4 = measure("int4", "int4", seed),
                             k4 = measure("int4", "f32", seed), v4 = measure("f32", "int4", seed);
  EXPECT_GT(r8.rel_err_mean, 1e-5);
  EXPECT_GT(r4.rel_err_mean, 3 * r8.rel_err_mean);  // 16x the step; measured ~17x
  EXPECT_LE(r4.rel_err_mean, r4.rel_err_max);
  EXPECT_GT(k4.weights_tv, 0.0);   // key errors move the weights
  EXPECT_EQ(v4.weights_tv, 0.0);   // value errors do not
  EXPECT_GT(v4.rel_err_mean, 0.0);
}

TEST(AttentionError, RejectsBadOptions) {
  AttentionErrorOptions o;
  o.ctx = 0;
  EXPECT_THROW(measure_attention_error(o), Error);
  o = {};
  o.q_heads = 6;
  o.kv_heads = 4;
  EXPECT_THROW(measure_attention_error(o), Error);
  o = {};
  o.key_codec = "int5";
  EXPECT_THROW(measure_attention_error(o), Error);
  o = {};
  o.device = "gpu";
  EXPECT_THROW(measure_attention_error(o), Error);
}

// Without a usable device the CUDA measurement says why; with one, the device kernel is measured like the CPU's
// (tests/gpu holds it to the same bounds).
TEST(AttentionError, OnCudaNamesWhatRan) {
  AttentionErrorOptions o;
  o.dim = 64;
  o.ctx = 300;
  o.queries = 1;
  o.device = "cuda";
  if (cuda::device_count() == 0) {
    test::expect_error([&] { measure_attention_error(o); }, "CUDA");
    return;
  }
  const AttentionErrorResult r = measure_attention_error(o);
  EXPECT_EQ(r.kernel.rfind("cuda_", 0), 0u) << r.kernel;
  EXPECT_LT(r.kernel_err_mean, r.codec_err_mean / 10);
}

}  // namespace
}  // namespace kvq
