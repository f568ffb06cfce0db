// Sliding-window attention (AttentionOptions::window): decode and prefill over the encoded pages and the fp32
// window against the double-precision reference restricted to each query's window, for fused kernels (f16, int4,
// kivi, turbo_mse; the pages a window cuts go through the generic loop) and the generic loop alone (bf16), at head
// dimensions 64 and 256 (Gemma 3).
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "attention_test_util.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::Reference;
using test::Tokens;

// Tokens [lo, hi) of one head, d floats each.
Tokens slice(const Tokens& t, size_t lo, size_t hi, size_t d) {
  Tokens s;
  s.keys.assign(t.keys.begin() + static_cast<std::ptrdiff_t>(lo * d),
                t.keys.begin() + static_cast<std::ptrdiff_t>(hi * d));
  s.values.assign(t.values.begin() + static_cast<std::ptrdiff_t>(lo * d),
                  t.values.begin() + static_cast<std::ptrdiff_t>(hi * d));
  return s;
}

// Reference row for the query at position p (it sees tokens max(0, p + 1 - window) .. p of the head).
void window_row(Reference& ref, size_t row, const float* q, const Tokens& head, size_t p, size_t window, int d) {
  const size_t hi = p + 1, lo = hi > window ? hi - window : 0, ud = static_cast<size_t>(d);
  const Tokens seen = slice(head, lo, hi, ud);
  test::reference_row(ref, row, q, seen, hi - lo, hi - lo, d);
}

void check_windows(const test::Shape& shape, const std::string& codec, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << codec << " d=" << shape.d << " R=" << shape.R << " G=" << shape.G);
  const test::Scenario sc = test::build(shape, codec, codec, seed);
  const size_t L = shape.lengths[0], d = static_cast<size_t>(shape.d), hq = static_cast<size_t>(shape.H * shape.G);
  std::vector<Tokens> heads;
  for (int h = 0; h < shape.H; ++h) heads.push_back(test::decoded_head(sc.cache, sc.ids[0], 1, h));
  ThreadPool two(2);
  for (size_t window : {1, 50, 64, 100, 1000}) {
    SCOPED_TRACE(testing::Message() << "window " << window);
    AttentionOptions options;
    options.window = window;
    // Decode: the last position.
    const auto q = gaussian_vectors(hq, shape.d, seed + window);
    std::vector<float> out(q.size(), NAN);
    decode_attention(sc.cache, 1, sc.ids, q, out, options, &two);
    Reference ref(hq, d);
    for (size_t j = 0; j < hq; ++j)
      window_row(ref, j, q.data() + j * d, heads[j / static_cast<size_t>(shape.G)], L - 1, window, shape.d);
    EXPECT_LE(test::vs_reference(out, ref, d), 1.0) << "decode";
    // Prefill chunks: each position with its own window start.
    for (size_t chunk : {7, 64, 100})
      for (size_t start : {size_t{0}, size_t{70}, L - chunk}) {
        SCOPED_TRACE(testing::Message() << "chunk " << chunk << " at " << start);
        const auto qc = gaussian_vectors(chunk * hq, shape.d, seed + start * 7 + chunk);
        std::vector<float> oc(qc.size(), NAN);
        prefill_attention(sc.cache, 1, sc.ids[0], start, chunk, qc, oc, options, chunk % 2 ? &two : nullptr);
        Reference rc(chunk * hq, d);
        for (size_t p = 0; p < chunk; ++p)
          for (size_t j = 0; j < hq; ++j)
            window_row(rc, p * hq + j, qc.data() + (p * hq + j) * d, heads[j / static_cast<size_t>(shape.G)],
                       start + p, window, shape.d);
        EXPECT_LE(test::vs_reference(oc, rc, d), 1.0) << "prefill";
      }
  }
}

TEST(AttentionWindow, FusedKernelsMatchTheWindowedReference) {
  KVQ_FRESH_SEED();
  check_windows({64, 64, 0, 2, 2, {300}, true}, "f16", seed);
  check_windows({64, 64, 64, 1, 4, {300}, true}, "int4", seed + 1);
  check_windows({64, 64, 0, 1, 4, {300}, true}, "kivi:4", seed + 2);
  check_windows({64, 64, 0, 1, 4, {300}, true}, "turbo_mse:4", seed + 3);
}

TEST(AttentionWindow, GenericLoopMatchesTheWindowedReference) {
  KVQ_FRESH_SEED();
  check_windows({64, 64, 0, 2, 2, {300}, true}, "bf16", seed);
}

// Gemma 3: heads of 256 channels, one kv head for four query heads.
TEST(AttentionWindow, HeadDimension256) {
  KVQ_FRESH_SEED();
  check_windows({256, 64, 64, 1, 4, {200}, true}, "int8", seed);
}

}  // namespace
}  // namespace kvq
