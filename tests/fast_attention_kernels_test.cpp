// The fast attention kernels (KVQ_ATTENTION=fast, docs/METHODS.md "Fast attention kernels") under their accuracy
// contract: per call, the mean over query rows of the kernel's error against the double-precision reference over
// the decoded cache is at most a tenth of the mean of the codec's own error (that reference against the one over
// the original keys and values), both relative to the original reference's norm, measured here on the same inputs:
// fresh random data and key-like data with outlier channels; decode on every instruction set and causal prefill.
// And the dispatch: fast selects the fast kernel where an instruction set has one, exact the exact one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "attention/isa.hpp"
#include "attention_test_util.hpp"
#include "codec/signed_byte_levels.hpp"
#include "codec/turbo_mse.hpp"
#include "env_override.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using namespace test;  // the shared helpers of attention_test_util.hpp
using detail::Isa;

// The kernel that runs for the pair (kernel: its name without the ISA) under KVQ_ATTENTION=fast and KVQ_ISA = isa:
// avx512bf16's fast kernels take int4 values with int or f16 keys, kivi values with kivi keys and turbo_mse values
// with turbo_mse or int4 keys, avx512vnni's
// int4, int8, turbo_mse:1..3 and kivi keys, avx2's int4, turbo_mse:1..3 and kivi keys (the pairs below have no
// turbo_mse:4 keys); a pair without one on its instruction set runs the next narrower one's (avx512bf16's exact
// kernels are avx512vnni's, avx512vnni's f16 keys avx512's).
std::string fast_kernel_name(Isa isa, const std::string& kernel) {
  const bool int_keys = kernel.rfind("fused_int", 0) == 0, f16_keys = kernel.rfind("fused_f16", 0) == 0;
  const bool turbo_keys = kernel.rfind("fused_turbo_mse", 0) == 0, kivi_keys = kernel.rfind("fused_kivi", 0) == 0;
  const bool int4_values = kernel.size() > 5 && kernel.compare(kernel.size() - 5, 5, "_int4") == 0;
  const bool kivi_values = kernel.size() > 5 && kernel.compare(kernel.size() - 5, 5, "_kivi") == 0;
  const bool turbo_values = kernel.size() > 10 && kernel.compare(kernel.size() - 10, 10, "_turbo_mse") == 0;
  const bool int4_keys = kernel.rfind("fused_int4", 0) == 0;
  if (isa == Isa::avx512bf16 && !(int4_values && (int_keys || f16_keys)) && !(kivi_values && kivi_keys) &&
      !(turbo_values && (turbo_keys || int4_keys)))
    isa = Isa::avx512vnni;
  if (isa == Isa::avx512vnni && !(int_keys || turbo_keys || kivi_keys)) isa = Isa::avx512;
  const bool fast = isa == Isa::avx512bf16 || (isa == Isa::avx512vnni && (int_keys || turbo_keys || kivi_keys)) ||
                    (isa == Isa::avx2 && (int4_keys || turbo_keys || kivi_keys));
  return kernel + "_" + detail::isa_name(isa) + (fast ? "_fast" : "");
}

bool is_fast(const std::string& name) { return name.size() > 5 && name.compare(name.size() - 5, 5, "_fast") == 0; }

