// The fused page-loop kernels of every instruction set this CPU has, against the scalar kernel and against the
// double-precision reference over the decoded cache (the tolerances of attention_test.cpp): GQA 1..8, d 64/128/256,
// T 64/128, R 0/T, lengths that are not multiples of T, empty sequences, several sequences per call, trained int4
// lambdas, causal prefill, split-K. And the dispatch: KVQ_ISA chooses the kernel, an unknown or unavailable ISA is
// an error, codec pairs without a fused kernel run the generic loop.
#include <gtest/gtest.h>

#include <cstring>
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

// KVQ_ISA set for a scope, then restored.
class IsaOverride : public EnvOverride {
 public:
  explicit IsaOverride(const char* value) : EnvOverride("KVQ_ISA", value) {}
};

// The SIMD instruction sets this CPU runs exact kernels of (the scalar kernel is the reference): avx2, avx512 and
// avx512vnni on x86, neon on AArch64. avx512bf16 has fast kernels only (its exact ones are avx512vnni's).
std::vector<Isa> simd_isas() {
  std::vector<Isa> isas;
  for (Isa isa : detail::kAllIsas)
    if (isa != Isa::scalar && isa != Isa::avx512bf16 && detail::cpu_supports(isa)) isas.push_back(isa);
  return isas;
}

// The instruction set whose exact kernels run under KVQ_ISA = isa.
Isa exact_isa(Isa isa) { return isa == Isa::avx512bf16 ? Isa::avx512vnni : isa; }

struct Pair {
  std::string k, v, kernel;  // kernel: the name without the ISA
};

const std::vector<Pair>& fused_pairs() {
  static const std::vector<Pair> pairs{{"f16", "f16", "fused_f16_f16"},
                                       {"int4", "int4", "fused_int4_int4"},
                                       {"int8", "int8", "fused_int8_int8"},
                                       {"int4:16", "f16", "fused_int4_f16"},
                                       {"f16", "int4:64", "fused_f16_int4"},
                                       {"int8:64", "int4:16", "fused_int8_int4"},
                                       {"int4:64,rot=identity", "int8:16", "fused_int4_int8"},
                                       {"kivi:2", "kivi:2", "fused_kivi_kivi"},
                                       {"kivi:4", "kivi:4,g=16", "fused_kivi_kivi"},
                                       {"kivi:2", "f16", "fused_kivi_f16"},
                                       {"int4", "kivi:2,g=64", "fused_int4_kivi"},
                                       {"f16", "kivi:4", "fused_f16_kivi"},
                                       {"kivi:3", "kivi:3", "fused_kivi_kivi"},
                                       {"kivi:3", "kivi:2,g=16", "fused_kivi_kivi"},
                                       {"kivi:4", "kivi:3,g=64", "fused_kivi_kivi"},
                                       {"kivi:3", "int8", "fused_kivi_int8"},
                                       {"int4", "kivi:3", "fused_int4_kivi"},
                                       {"kivi:3", "turbo_prod:3", "fused_kivi_turbo_prod"},
                                       {"turbo_mse:2", "kivi:3,g=16", "fused_turbo_mse_kivi"},
                                       {"qjl", "kivi:3", "fused_qjl_kivi"},
                                       {"turbo_mse:3", "turbo_mse:3", "fused_turbo_mse_turbo_mse"},
                                       {"turbo_mse:2", "turbo_mse:4", "fused_turbo_mse_turbo_mse"},
                                       {"turbo_mse:4,rot=srft", "int4", "fused_turbo_mse_int4"},
                                       {"int8", "turbo_mse:2", "fused_int8_turbo_mse"},
                                       {"kivi:2", "turbo_mse:3", "fused_kivi_turbo_mse"},
                                       {"turbo_prod:3", "turbo_mse:3", "fused_turbo_prod_turbo_mse"},
                                       {"turbo_prod:3,rot=srft", "int4", "fused_turbo_prod_int4"},
                                       {"turbo_mse:1", "turbo_mse:1", "fused_turbo_mse_turbo_mse"},
                                       {"turbo_prod:2", "turbo_prod:2", "fused_turbo_prod_turbo_prod"},
                                       {"turbo_prod:4", "turbo_mse:1", "fused_turbo_prod_turbo_mse"},
                                       {"f16", "turbo_prod:3", "fused_f16_turbo_prod"},
                                       {"kivi:4", "turbo_prod:4,rot=srft", "fused_kivi_turbo_prod"},
                                       {"qjl", "turbo_prod:3", "fused_qjl_turbo_prod"},
                                       {"qjl:256", "int8", "fused_qjl_int8"}};
  return pairs;
}

