// The fast attention kernels (KVQ_ATTENTION=fast, docs/METHODS.md "Fast attention kernels") under their accuracy
// contract: per call, the mean over query rows of the kernel's error against the double-precision reference over
// the decoded cache is at most a tenth of the mean of the codec's own error (that reference against the one over
// the original keys and values), both relative to the original reference's norm, measured here on the same inputs:
// fresh random data and key-like data with outlier channels; decode on every instruction set and causal prefill.
// And the dispatch: fast selects the fast kernel where an instruction set has one, exact the exact one.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention/isa.hpp"
#include "attention_test_util.hpp"
#include "env_override.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using namespace test;  // the shared helpers of attention_test_util.hpp
using detail::Isa;

// Whether `isa` has a fast kernel for the pair (the others run the exact one under KVQ_ATTENTION=fast):
// avx512vnni for int4 and int8 keys, avx2 for int4 keys.
bool has_fast_kernel(Isa isa, const std::string& kernel) {
  if (isa == Isa::avx512vnni) return kernel.rfind("fused_int", 0) == 0;
  return isa == Isa::avx2 && kernel.rfind("fused_int4", 0) == 0;
}

// The SIMD instruction sets this CPU runs.
std::vector<Isa> simd_isas() {
  std::vector<Isa> isas;
  for (Isa isa : detail::kAllIsas)
    if (isa != Isa::scalar && detail::cpu_supports(isa)) isas.push_back(isa);
  return isas;
}

struct FastPair {
  std::string k, v, kernel;  // kernel: the name without the ISA
};

TEST(FastAttentionKernels, ErrorIsAtMostATenthOfTheCodecsOwnOnEveryIsa) {
  KVQ_FRESH_SEED();
  const std::vector<FastPair> pairs{{"int4", "int4", "fused_int4_int4"},
                                    {"int8", "int8", "fused_int8_int8"},
                                    {"int4:16", "f16", "fused_int4_f16"},
                                    {"int8:64", "int4:16", "fused_int8_int4"},
                                    {"int4:64,rot=identity", "int8:16", "fused_int4_int8"},
                                    {"int4", "kivi:2", "fused_int4_kivi"}};
  const std::vector<Shape> shapes{{128, 64, 0, 2, 4, {1000, 65}, true},
                                  {128, 64, 0, 1, 8, {2000}, false},
                                  {64, 128, 128, 2, 3, {700}, true},
                                  {256, 64, 64, 1, 4, {500}, true}};
  std::vector<Isa> isas = simd_isas();
  isas.insert(isas.begin(), Isa::scalar);
  const EnvOverride fast("KVQ_ATTENTION", "fast");
  for (size_t s = 0; s < shapes.size(); ++s)
    for (size_t p = 0; p < pairs.size(); ++p) {
      const Shape& shape = shapes[s];
      const FastPair& pair = pairs[p];
      SCOPED_TRACE(pair.k + "/" + pair.v + ", " + describe(shape));
      const uint64_t at = seed + 1000 * s + 10 * p;
      const Scenario sc = build(shape, pair.k, pair.v, at);
      const auto q = queries(shape, shape.lengths.size(), at + 7);
      const size_t d = static_cast<size_t>(shape.d);
      const Reference decoded = reference_decode(sc, q, shape.G, true);
      const Reference original = reference_decode(sc, q, shape.G, false);
      const double codec = summed_distance(decoded.out, original.out, original.out, d);
      ASSERT_GT(codec, 0) << "the codec must lose something for the bound to mean anything";
      for (Isa isa : isas) {
        SCOPED_TRACE(detail::isa_name(isa));
        const EnvOverride env("KVQ_ISA", detail::isa_name(isa));
        const bool fast_kernel = has_fast_kernel(isa, pair.kernel);
        EXPECT_EQ(attention_kernel(sc.cache, 1),
                  pair.kernel + "_" + detail::isa_name(isa) + (fast_kernel ? "_fast" : ""));
        const auto out = decode(sc, q, nullptr);
        const double kernel = summed_distance(out, decoded.out, original.out, d);
        EXPECT_LE(kernel, codec / 10) << "kernel error " << kernel << " against the codec's " << codec << " (sums)";
        if (!fast_kernel) {
          EXPECT_LE(vs_reference(out, decoded, d), 1.0) << "an exact kernel keeps 1e-5";
        }
      }
    }
}

