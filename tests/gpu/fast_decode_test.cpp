// The fast paths of the CUDA decode kernel (KVQ_ATTENTION=fast, the default; docs/METHODS.md, "Fast attention
// kernels" and "CUDA decode arithmetic"): the integer scores of int, kivi and turbo_mse keys and the fast value path
// (int4, kivi and turbo_mse values: single fp16 weights times the values' factors, kivi's minima by a product of
// their own), under the CPU's fast-kernel contract:
// per call, the summed relative error of the device output against the double-precision reference over the decoded
// cache is at most a tenth of the codec's own error (that reference against the one over the original keys and
// values), measured on the same inputs: Gaussian and key-like data with outlier channels, d = 64/128/256, GQA 1-8,
// fp32 windows. The other tests of this binary run the exact path (exact_attention_environment.cpp) and keep its
// tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "attention_test_util.hpp"
#include "env_override.hpp"
#include "gpu_test.hpp"
#include "kvq/attention.hpp"
#include "kvq/cuda.hpp"
#include "kvq/device.hpp"
#include "kvq/detail/cuda_bench_support.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::EnvOverride;
using test::Shape;
using test::summed_distance;

std::vector<float> device_decode(const KVCache& dev, const std::vector<SeqId>& ids, const std::vector<float>& q) {
  cuda::DeviceFloats q_dev(q.size()), out_dev(q.size());
  q_dev.upload(q);
  out_dev.fill(NAN);  // every element must be written
  decode_attention(dev, 1, ids, {q_dev.data(), q_dev.size()}, {out_dev.data(), out_dev.size()});
  return out_dev.download();
}

struct FastPair {
  std::string k, v, kernel;  // kernel: attention_kernel's name under KVQ_ATTENTION=fast
};

// int4/int4, int8/int8, int4 keys in groups of 16 and 64, int8 keys in groups of 16 and 64, the default build's
// int keys with non-int values (src/cuda/decode_pairs.cmake: int8/turbo_mse:3, int4/turbo_mse:2), int4 values in
// groups of 64 and of 16 (the exact value path beside integer scores), int4 values beside keys without a fast
// path (f16) and beside kivi:4 keys, kivi keys and values (the block's digits and the fast value path: kivi:2 and
// kivi:4 with themselves, kivi:4 / kivi:2, kivi:4 values in groups of 64; in groups of 16 the exact value path; kivi:3
// with itself (values in groups of 32, 64 and 16), kivi:2, int4 and turbo_mse:2 values, kivi:4 / turbo_mse:2), and
// turbo_mse keys and values (turbo_mse:2 and :3 with themselves; turbo_mse:4 / turbo_mse:2, whose 4-bit keys keep
// the fp16 path).
const std::vector<FastPair> kFastPairs = {{"int4", "int4", "cuda_int4_int4_fast"},
                                          {"int8", "int8", "cuda_int8_int8_fast"},
                                          {"int4:16", "int4", "cuda_int4_int4_fast"},
                                          {"int4:64", "int4:16", "cuda_int4_int4_fast"},
                                          {"int4", "int4:64", "cuda_int4_int4_fast"},
                                          {"int8:16", "int8", "cuda_int8_int8_fast"},
                                          {"int8:64", "int4", "cuda_int8_int4_fast"},
                                          {"int8", "turbo_mse:3", "cuda_int8_turbo_mse_fast"},
                                          {"int4", "turbo_mse:2", "cuda_int4_turbo_mse_fast"},
                                          {"f16", "int4", "cuda_f16_int4_fast"},
                                          {"kivi:4", "int4", "cuda_kivi_int4_fast"},
                                          {"kivi:2", "kivi:2", "cuda_kivi_kivi_fast"},
                                          {"kivi:4", "kivi:4", "cuda_kivi_kivi_fast"},
                                          {"kivi:4", "kivi:2", "cuda_kivi_kivi_fast"},
                                          {"kivi:4", "kivi:4,g=64", "cuda_kivi_kivi_fast"},
                                          {"kivi:4", "kivi:4,g=16", "cuda_kivi_kivi_fast"},
                                          {"kivi:3", "kivi:3", "cuda_kivi_kivi_fast"},
                                          {"kivi:3", "kivi:3,g=64", "cuda_kivi_kivi_fast"},
                                          {"kivi:3", "kivi:3,g=16", "cuda_kivi_kivi_fast"},
                                          {"kivi:3", "kivi:2", "cuda_kivi_kivi_fast"},
                                          {"kivi:3", "int4", "cuda_kivi_int4_fast"},
                                          {"kivi:3", "turbo_mse:2", "cuda_kivi_turbo_mse_fast"},
                                          {"kivi:4", "turbo_mse:2", "cuda_kivi_turbo_mse_fast"},
                                          {"turbo_mse:3", "turbo_mse:3", "cuda_turbo_mse_turbo_mse_fast"},
                                          {"turbo_mse:2", "turbo_mse:2", "cuda_turbo_mse_turbo_mse_fast"},
                                          {"turbo_mse:4", "turbo_mse:2", "cuda_turbo_mse_turbo_mse_fast"}};