// Whether the kernel sums int4 values in bf16 (avx512bf16's fast kernels).
bool bf16_values(const std::string& name) { return name.find("_avx512bf16_fast") != std::string::npos; }

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
                                    {"int4", "kivi:2", "fused_int4_kivi"},
                                    {"f16", "int4", "fused_f16_int4"},
                                    {"turbo_mse:2", "turbo_mse:2", "fused_turbo_mse_turbo_mse"},
                                    {"turbo_mse:3", "turbo_mse:3", "fused_turbo_mse_turbo_mse"},
                                    {"turbo_mse:2", "int4", "fused_turbo_mse_int4"},
                                    {"turbo_mse:3", "f16", "fused_turbo_mse_f16"},
                                    {"int4", "turbo_mse:2", "fused_int4_turbo_mse"},
                                    {"turbo_mse:1", "turbo_mse:4", "fused_turbo_mse_turbo_mse"},
                                    {"kivi:2", "kivi:2", "fused_kivi_kivi"},
                                    {"kivi:4", "kivi:4", "fused_kivi_kivi"},
                                    {"kivi:2", "int4", "fused_kivi_int4"},
                                    {"kivi:4", "f16", "fused_kivi_f16"},
                                    {"kivi:3", "kivi:3", "fused_kivi_kivi"},
                                    {"kivi:3", "kivi:2", "fused_kivi_kivi"},
                                    {"kivi:4", "kivi:3", "fused_kivi_kivi"},
                                    {"kivi:3", "int4", "fused_kivi_int4"},
                                    {"int8", "kivi:3", "fused_int8_kivi"}};
  const std::vector<Shape> shapes{{128, 64, 0, 2, 4, {1000, 65}, true},
                                  {128, 64, 0, 1, 8, {2000}, false},
                                  {64, 128, 128, 2, 3, {700}, true},
                                  {256, 64, 64, 1, 4, {500}, true},
                                  {64, 64, 0, 3, 3, {1000}, true}};  // SmolLM2's heads: one pass of 3 queries
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
        const std::string name = fast_kernel_name(isa, pair.kernel);
        EXPECT_EQ(attention_kernel(sc.cache, 1), name);
        const auto out = decode(sc, q, nullptr);
        const double kernel = summed_distance(out, decoded.out, original.out, d);
        EXPECT_LE(kernel, codec / 10) << "kernel error " << kernel << " against the codec's " << codec << " (sums)";
        if (!is_fast(name)) {
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
  const std::vector<FastPair> pairs{{"int4", "int4", "fused_int4_int4"},
                                    {"int8", "int8", "fused_int8_int8"},
                                    {"turbo_mse:3", "turbo_mse:3", "fused_turbo_mse_turbo_mse"},
                                    {"kivi:2", "kivi:2", "fused_kivi_kivi"},
                                    {"kivi:3", "kivi:3", "fused_kivi_kivi"}};
  for (const FastPair& pair : pairs) {
    SCOPED_TRACE(pair.k);
    const Scenario sc = build(shape, pair.k, pair.v, seed);
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
          EXPECT_EQ(attention_kernel(sc.cache, 1), fast_kernel_name(isa, pair.kernel));
          std::vector<float> out(q.size(), NAN);
          prefill_attention(sc.cache, 1, sc.ids[0], start, chunk, q, out);
          const double kernel_error = summed_distance(out, ref_decoded.out, ref_original.out, d);
          EXPECT_LE(kernel_error, codec_error / 10) << "kernel " << kernel_error << ", codec " << codec_error;
        }
      }
  }
}

// turbo_mse keys' levels as bytes (signed_byte_levels.hpp): each within unit / 2 of unit x its byte, the largest in
// magnitude exactly at +-127, for every bit width and head dimension the codec takes.
TEST(FastAttentionKernels, TurboLevelsRoundToBytesWithinHalfAUnit) {
  for (int bits = 1; bits <= 4; ++bits)
    for (int d : {32, 64, 128, 256, 512}) {
      SCOPED_TRACE("turbo_mse:" + std::to_string(bits) + " d=" + std::to_string(d));
      const auto codec = make_codec("turbo_mse:" + std::to_string(bits), CodecParams{d, 64, 1, Role::key});
      const float* levels = turbo_mse_params(*codec)->nibble_levels;
      const SignedByteLevels b = signed_byte_levels(levels);
      float amax = 0;
      for (int e = 0; e < 16; ++e) amax = std::max(amax, std::fabs(levels[e]));
      EXPECT_FLOAT_EQ(b.unit, amax / 127);
      for (int e = 0; e < 16; ++e) {
        EXPECT_LE(std::fabs(levels[e] - b.unit * b.l[e]), 0.5f * b.unit * (1 + 1e-6f)) << "level " << e;
        EXPECT_LE(std::abs(b.l[e]), 127);
        if (std::fabs(levels[e]) == amax) {
          EXPECT_EQ(std::abs(b.l[e]), 127) << "level " << e;
        }
      }
    }
}

