// The batched device append's bookkeeping (src/cuda/append_plan.hpp) on the host: a model of what the device does
// with the plan (pages read from each sequence's stream, tokens gathered into the windows or through the scratch and
// moved by the commit, page ids taken from the free list in batch order) must leave exactly the pages, page ids and
// windows of one KVCache::append per sequence, here with f32 codecs (whose blocks are the tokens themselves). And
// the kernels' error positions must name the right sequence and token.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cache_test_util.hpp"
#include "cuda/append_plan.hpp"
#include "kvq/cache.hpp"
#include "test_seed.hpp"

namespace kvq::cuda::detail {
namespace {

constexpr size_t kT = 64, kH = 2, kD = 16;

// One sequence as the device cache holds it: window [keys H][slots][d] then values, block table.
struct ModelSequence {
  std::vector<float> window;
  size_t used = 0;
  std::vector<PageId> pages;
};

struct Model {
  size_t R, slots;
  std::vector<ModelSequence> seqs;
  std::vector<PageId> free;  // the next page handed out at the back
  std::vector<std::vector<uint8_t>> pool;
  size_t page_bytes;

  Model(size_t n_seqs, size_t R_, size_t capacity, size_t page_bytes_)
      : R(R_), slots(R_ + kT - 1), seqs(n_seqs), pool(capacity), page_bytes(page_bytes_) {
    for (ModelSequence& s : seqs) s.window.assign(2 * kH * slots * kD, 0.0f);
    for (size_t p = capacity; p-- > 0;) free.push_back(static_cast<PageId>(p));
  }