TEST(CudaFastDecode, ErrorIsAtMostATenthOfTheCodecsOwn) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  const std::vector<Shape> shapes{{128, 64, 0, 2, 4, {1000, 65}, true},
                                  {128, 64, 0, 1, 8, {2000}, false},
                                  {64, 128, 128, 2, 2, {700}, true},
                                  {256, 64, 64, 1, 4, {500}, true},
                                  {128, 128, 128, 3, 1, {1, 300, 3000}, true}};
  const EnvOverride fast("KVQ_ATTENTION", "fast");
  for (size_t s = 0; s < shapes.size(); ++s)
    for (size_t p = 0; p < kFastPairs.size(); ++p) {
      const Shape& shape = shapes[s];
      const FastPair& pair = kFastPairs[p];
      SCOPED_TRACE(pair.k + "/" + pair.v + ", " + test::describe(shape));
      const uint64_t at = seed + 1000 * s + 10 * p;
      const test::Scenario sc = test::build(shape, pair.k, pair.v, at);
      const KVCache dev = sc.cache.to(Device::cuda());
      EXPECT_EQ(attention_kernel(dev, 1), pair.kernel);
      const auto q = test::queries(shape, sc.ids.size(), at + 7);
      const size_t d = static_cast<size_t>(shape.d);
      const test::Reference decoded = test::reference_decode(sc, q, shape.G, true);
      const test::Reference original = test::reference_decode(sc, q, shape.G, false);
      const double codec = summed_distance(decoded.out, original.out, original.out, d);
      ASSERT_GT(codec, 0) << "the codec must lose something for the bound to mean anything";
      const std::vector<float> got = device_decode(dev, sc.ids, q);
      for (float x : got) ASSERT_TRUE(std::isfinite(x));
      const double kernel = summed_distance(got, decoded.out, original.out, d);
      EXPECT_LE(kernel, codec / 10) << "kernel error " << kernel << " against the codec's " << codec << " (sums)";
    }
}

// A query below FLT_MIN x 32512 takes zero digits (S = 1), as on the CPU: its scores are zero to float precision (kivi
// keys: <x, m> alone, as small) and the output is the values' mean, as the exact path gives it. The pairs are the
// default build's (src/cuda/decode_pairs.cmake).
TEST(CudaFastDecode, QueriesTooSmallToScaleGiveTheExactOutput) {
  KVQ_REQUIRE_GPU();
  const Shape shape{128, 64, 64, 2, 4, {300, 70}, true};
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"int4", "int4"}, {"int8", "int4"}, {"int4:16", "int4"}, {"kivi:4", "int4"}, {"kivi:2", "kivi:2"},
      {"kivi:3", "kivi:3"}};
  for (const auto& [key, value] : pairs) {
    SCOPED_TRACE(key + "/" + value);
    const test::Scenario sc = test::build(shape, key, value, 11);
    const KVCache dev = sc.cache.to(Device::cuda());
    std::vector<float> q = test::queries(shape, sc.ids.size(), 12);
    for (float& x : q) x *= 1e-44f;  // subnormal: max|q| / 32512 rounds to 0
    const test::Reference ref = test::reference_decode(sc, q, shape.G, true);
    const EnvOverride fast("KVQ_ATTENTION", "fast");
    const std::vector<float> got = device_decode(dev, sc.ids, q);
    EXPECT_LE(test::vs_reference(got, ref, static_cast<size_t>(shape.d)), 1.0);
  }
}