// The extreme products of the turbo_mse keys' integer scores: keys whose first 8 channels take the largest level
// (byte 255 or 1) and a query whose digits there are the most negative low digit (-32 in AVX2's 6-bit digits, where
// the four products that vpmaddubsw's pairs sum in int16 reach 4 x 255 x -32 = -32640 of -32768; 7-bit digits would
// saturate). The scores are then exact but for the other channels' level rounding (at most unit / 2 x the query's 6
// in channel 8, a score error of 1e-3 here), so the output stays within 2e-3 of the decoded cache's.
TEST(FastAttentionKernels, TurboKeysExtremeProductsStayExact) {
  const int d = 64;
  const Shape shape{d, 64, 0, 1, 1, {128}, false};
  const EnvOverride fast("KVQ_ATTENTION", "fast");
  for (int bits = 1; bits <= 3; ++bits) {
    const std::string codec = "turbo_mse:" + std::to_string(bits) + ",rot=identity";
    SCOPED_TRACE(codec);
    const CacheConfig cfg = config_for(shape, codec, "f16", 3);
    Scenario sc{cfg, KVCache(cfg), {}, {}};
    Tokens t{std::vector<float>(128 * d, 0.0f), gaussian_vectors(128, d, 4)};
    for (size_t i = 0; i < 128; ++i)
      for (size_t c = 0; c < 8; ++c) t.keys[i * d + c] = (i % 2 ? -1.0f : 1.0f) / std::sqrt(8.0f);  // unit norm
    sc.ids.push_back(sc.cache.add_sequence());
    sc.tokens.push_back(t);
    append_range(sc.cache, sc.ids[0], 1, t, 0, 128);
    std::vector<float> q(d, 0.0f);
    for (int c = 0; c < 8; ++c) q[c] = -6.0f * 1952 / 1984;  // q / S = -1952: digits -30, -32 (6-bit)
    q[8] = 6.0f;                                             // the largest: S = 6 / 1984
    const Reference ref = reference_decode(sc, q, 1, true);
    for (Isa isa : simd_isas()) {
      SCOPED_TRACE(detail::isa_name(isa));
      const EnvOverride env("KVQ_ISA", detail::isa_name(isa));
      EXPECT_EQ(attention_kernel(sc.cache, 1), fast_kernel_name(isa, "fused_turbo_mse_f16"));
      EXPECT_LE(worst(decode(sc, q, nullptr), ref.out, ref, d, 2e-3, true), 1.0);
    }
  }
}

// kivi keys' integer scores (fused_kernel.hpp, key_scores_kivi_int): per page and query w = q s as two 8-bit digits,
// |w_c - S (256 D0_c + D1_c)| <= S / 2 with S = max_c |w_c| / 32512, the codes (at most 2^b - 1) times the digits
// summed exactly in int32 (AVX2's int16 pair sums reach 4 x 15 x 128 = 7680 at most), the bias <q, m> in fp32. So a
// score (scaled by 1/sqrt(d)) moves by at most delta = max_c |q_c| s_c (2^b - 1) d / (65024 sqrt(d)), each weight by
// a factor within e^(+-2 delta), and the output row by at most expm1(2 delta) sum_t p_t ||v_t||: the bound checked
// here, with s_c bounded from the page's original keys (s = (max - m) / (2^b - 1), m rounded down and s up to fp16:
// at most 2^-10 of the range and the extremes each). Key-like data puts outlier channels into a few large s_c.
TEST(FastAttentionKernels, KiviKeysStayWithinTheQueryDigitsRounding) {
  KVQ_FRESH_SEED();
  const EnvOverride fast("KVQ_ATTENTION", "fast");
  const std::vector<Shape> shapes{{128, 64, 0, 2, 4, {640}, true}, {64, 128, 0, 1, 3, {512}, true},
                                  {256, 64, 0, 1, 8, {320}, false}};
  for (int bits : {2, 3, 4}) {
    const std::string codec = "kivi:" + std::to_string(bits);
    const double levels = (1 << bits) - 1;
    for (size_t si = 0; si < shapes.size(); ++si) {
      const Shape& shape = shapes[si];
      SCOPED_TRACE(codec + ", " + describe(shape));
      const Scenario sc = build(shape, codec, "f16", seed + 100 * si + static_cast<uint64_t>(bits));
      const auto q = queries(shape, 1, seed + 100 * si + 50);
      const size_t d = static_cast<size_t>(shape.d), T = static_cast<size_t>(shape.T), L = shape.lengths[0];
      const size_t G = static_cast<size_t>(shape.G);
      const Reference ref = reference_decode(sc, q, shape.G, true);
      double delta = 0;
      for (size_t h = 0; h < static_cast<size_t>(shape.H); ++h) {
        const Tokens kv = original_head(sc.tokens[0], sc.cfg, L, static_cast<int>(h));
        for (size_t page = 0; page < L / T; ++page)
          for (size_t j = 0; j < G; ++j) {
            const float* qj = q.data() + (h * G + j) * d;
            double wmax = 0;
            for (size_t c = 0; c < d; ++c) {
              double lo = INFINITY, hi = -INFINITY;
              for (size_t t = page * T; t < (page + 1) * T; ++t) {
                lo = std::min(lo, static_cast<double>(kv.keys[t * d + c]));
                hi = std::max(hi, static_cast<double>(kv.keys[t * d + c]));
              }
              const double s = (hi - lo + 0x1p-9 * (std::fabs(hi) + std::fabs(lo))) / levels * (1 + 0x1p-9) + 1e-7;
              wmax = std::max(wmax, std::fabs(static_cast<double>(qj[c])) * s);
            }
            const double dd = static_cast<double>(d);
            delta = std::max(delta, wmax * levels * dd / (65024 * std::sqrt(dd)));
          }
      }
      for (Isa isa : simd_isas()) {
        SCOPED_TRACE(detail::isa_name(isa));
        const EnvOverride env("KVQ_ISA", detail::isa_name(isa));
        const std::string name = attention_kernel(sc.cache, 1);
        EXPECT_EQ(name, fast_kernel_name(isa, "fused_kivi_f16"));
        const double ratio = worst(decode(sc, q, nullptr), ref.out, ref, d, std::expm1(2 * delta) + 1e-5, true);
        EXPECT_LE(ratio, 1.0) << "delta " << delta;
        std::printf("%s %s %s: worst row %.3f of the bound (delta %.2e)\n", codec.c_str(), describe(shape).c_str(),
                    name.c_str(), ratio, delta);
      }
    }
  }
}