// The kernel that runs for the pair under KVQ_ISA = isa: avx512vnni has int keys only, f16 and kivi keys fall back
// to avx512.
std::string kernel_name(const Pair& pair, Isa isa) {
  const bool int_keys = pair.kernel.rfind("fused_int", 0) == 0;
  return pair.kernel + "_" + detail::isa_name(isa == Isa::avx512vnni && !int_keys ? Isa::avx512 : isa);
}

// Decode under KVQ_ISA = isa; checks that the pair's fused kernel of that ISA runs.
std::vector<float> decode_with(const Scenario& sc, const Pair& pair, Isa isa, const std::vector<float>& q,
                               ThreadPool* pool) {
  const IsaOverride env(detail::isa_name(isa));
  EXPECT_EQ(attention_kernel(sc.cache, 1), kernel_name(pair, isa));
  return decode(sc, q, pool);
}

// Every SIMD kernel against the scalar one and the reference, and the scalar one against the reference.
void check_decode(const Scenario& sc, const Pair& pair, const Shape& shape, const std::vector<float>& q,
                  ThreadPool* pool) {
  const Reference ref = reference_decode(sc, q, shape.G, true);
  const size_t d = static_cast<size_t>(shape.d);
  const auto scalar = decode_with(sc, pair, Isa::scalar, q, pool);
  EXPECT_LE(vs_reference(scalar, ref, d), 1.0) << "scalar kernel";
  for (Isa isa : simd_isas()) {
    const auto out = decode_with(sc, pair, isa, q, pool);
    EXPECT_LE(vs_reference(out, ref, d), 1.0) << detail::isa_name(isa);
    EXPECT_LE(worst(out, scalar, ref, d, 1e-5, true), 1.0) << detail::isa_name(isa) << " vs scalar";
  }
}

TEST(AttentionKernels, DecodeOfEveryIsaMatchesScalarKernelAndReference) {
  KVQ_FRESH_SEED();
  const std::vector<Shape> shapes{
      {64, 64, 0, 2, 1, {1, 63, 65, 0}, true},    {128, 128, 128, 1, 4, {1000, 200}, true},
      {256, 64, 64, 1, 8, {65, 130}, true},       {128, 64, 0, 2, 4, {1000, 0, 1}, true},
      {128, 128, 0, 1, 3, {300}, false},          {64, 128, 128, 2, 6, {1000}, true},
      {128, 64, 64, 1, 7, {129, 64}, true},       {64, 64, 0, 3, 3, {1000, 130}, true},  // SmolLM2: passes of 3
  };
  ThreadPool two(2);
  for (size_t s = 0; s < shapes.size(); ++s)
    for (size_t p = 0; p < fused_pairs().size(); ++p) {
      const Shape& shape = shapes[s];
      const Pair& pair = fused_pairs()[p];
      SCOPED_TRACE(pair.k + "/" + pair.v + ", " + describe(shape));
      const uint64_t trial = seed + 100 * s + p;
      const Scenario sc = build(shape, pair.k, pair.v, trial);
      check_decode(sc, pair, shape, queries(shape, shape.lengths.size(), trial + 1), (s + p) % 2 ? &two : nullptr);
    }
}

// Trained int codecs: lambda folded into the queries (keys) and applied after the page loop (values); learned
// rotations in the codec's maps.
TEST(AttentionKernels, TrainedIntLambdasMatchReference) {
  KVQ_FRESH_SEED();
  const Shape shape{128, 64, 0, 2, 4, {500, 77}, true};
  for (const Pair& pair : {Pair{"int4", "int4", "fused_int4_int4"}, Pair{"int8", "int8", "fused_int8_int8"},
                           Pair{"int4,learn=8", "int8:16,learn=4", "fused_int4_int8"}}) {
    SCOPED_TRACE(pair.k);
    const CacheConfig cfg = config_for(shape, pair.k, pair.v, seed);
    Scenario sc{cfg, KVCache(cfg), {}, {}};
    const Tokens train = make_tokens(cfg, 512, seed + 1, true);
    sc.cache.train_layer(1, train.keys.data(), train.values.data(), 512 * static_cast<size_t>(shape.H));
    ASSERT_FALSE(sc.cache.key_codec(1).state().empty()) << "training must give the int codec a lambda";
    for (size_t i = 0; i < shape.lengths.size(); ++i) {
      sc.ids.push_back(sc.cache.add_sequence());
      sc.tokens.push_back(make_tokens(cfg, shape.lengths[i], seed + 2 + i, true));
      append_range(sc.cache, sc.ids.back(), 1, sc.tokens.back(), 0, shape.lengths[i]);
    }
    check_decode(sc, pair, shape, queries(shape, shape.lengths.size(), seed + 9), nullptr);
  }
}