  // The batched append as the device runs it: keys and values [sum n][H][d].
  void append(const std::vector<float>& keys, const std::vector<float>& values, const std::vector<size_t>& n) {
    std::vector<SequenceChunk> chunks;
    for (size_t i = 0; i < seqs.size(); ++i) chunks.push_back({seqs[i].used, n[i], false});
    const AppendPlan plan = plan_append(chunks, kT, R, false);
    ASSERT_LE(plan.pages, free.size());
    std::vector<float> scratch(2 * kH * kD * plan.scratch_tokens, -1.0f);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const SequencePlan& p = plan.seqs[i];
      ModelSequence& s = seqs[i];
      auto token = [&](size_t role, size_t idx, size_t h) {
        const std::vector<float>& fresh = role == 0 ? keys : values;
        return idx < p.used ? &s.window[((role * kH + h) * slots + idx) * kD]
                            : &fresh[((p.fresh_first + idx - p.used) * kH + h) * kD];
      };
      for (size_t j = 0; j < p.n_pages; ++j) {  // the encode kernel: an f32 block is the page's tokens
        std::vector<uint8_t>& page = pool[free[free.size() - 1 - (p.first_page + j)]];
        page.assign(page_bytes, 0);
        for (size_t role = 0; role < 2; ++role)
          for (size_t h = 0; h < kH; ++h)
            for (size_t t = 0; t < kT; ++t)
              std::memcpy(page.data() + ((role * kH + h) * kT + t) * kD * 4, token(role, j * kT + t, h), kD * 4);
      }
      for (size_t k = 0; k < p.gather_count; ++k)  // the gather
        for (size_t role = 0; role < 2; ++role)
          for (size_t h = 0; h < kH; ++h) {
            float* to = p.through_scratch
                            ? &scratch[(2 * p.scratch_first + role * p.kept) * kH * kD + (h * p.kept + k) * kD]
                            : &s.window[((role * kH + h) * slots + p.window_slot + k) * kD];
            if (!p.through_scratch) {
              ASSERT_TRUE(p.window_slot + k >= p.used || p.used == 0)
                  << "an in-place gather must not overwrite a used slot";
              ASSERT_TRUE(p.encoded == 0 || p.used == 0);
            }
            std::memcpy(to, token(role, p.gather_first + k, h), kD * 4);
          }
    }
    // The commit.
    for (size_t i = 0; i < seqs.size(); ++i) {
      const SequencePlan& p = plan.seqs[i];
      ModelSequence& s = seqs[i];
      if (p.through_scratch)
        for (size_t row = 0; row < 2 * kH; ++row)
          std::memcpy(&s.window[row * slots * kD], &scratch[2 * p.scratch_first * kH * kD + row * p.kept * kD],
                      p.kept * kD * 4);
      for (size_t j = 0; j < p.n_pages; ++j) s.pages.push_back(free[free.size() - 1 - (p.first_page + j)]);
      s.used = p.kept;
    }
    free.resize(free.size() - plan.pages);
  }
};

CacheConfig f32_config(size_t R, size_t capacity) {
  CacheConfig c;
  c.n_kv_heads = static_cast<int>(kH);
  c.head_dim = static_cast<int>(kD);
  c.block_tokens = static_cast<int>(kT);
  c.residual_tokens = static_cast<int>(R);
  c.key_codec = c.value_codec = "f32";
  c.capacity_pages = capacity;
  return c;
}

TEST(AppendPlan, BatchedAppendsEqualOneAppendPerSequence) {
  KVQ_FRESH_SEED();
  std::mt19937_64 rng(seed);
  for (const size_t R : {size_t{0}, size_t{64}, size_t{128}}) {
    SCOPED_TRACE("R = " + std::to_string(R));
    constexpr size_t kSeqs = 5, kCapacity = 400;
    KVCache host(f32_config(R, kCapacity));
    std::vector<SeqId> ids;
    for (size_t i = 0; i < kSeqs; ++i) ids.push_back(host.add_sequence());
    Model model(kSeqs, R, kCapacity, host.page_bytes());
    ASSERT_EQ(host.page_bytes(), 2 * kH * kT * kD * 4);  // f32 blocks need no padding here
    // Steps: decode rows (1 token each, some sequences idle), prefill chunks across page boundaries.
    const std::vector<size_t> sizes = {0, 1, 1, 5, 63, 64, 65, 127, 200, 300};
    for (int step = 0; step < 40; ++step) {
      std::vector<size_t> n(kSeqs);
      for (size_t& x : n) x = step % 3 == 0 ? sizes[rng() % sizes.size()] : rng() % 2;
      size_t sum = 0;
      for (const size_t x : n) sum += x;
      const test::Tokens t = test::make_tokens(host.config(), sum, seed + static_cast<uint64_t>(step), false);
      model.append(t.keys, t.values, n);
      for (size_t i = 0, first = 0; i < kSeqs; first += n[i], ++i)
        if (n[i] > 0) host.append(ids[i], 0, t.keys.data() + first * kH * kD, t.values.data() + first * kH * kD, n[i]);
      for (size_t i = 0; i < kSeqs; ++i) {
        const LayerView v = host.view(ids[i], 0);
        ASSERT_EQ(std::vector<PageId>(v.pages.begin(), v.pages.end()), model.seqs[i].pages) << "step " << step;
        for (const PageId p : v.pages)
          ASSERT_EQ(std::memcmp(host.page(p), model.pool[p].data(), host.page_bytes()), 0) << "page " << p;
        ASSERT_EQ(static_cast<size_t>(v.residual_count), model.seqs[i].used);
        for (size_t h = 0; h < kH; ++h) {
          const int head = static_cast<int>(h);
          const size_t bytes = model.seqs[i].used * kD * 4, slots = model.slots;
          ASSERT_EQ(std::memcmp(v.residual_key(head), &model.seqs[i].window[h * slots * kD], bytes), 0);
          ASSERT_EQ(std::memcmp(v.residual_value(head), &model.seqs[i].window[(kH + h) * slots * kD], bytes), 0);
        }
      }
      ASSERT_EQ(host.free_pages(), model.free.size());
    }
  }
}

TEST(AppendPlan, ErrorPositionsNameTheSequenceAndToken) {
  // Sequences: empty, idle, one token, a chunk behind a window, a chunk of several pages.
  const std::vector<SequenceChunk> chunks = {{0, 0, false}, {10, 0, false}, {63, 1, false}, {30, 100, false},
                                             {0, 300, false}};
  const AppendPlan plan = plan_append(chunks, kT, 0, false);
  ASSERT_EQ(plan.fresh_tokens, 401u);
  ASSERT_EQ(plan.seqs[2].n_pages, 1u);
  ASSERT_EQ(plan.seqs[3].n_pages, 2u);
  ASSERT_EQ(plan.seqs[4].n_pages, 4u);
  ASSERT_EQ(plan.pages, 7u);
  // Brute force: walk every sequence's stream.
  size_t page = 0, fresh = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SequencePlan& p = plan.seqs[i];
    for (size_t j = 0; j < p.n_pages; ++j, ++page)
      for (size_t t = 0; t < kT; ++t) {
        const StreamToken w = locate_page_token(plan, page, t, kT);
        const size_t idx = j * kT + t;
        ASSERT_EQ(w.seq, i);
        ASSERT_EQ(w.in_window, idx < chunks[i].used);
        ASSERT_EQ(w.index, idx < chunks[i].used ? idx : idx - chunks[i].used);
      }
    for (size_t k = 0; k < chunks[i].n_tokens; ++k, ++fresh) {
      const StreamToken w = locate_fresh_token(plan, fresh);
      ASSERT_EQ(w.seq, i);
      ASSERT_FALSE(w.in_window);
      ASSERT_EQ(w.index, k);
    }
  }
}