// turbo_mse:4 keys have no fast kernel: their level bytes would take up to a tenth of the codec's own error.
// turbo_mse:4 keys score exactly on every instruction set: the pair is a fast kernel only where its values are
// summed in bf16 (avx512bf16, whose turbo_mse:4 keys are the exact kernel's).
TEST(FastAttentionKernels, TurboMse4KeysRunTheExactKernel) {
  const Shape shape{128, 64, 0, 1, 4, {100}, false};
  const Scenario sc = build(shape, "turbo_mse:4", "turbo_mse:4", 5);
  const EnvOverride fast("KVQ_ATTENTION", "fast");
  for (Isa isa : simd_isas()) {
    const EnvOverride env("KVQ_ISA", detail::isa_name(isa));
    const std::string name = attention_kernel(sc.cache, 1);
    EXPECT_EQ(is_fast(name), isa == Isa::avx512bf16) << name;
  }
}

TEST(FastAttentionKernels, QueriesTooSmallToScaleGiveTheExactOutput) {
  // Queries below FLT_MIN x the digits' range were quantized through q / 0, an undefined conversion of inf (x86's
  // conversion gives INT_MIN, whose digits happened to be zero). They take zero digits: their scores are zero to
  // float precision and the output is the values' mean, as the exact kernel gives it (to 1e-5 of the values'
  // size, plus the weights' rounding where int4 values are summed in bf16: Bf16ValuesStayWithinTheWeightsRounding).
  const Shape shape{128, 64, 0, 2, 4, {300}, true};
  for (const char* codec : {"int4", "int8"}) {
    SCOPED_TRACE(codec);
    const Scenario sc = build(shape, codec, codec, 11);
    std::vector<float> q = queries(shape, 1, 12);
    for (float& x : q) x *= 1e-44f;  // subnormal: amax / 127 and amax / 32512 round to 0
    const Reference ref = reference_decode(sc, q, shape.G, true);
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
      const double tol = 1e-5 + (bf16_values(attention_kernel(sc.cache, 1)) ? 0x1p-8 : 0);
      EXPECT_LE(worst(out, exact, ref, 128, tol, false), 1.0);
    }
  }
}