// f16 blocks read by integer operations: zeros, subnormal halves and the largest halves decode exactly. Small and
// large extremes apart, so that the large ones do not set the tolerance of the small ones.
TEST(AttentionKernels, F16ExtremesDecodeExactly) {
  KVQ_FRESH_SEED();
  const Shape shape{64, 64, 0, 1, 4, {200}, false};
  const Pair pair{"f16", "f16", "fused_f16_f16"};
  const std::vector<float> small{0.0f, -0.0f, 6e-8f, -3e-6f, 6.1e-5f, -1e-3f}, large{65504.0f, -65504.0f, 60000.0f};
  for (const auto* extremes : {&small, &large}) {
    SCOPED_TRACE(extremes == &small ? "zeros and subnormals" : "the largest halves");
    const CacheConfig cfg = config_for(shape, pair.k, pair.v, seed);
    Scenario sc{cfg, KVCache(cfg), {}, {}};
    Tokens t = make_tokens(cfg, 200, seed + 1, false);
    for (size_t i = 0; i < t.keys.size(); i += 3) t.keys[i] = (*extremes)[i % extremes->size()];
    for (size_t i = 0; i < t.values.size(); i += 2) t.values[i] = (*extremes)[i % extremes->size()];
    sc.ids.push_back(sc.cache.add_sequence());
    sc.tokens.push_back(t);
    append_range(sc.cache, sc.ids.back(), 1, t, 0, 200);
    auto q = queries(shape, 1, seed + 2);
    if (extremes == &large)
      for (float& x : q) x *= 1e-5f;  // scores of a few units
    check_decode(sc, pair, shape, q, nullptr);
  }
}

// Causal prefill runs the same kernels: query rows n_pos x G in passes of up to 8, masks inside pages; kivi:2..4,
// turbo_mse, turbo_prod and qjl blocks among them.
TEST(AttentionKernels, PrefillOfEveryIsaMatchesCausalReference) {
  KVQ_FRESH_SEED();
  const size_t end = std::numeric_limits<size_t>::max();
  std::vector<Isa> isas = simd_isas();
  isas.push_back(Isa::scalar);
  for (Isa isa : isas) {
    SCOPED_TRACE(detail::isa_name(isa));
    const IsaOverride env(detail::isa_name(isa));
    check_prefill({64, 64, 0, 1, 4, {200}, true}, "int4", "int4", seed, {1, 7, 64, 100}, {0, 63, 130, end});
    check_prefill({128, 128, 128, 2, 3, {333}, true}, "f16", "int4", seed + 1, {7, 100}, {5, 128, end});
    check_prefill({64, 64, 64, 1, 1, {150}, false}, "int4", "f16", seed + 2, {1, 64}, {0, end});
    check_prefill({128, 64, 0, 1, 2, {150}, true}, "int8", "int8", seed + 3, {7, 64}, {0, end});
    check_prefill({64, 64, 0, 1, 4, {150}, true}, "kivi:2", "turbo_mse:3", seed + 4, {7, 64}, {0, 63, end});
    check_prefill({128, 64, 64, 1, 2, {200}, true}, "turbo_prod:3", "kivi:4", seed + 5, {1, 100}, {5, end});
    check_prefill({64, 64, 0, 1, 4, {150}, true}, "qjl", "turbo_prod:2", seed + 6, {7, 64}, {0, 63, end});
    check_prefill({128, 64, 0, 1, 2, {150}, false}, "turbo_prod:4", "turbo_mse:1", seed + 7, {1, 64}, {5, end});
    check_prefill({64, 64, 0, 1, 4, {150}, true}, "kivi:3", "kivi:3", seed + 8, {7, 64}, {0, 63, end});
  }
}