// KVQ_CUDA_DEPENDENT_LAUNCH=0 launches a call's kernels one after the other, 1 (the default) as dependents: the
// same output either way; any other value is an error naming the variable.
TEST(CudaFastDecode, DependentLaunchesGiveTheSameOutput) {
  KVQ_REQUIRE_GPU();
  const Shape shape{128, 64, 0, 2, 4, {700, 90}, true};
  const test::Scenario sc = test::build(shape, "turbo_mse:3", "turbo_mse:3", 13);
  const KVCache dev = sc.cache.to(Device::cuda());
  const auto q = test::queries(shape, sc.ids.size(), 14);
  std::vector<float> plain, dependent;
  {
    const EnvOverride env("KVQ_CUDA_DEPENDENT_LAUNCH", "0");
    plain = device_decode(dev, sc.ids, q);
  }
  {
    const EnvOverride env("KVQ_CUDA_DEPENDENT_LAUNCH", "1");
    dependent = device_decode(dev, sc.ids, q);
  }
  EXPECT_EQ(plain, dependent);
  const EnvOverride bad("KVQ_CUDA_DEPENDENT_LAUNCH", "yes");
  try {
    device_decode(dev, sc.ids, q);
    ADD_FAILURE() << "KVQ_CUDA_DEPENDENT_LAUNCH=yes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KVQ_CUDA_DEPENDENT_LAUNCH"), std::string::npos) << e.what();
  }
}

// KVQ_ATTENTION selects the path as on the CPU: exact runs the fp16 kernel (named without _fast) and keeps the
// exact tests' 1e-3 bound; int4 keys in groups of 16 have only the integer path, so exact refuses them by name; a
// pair with neither integer scores nor fast values (f16 keys, int4 values in groups of 16) has no fast path; an
// unknown value is an error.
TEST(CudaFastDecode, ExactSelectsTheExactPath) {
  KVQ_REQUIRE_GPU();
  const Shape shape{128, 64, 0, 1, 4, {500}, true};
  const test::Scenario sc = test::build(shape, "int4", "int4", 5);
  const KVCache dev = sc.cache.to(Device::cuda());
  const auto q = test::queries(shape, sc.ids.size(), 6);
  const test::Reference ref = test::reference_decode(sc, q, shape.G, true);
  std::vector<float> exact, fast_out;
  {
    const EnvOverride env("KVQ_ATTENTION", "exact");
    EXPECT_EQ(attention_kernel(dev, 1), "cuda_int4_int4");
    exact = device_decode(dev, sc.ids, q);
    EXPECT_LE(test::worst(exact, ref.out, ref, static_cast<size_t>(shape.d), 1e-3, true), 1.0);
  }
  {
    const EnvOverride env("KVQ_ATTENTION", "fast");
    EXPECT_EQ(attention_kernel(dev, 1), "cuda_int4_int4_fast");
    fast_out = device_decode(dev, sc.ids, q);
  }
  EXPECT_NE(exact, fast_out) << "the two paths round differently";
  {
    const EnvOverride env("KVQ_ATTENTION", "exact");
    const test::Scenario sc16 = test::build(shape, "int4:16", "int4", 7);
    const KVCache dev16 = sc16.cache.to(Device::cuda());
    EXPECT_THROW(attention_kernel(dev16, 1), Error);
    EXPECT_THROW(DecodePlan(dev16, 1, sc16.ids, shape.H * shape.G), Error);
    const test::Scenario other = test::build(shape, "f16", "int4", 8);
    EXPECT_EQ(attention_kernel(other.cache.to(Device::cuda()), 1), "cuda_f16_int4");
  }
  {
    const EnvOverride env("KVQ_ATTENTION", "fast");
    const test::Scenario none = test::build(shape, "f16", "int4:16", 9);  // neither fast path applies
    EXPECT_EQ(attention_kernel(none.cache.to(Device::cuda()), 1), "cuda_f16_int4");
  }
  const EnvOverride unknown("KVQ_ATTENTION", "loose");
  EXPECT_THROW(attention_kernel(dev, 1), Error);
}

}  // namespace
}  // namespace kvq