// avx512bf16's fast kernels sum int4 values by bf16 dot products: each weight p_t s_t,g rounded to bf16 (to
// nearest; 8 significant bits, so a relative error of at most 2^-8), the codes exact (24 + c), every product exact
// and the 24 taken out with the same rounded weights. So in the codec's space channel c moves by at most
// 2^-8 sum_t p_t |y_t,c|, and the output row (rotated back, lambda applied) by at most 2^-8 sum_t p_t ||v_t|| in
// norm (Minkowski's inequality): 2^-8 of Reference::magnitude, plus 1e-5 for the fp32 adds. With f16 keys the
// scores are the exact kernels', so the bound holds against the reference (with its fp32 score allowance); with int
// keys against the same keys' fast kernel with fp32 values (KVQ_ISA=avx512vnni: the same query digits and softmax),
// which isolates the values. Returns the worst row's error as a fraction of that bound.
// `rounding`: the bound's relative part (2^-8: the weights alone).
double bf16_value_error(const Scenario& sc, const Shape& shape, const FastPair& pair, const std::vector<float>& q,
                        double rounding = 0x1p-8) {
  const double tol = rounding + 1e-5;
  const size_t d = static_cast<size_t>(shape.d);
  const Reference ref = reference_decode(sc, q, shape.G, true);
  std::vector<float> out;
  {
    const EnvOverride env("KVQ_ISA", "avx512bf16");
    EXPECT_EQ(attention_kernel(sc.cache, 1), pair.kernel + "_avx512bf16_fast");
    out = decode(sc, q, nullptr);
  }
  if (pair.k == "f16") return worst(out, ref.out, ref, d, tol, true);
  const EnvOverride env("KVQ_ISA", "avx512vnni");
  return worst(out, decode(sc, q, nullptr), ref, d, tol, true);
}

TEST(FastAttentionKernels, Bf16ValuesStayWithinTheWeightsRounding) {
  if (!detail::cpu_supports(Isa::avx512bf16)) GTEST_SKIP() << "this CPU lacks AVX512_BF16: no bf16 value kernels";
  KVQ_FRESH_SEED();
  const std::vector<FastPair> pairs{{"f16", "int4", "fused_f16_int4"},
                                    {"int4", "int4", "fused_int4_int4"},
                                    {"int8:64", "int4:16", "fused_int8_int4"},
                                    {"int4:16", "int4:64", "fused_int4_int4"}};
  const std::vector<Shape> shapes{{128, 64, 0, 2, 4, {1000, 65}, true},
                                  {128, 128, 128, 1, 8, {2000}, false},
                                  {64, 64, 64, 2, 7, {700, 1}, true},
                                  {256, 128, 0, 1, 3, {500}, true},
                                  {128, 64, 0, 1, 1, {130}, false}};
  const EnvOverride fast("KVQ_ATTENTION", "fast");
  double seen = 0;
  for (size_t s = 0; s < shapes.size(); ++s)
    for (size_t p = 0; p < pairs.size(); ++p) {
      SCOPED_TRACE(pairs[p].k + "/" + pairs[p].v + ", " + describe(shapes[s]));
      const uint64_t at = seed + 1000 * s + 10 * p;
      const Scenario sc = build(shapes[s], pairs[p].k, pairs[p].v, at);
      const auto q = queries(shapes[s], shapes[s].lengths.size(), at + 7);
      const double ratio = bf16_value_error(sc, shapes[s], pairs[p], q);
      EXPECT_LE(ratio, 1.0);
      seen = std::max(seen, ratio);
    }
  {  // trained int4 values: lambda applied to the outputs after the run
    SCOPED_TRACE("trained int4/int4");
    const Shape shape{128, 64, 0, 2, 4, {500, 77}, true};
    const CacheConfig cfg = config_for(shape, "int4", "int4", seed);
    Scenario sc{cfg, KVCache(cfg), {}, {}};
    const Tokens train = make_tokens(cfg, 512, seed + 1, true);
    sc.cache.train_layer(1, train.keys.data(), train.values.data(), 512 * static_cast<size_t>(shape.H));
    ASSERT_FALSE(sc.cache.value_codec(1).state().empty()) << "training must give the int codec a lambda";
    for (size_t i = 0; i < shape.lengths.size(); ++i) {
      sc.ids.push_back(sc.cache.add_sequence());
      sc.tokens.push_back(make_tokens(cfg, shape.lengths[i], seed + 2 + i, true));
      append_range(sc.cache, sc.ids.back(), 1, sc.tokens.back(), 0, shape.lengths[i]);
    }
    const double ratio = bf16_value_error(sc, shape, {"int4", "int4", "fused_int4_int4"},
                                          queries(shape, shape.lengths.size(), seed + 9));
    EXPECT_LE(ratio, 1.0);
    seen = std::max(seen, ratio);
  }
  std::printf("worst row: %.3f of the bound\n", seen);
}