// Split-K pieces each run the fused kernel from empty states; merged, they equal the unsplit call.
TEST(AttentionKernels, SplitKAndThreadPoolsAgree) {
  KVQ_FRESH_SEED();
  const Shape shape{128, 64, 64, 2, 4, {1000, 130, 0, 64}, true};
  const Scenario sc = build(shape, "int4", "int4", seed);
  const auto q = queries(shape, shape.lengths.size(), seed + 1);
  const Reference ref = reference_decode(sc, q, shape.G, true);
  const auto base = decode(sc, q, nullptr, 1);
  EXPECT_LE(vs_reference(base, ref, 128), 1.0);
  ThreadPool two(2);
  for (int splits : {0, 3, 1000}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    // Splits change only the order of the fp32 sums (the scores are the same): 1e-5 of the output's magnitude,
    // where a wrong merge is off by 1e-3 or more (the scalar kernel's sums, unblocked, differ by up to 4e-6).
    EXPECT_LE(worst(decode(sc, q, &two, splits), base, ref, 128, 1e-5, false), 1.0);
  }
}

TEST(AttentionKernelsDispatch, KvqIsaChoosesTheKernel) {
  const Shape shape{64, 64, 0, 1, 2, {70}, true};
  const Scenario sc = build(shape, "int4", "int4", 1);
  {
    const IsaOverride unset(nullptr);
    EXPECT_EQ(attention_isa(), detail::isa_name(detail::best_isa()));
    EXPECT_EQ(attention_kernel(sc.cache, 1),
              std::string("fused_int4_int4_") + detail::isa_name(exact_isa(detail::best_isa())));
  }
  for (Isa isa : detail::kAllIsas) {
    const IsaOverride env(detail::isa_name(isa));
    if (detail::cpu_supports(isa)) {
      EXPECT_EQ(attention_isa(), detail::isa_name(isa));
      EXPECT_EQ(attention_kernel(sc.cache, 1), std::string("fused_int4_int4_") + detail::isa_name(exact_isa(isa)));
    } else {
      EXPECT_THROW(attention_isa(), Error) << detail::isa_name(isa) << " is not on this CPU";
    }
  }
}

// x86 and AArch64 each lack the other's instruction sets: asking for one is an error that names what this CPU has.
TEST(AttentionKernelsDispatch, UnavailableIsaNamesTheOnesThisCpuHas) {
  const Isa foreign = detail::cpu_supports(Isa::neon) ? Isa::avx2 : Isa::neon;
  ASSERT_FALSE(detail::cpu_supports(foreign));
  std::string has;
  for (Isa isa : detail::kAllIsas)
    if (detail::cpu_supports(isa)) has += (has.empty() ? "" : ", ") + std::string(detail::isa_name(isa));
  try {
    detail::resolve_isa(detail::isa_name(foreign));
    FAIL() << detail::isa_name(foreign) << " resolved on a CPU without it";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::string("KVQ_ISA=") + detail::isa_name(foreign)), std::string::npos) << what;
    EXPECT_NE(what.find("it has " + has + ")"), std::string::npos) << what;
  }
}

TEST(AttentionKernelsDispatch, UnknownIsaIsAnError) {
  const Shape shape{64, 64, 0, 1, 2, {70}, true};
  const Scenario sc = build(shape, "f16", "f16", 1);
  const auto q = queries(shape, 1, 2);
  std::vector<float> out(q.size());
  const IsaOverride env("avx1024");
  EXPECT_THROW(attention_isa(), Error);
  EXPECT_THROW(attention_kernel(sc.cache, 1), Error);
  EXPECT_THROW(decode_attention(sc.cache, 1, sc.ids, q, out), Error);
  try {
    detail::resolve_isa("sse9");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown instruction set"), std::string::npos) << e.what();
  }
}

TEST(AttentionKernelsDispatch, PairsWithoutAFusedKernelRunTheGenericLoop) {
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"f32", "f16"},
           {"f16", "bf16"},
           {"int8", "f32"},
           {"turbo_rvq:2", "f16"},
           {"qjl:40", "kivi:4"},  // sign tiles of 32 rows: m a multiple of 32 only
           {"int4", "qjl"}}) {    // qjl values
    CacheConfig cfg;
    cfg.key_codec = k;
    cfg.value_codec = v;
    const KVCache cache(cfg);
    EXPECT_EQ(attention_kernel(cache, 0), "generic") << k << "/" << v;
  }
}

}  // namespace
}  // namespace kvq