// A chunk's first tokens that go to the sink tokens leave the stream: the plan is that of the rest of the chunk,
// read from after them in the batch's arrays, and error positions count them as the caller does.
TEST(AppendPlan, SinkTokensLeaveTheStream) {
  // Sequences: all of a chunk to the sinks, the sinks' end inside a chunk (behind an empty window, with pages).
  const std::vector<SequenceChunk> with = {{0, 3, false, 3}, {0, 70, false, 4}, {0, 200, false, 1}};
  const std::vector<SequenceChunk> without = {{0, 0, false}, {0, 66, false}, {0, 199, false}};
  const AppendPlan a = plan_append(with, kT, 0, false), b = plan_append(without, kT, 0, false);
  EXPECT_EQ(a.fresh_tokens, 273u);  // every token of the batch's arrays
  EXPECT_EQ(a.pages, b.pages);
  EXPECT_EQ(a.scratch_tokens, b.scratch_tokens);
  const std::vector<size_t> first = {3, 7, 74};  // each stream's first token in the batch's arrays
  for (size_t i = 0; i < with.size(); ++i) {
    SCOPED_TRACE(i);
    const SequencePlan &p = a.seqs[i], &q = b.seqs[i];
    EXPECT_EQ(p.fresh_first, first[i]);
    EXPECT_EQ(p.sinks, with[i].sinks);
    EXPECT_EQ(p.n_tokens, q.n_tokens);
    EXPECT_EQ(p.first_page, q.first_page);
    EXPECT_EQ(p.n_pages, q.n_pages);
    EXPECT_EQ(p.kept, q.kept);
    EXPECT_EQ(p.gather_first, q.gather_first);
    EXPECT_EQ(p.gather_count, q.gather_count);
  }
  // Sequence 2's stream starts at array token 74, its chunk's token 1.
  const StreamToken fresh = locate_fresh_token(a, 74 + 10);
  EXPECT_EQ(fresh.seq, 2u);
  EXPECT_EQ(fresh.index, 11u);
  const StreamToken paged = locate_page_token(a, a.seqs[2].first_page, 5, kT);
  EXPECT_EQ(paged.seq, 2u);
  EXPECT_FALSE(paged.in_window);
  EXPECT_EQ(paged.index, 6u);
  EXPECT_EQ(locate_fresh_token(a, 7 + 2).index, 6u);  // sequence 1: 4 sinks, then its stream
}

TEST(AppendPlan, KeyOffsetIsSetByTheFirstPageOnly) {
  const std::vector<SequenceChunk> chunks = {{0, 64, false}, {0, 63, false}, {10, 60, true}, {0, 1, false}};
  const AppendPlan plan = plan_append(chunks, kT, 0, true);
  EXPECT_TRUE(plan.seqs[0].new_offset);
  EXPECT_FALSE(plan.seqs[1].new_offset);  // no page yet
  EXPECT_FALSE(plan.seqs[2].new_offset);  // set already
  EXPECT_FALSE(plan.seqs[3].new_offset);
  EXPECT_EQ(plan.new_offsets, 1u);
  EXPECT_FALSE(plan_append(chunks, kT, 0, false).seqs[0].new_offset);  // keys not centered
}

}  // namespace
}  // namespace kvq::cuda::detail