// avx512bf16's fast kernels sum turbo_mse values (with turbo_mse or int4 keys) by bf16 dot products: each weight
// p_t ||v_t|| and each level c[idx] rounded to bf16 (relative error <= 2^-8 each, so <= 2^-7 + 2^-16 a product), the
// products exact and summed in fp32. In the codec's space channel c moves by at most (2^-7 + 2^-16) sum_t p_t ||v_t||
// |c[idx_t,c]|, and the output row (rotated back) by that factor times sum_t p_t ||v^_t|| in norm, v^_t the decoded
// value: of Reference::magnitude. Against the same keys' kernel with fp32 values (avx512vnni: the same scores).
TEST(FastAttentionKernels, TurboBf16ValuesStayWithinTheRoundings) {
  if (!detail::cpu_supports(Isa::avx512bf16)) GTEST_SKIP() << "this CPU lacks AVX512_BF16: no bf16 value kernels";
  KVQ_FRESH_SEED();
  const std::vector<FastPair> pairs{{"turbo_mse:3", "turbo_mse:3", "fused_turbo_mse_turbo_mse"},
                                    {"turbo_mse:2", "turbo_mse:2", "fused_turbo_mse_turbo_mse"},
                                    {"turbo_mse:1", "turbo_mse:4", "fused_turbo_mse_turbo_mse"},
                                    {"turbo_mse:4", "turbo_mse:2", "fused_turbo_mse_turbo_mse"},
                                    {"int4", "turbo_mse:1", "fused_int4_turbo_mse"}};
  const std::vector<Shape> shapes{{128, 64, 0, 2, 4, {1000, 65}, true},
                                  {128, 128, 128, 1, 8, {2000}, false},
                                  {64, 64, 64, 2, 7, {700, 1}, true},
                                  {256, 64, 0, 1, 3, {500}, true},
                                  {64, 64, 0, 3, 3, {900}, true}};
  const EnvOverride fast("KVQ_ATTENTION", "fast");
  double seen = 0;
  for (size_t s = 0; s < shapes.size(); ++s)
    for (size_t p = 0; p < pairs.size(); ++p) {
      SCOPED_TRACE(pairs[p].k + "/" + pairs[p].v + ", " + describe(shapes[s]));
      const uint64_t at = seed + 1000 * s + 10 * p;
      const Scenario sc = build(shapes[s], pairs[p].k, pairs[p].v, at);
      const auto q = queries(shapes[s], shapes[s].lengths.size(), at + 7);
      const double ratio = bf16_value_error(sc, shapes[s], pairs[p], q, 0x1p-7 + 0x1p-16);
      EXPECT_LE(ratio, 1.0);
      seen = std::max(seen, ratio);
    }
  std::printf("worst row: %.3f of the bound\n", seen);
}