// Causal prefill runs the same fast kernels with a causal limit per query: the same bound, per chunk.
TEST(FastAttentionKernels, PrefillErrorIsAtMostATenthOfTheCodecsOwn) {
  KVQ_FRESH_SEED();
  const Shape shape{128, 64, 0, 2, 4, {700}, true};
  const size_t L = shape.lengths[0], d = static_cast<size_t>(shape.d), hq = static_cast<size_t>(shape.H * shape.G);
  const EnvOverride fast("KVQ_ATTENTION", "fast");
  for (const char* codec : {"int4", "int8"}) {
    SCOPED_TRACE(codec);
    const Scenario sc = build(shape, codec, codec, seed);
    std::vector<Tokens> decoded, original;
    for (int h = 0; h < shape.H; ++h) {
      decoded.push_back(decoded_head(sc.cache, sc.ids[0], 1, h));
      original.push_back(original_head(sc.tokens[0], sc.cfg, L, h));
    }
    for (size_t chunk : {size_t{64}, size_t{100}})
      for (size_t start : {size_t{0}, size_t{300}, L - chunk}) {
        SCOPED_TRACE("chunk " + std::to_string(chunk) + " at " + std::to_string(start));
        const auto q = gaussian_vectors(chunk * hq, shape.d, seed + start * 7 + chunk);
        Reference ref_decoded(chunk * hq, d), ref_original(chunk * hq, d);
        for (size_t p = 0; p < chunk; ++p)
          for (size_t j = 0; j < hq; ++j) {
            const size_t row = p * hq + j, h = j / static_cast<size_t>(shape.G);
            reference_row(ref_decoded, row, q.data() + row * d, decoded[h], L, start + p + 1, shape.d);
            reference_row(ref_original, row, q.data() + row * d, original[h], L, start + p + 1, shape.d);
          }
        const double codec_error = summed_distance(ref_decoded.out, ref_original.out, ref_original.out, d);
        for (Isa isa : simd_isas()) {
          SCOPED_TRACE(detail::isa_name(isa));
          const EnvOverride env("KVQ_ISA", detail::isa_name(isa));
          if (has_fast_kernel(isa, std::string("fused_") + codec)) {
            EXPECT_NE(attention_kernel(sc.cache, 1).find("_fast"), std::string::npos) << "a fast kernel runs";
          }
          std::vector<float> out(q.size(), NAN);
          prefill_attention(sc.cache, 1, sc.ids[0], start, chunk, q, out);
          const double kernel_error = summed_distance(out, ref_decoded.out, ref_original.out, d);
          EXPECT_LE(kernel_error, codec_error / 10) << "kernel " << kernel_error << ", codec " << codec_error;
        }
      }
  }
}

TEST(FastAttentionKernels, QueriesTooSmallToScaleGiveTheExactOutput) {
  // Queries below FLT_MIN x the digits' range were quantized through q / 0, an undefined conversion of inf (x86's
  // conversion gives INT_MIN, whose digits happened to be zero). They take zero digits: their scores are zero to
  // float precision and the output is the values' mean, as the exact kernel gives it.
  const Shape shape{128, 64, 0, 2, 4, {300}, true};
  for (const char* codec : {"int4", "int8"}) {
    SCOPED_TRACE(codec);
    const Scenario sc = build(shape, codec, codec, 11);
    std::vector<float> q = queries(shape, 1, 12);
    for (float& x : q) x *= 1e-44f;  // subnormal: amax / 127 and amax / 32512 round to 0
    std::vector<float> exact;
    {
      const EnvOverride env("KVQ_ATTENTION", "exact");
      exact = decode(sc, q, nullptr);
    }
    const EnvOverride fast("KVQ_ATTENTION", "fast");
    for (Isa isa : simd_isas()) {
      SCOPED_TRACE(detail::isa_name(isa));
      const EnvOverride env("KVQ_ISA", detail::isa_name(isa));
      const auto out = decode(sc, q, nullptr);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], exact[i], 1e-5f * (1 + std::fabs(exact[i])));
    }
  }
}

TEST(FastAttentionKernels, ExactSelectsTheExactKernel) {
  const Shape shape{128, 64, 0, 1, 4, {100}, false};
  const Scenario sc = build(shape, "int4", "int4", 5);
  const std::string best = detail::isa_name(detail::best_isa());
  {
    const EnvOverride exact("KVQ_ATTENTION", "exact");
    EXPECT_EQ(attention_kernel(sc.cache, 1), "fused_int4_int4_" + best);
  }
  const EnvOverride fast("KVQ_ATTENTION", "fast");
  const bool fast_kernel = has_fast_kernel(detail::best_isa(), "fused_int4_int4");
  EXPECT_EQ(attention_kernel(sc.cache, 1), "fused_int4_int4_" + best + (fast_kernel ? "_fast" : ""));
  const EnvOverride unknown("KVQ_ATTENTION", "loose");
  EXPECT_THROW(attention_kernel(sc.cache, 1), Error);
}

}  // namespace
}  // namespace kvq