// avx512bf16's fast kernels sum kivi values (with kivi keys) by bf16 dot products as int4 values: the code c as the
// exact bf16 2^b + c, each weight w_t = p_t s_t,g rounded to bf16 (relative error <= 2^-8), the 2^b taken out with the
// same rounded weights and the mins' part sum_t p_t m_t,g in fp32. So channel c moves by at most
// 2^-8 sum_t p_t s_t,g q_t,c = 2^-8 sum_t p_t (v_t,c - m_t,g), and the row by 2^-8 sum_t p_t ||v_t - m_t|| in norm:
// the bound here, against the same keys' fast kernel with fp32 values (avx512vnni: the same scores), with
// m_t,g = the smallest decoded value of the token's group (the codec's min, whose code is 0), plus 1e-5 of the
// row's magnitude for the fp32 adds. Returns the worst row's error as a fraction of that bound.
double kivi_bf16_value_error(const Scenario& sc, const Shape& shape, const std::vector<float>& q, int group) {
  const size_t d = static_cast<size_t>(shape.d), H = static_cast<size_t>(shape.H), G = static_cast<size_t>(shape.G);
  const Reference ref = reference_decode(sc, q, shape.G, true);
  Reference shifted(q.size() / d, d);  // magnitude: sum_t p_t ||v_t - m_t||
  for (size_t s = 0; s < sc.ids.size(); ++s) {
    const size_t n = sc.cache.length(sc.ids[s], 1);
    for (size_t h = 0; h < H; ++h) {
      Tokens kv = decoded_head(sc.cache, sc.ids[s], 1, static_cast<int>(h));
      for (size_t t = 0; t < n; ++t)
        for (size_t c0 = 0; c0 < d; c0 += static_cast<size_t>(group)) {
          float* v = kv.values.data() + t * d + c0;
          const float m = *std::min_element(v, v + group);
          for (int c = 0; c < group; ++c) v[c] -= m;
        }
      for (size_t j = 0; j < G; ++j) {
        const size_t row = (s * H + h) * G + j;
        reference_row(shifted, row, q.data() + row * d, kv, n, n, shape.d);
      }
    }
  }
  std::vector<float> out, fp32;
  {
    const EnvOverride env("KVQ_ISA", "avx512bf16");
    EXPECT_EQ(attention_kernel(sc.cache, 1), "fused_kivi_kivi_avx512bf16_fast");
    out = decode(sc, q, nullptr);
  }
  {
    const EnvOverride env("KVQ_ISA", "avx512vnni");
    fp32 = decode(sc, q, nullptr);
  }
  double ratio = 0;
  for (size_t r = 0; r < out.size() / d; ++r) {
    double err = 0;
    for (size_t c = 0; c < d; ++c) err += std::pow(static_cast<double>(out[r * d + c]) - fp32[r * d + c], 2);
    const double bound = 0x1p-8 * shifted.magnitude[r] + 1e-5 * ref.magnitude[r];
    ratio = std::max(ratio, std::sqrt(err) / bound);
  }
  return ratio;
}

TEST(FastAttentionKernels, KiviBf16ValuesStayWithinTheWeightsRounding) {
  if (!detail::cpu_supports(Isa::avx512bf16)) GTEST_SKIP() << "this CPU lacks AVX512_BF16: no bf16 value kernels";
  KVQ_FRESH_SEED();
  const std::vector<Shape> shapes{{128, 64, 0, 2, 4, {1000, 65}, true},
                                  {128, 128, 128, 1, 8, {2000}, false},
                                  {64, 64, 64, 2, 7, {700, 1}, true},
                                  {256, 64, 0, 1, 3, {500}, true},
                                  {128, 64, 0, 1, 1, {130}, false}};
  const EnvOverride fast("KVQ_ATTENTION", "fast");
  for (const char* codec : {"kivi:2", "kivi:3", "kivi:4"}) {
    double seen = 0;
    for (size_t s = 0; s < shapes.size(); ++s) {
      SCOPED_TRACE(std::string(codec) + ", " + describe(shapes[s]));
      const uint64_t at = seed + 1000 * s + (codec[5] - '0');
      const Scenario sc = build(shapes[s], codec, codec, at);
      const auto q = queries(shapes[s], shapes[s].lengths.size(), at + 7);
      const double ratio = kivi_bf16_value_error(sc, shapes[s], q, 32);
      EXPECT_LE(ratio, 1.0);
      seen = std::max(seen, ratio);
    }
    std::printf("%s: worst row %.3f of the bound\n", codec, seen);
  }
}

TEST(FastAttentionKernels, ExactSelectsTheExactKernel) {
  const Shape shape{128, 64, 0, 1, 4, {100}, false};
  const Scenario sc = build(shape, "int4", "int4", 5);
  const Isa best = detail::active_isa();  // KVQ_ISA where the run sets it (the tests run under KVQ_ISA=avx2 too)
  {
    const EnvOverride exact("KVQ_ATTENTION", "exact");
    const Isa exact_isa = best == Isa::avx512bf16 ? Isa::avx512vnni : best;  // avx512bf16 has fast kernels only
    EXPECT_EQ(attention_kernel(sc.cache, 1), std::string("fused_int4_int4_") + detail::isa_name(exact_isa));
  }
  const EnvOverride fast("KVQ_ATTENTION", "fast");
  EXPECT_EQ(attention_kernel(sc.cache, 1), fast_kernel_name(best, "fused_int4_int4"));
  const EnvOverride unknown("KVQ_ATTENTION", "loose");
  EXPECT_THROW(attention_kernel(sc.cache, 1), Error);
}

}  // namespace
}  // namespace kvq
