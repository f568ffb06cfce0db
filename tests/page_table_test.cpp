// The page bookkeeping shared by the CPU and CUDA caches (kvq/detail/page_table.hpp): block offsets inside a page,
// the order in which free pages are handed out and come back, exhaustion, the sequence table's ids.
#include "kvq/detail/page_table.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvq::detail {
namespace {

TEST(PageLayout, BlocksAt64ByteAlignedStrides) {
  const PageLayout l(72, 130, 3);  // e.g. int4 keys of d = 128 (64 + 8 bytes), a value block of 130 bytes
  EXPECT_EQ(l.key_stride, 128u);
  EXPECT_EQ(l.value_stride, 192u);
  EXPECT_EQ(l.page_bytes, 3u * (128 + 192));
  EXPECT_EQ(l.key_offset(2), 256u);
  EXPECT_EQ(l.value_offset(0), 384u);
  EXPECT_EQ(l.value_offset(2), 384u + 384);
}

TEST(FreePages, FreshPagesInOrderThenGivenBackOnesFirst) {
  FreePages free(6);
  std::vector<PageId> a, b;
  free.take(2, a);
  free.take(3, b);
  EXPECT_EQ(a, (std::vector<PageId>{0, 1}));
  EXPECT_EQ(b, (std::vector<PageId>{2, 3, 4}));
  EXPECT_EQ(free.size(), 1u);
  free.give_back(b);  // a removed layer's pages: its first page is the next out
  EXPECT_EQ(free.size(), 4u);
  EXPECT_EQ(free.next(0), 2u);
  std::vector<PageId> c;
  free.take(4, c);
  EXPECT_EQ(c, (std::vector<PageId>{2, 3, 4, 5}));
  EXPECT_EQ(free.size(), 0u);
}

// A batched device append numbers its new pages next(0), next(1), ... across the batch, then commits them with one
// take per sequence in batch order: those takes must hand out exactly the numbered pages.
TEST(FreePages, TakesInARowHandOutThePagesNextNumbered) {
  FreePages free(10);
  std::vector<PageId> first;
  free.take(4, first);
  free.give_back(std::vector<PageId>{1, 2});  // given back and fresh pages both in the batch
  std::vector<PageId> numbered;
  for (size_t k = 0; k < 5; ++k) numbered.push_back(free.next(k));
  EXPECT_EQ(numbered, (std::vector<PageId>{1, 2, 4, 5, 6}));
  std::vector<PageId> seq0, seq1, seq2;
  free.take(2, seq0);
  free.take(0, seq1);  // a sequence of the batch with no new page
  free.take(3, seq2);
  EXPECT_EQ(seq0, (std::vector<PageId>{1, 2}));
  EXPECT_TRUE(seq1.empty());
  EXPECT_EQ(seq2, (std::vector<PageId>{4, 5, 6}));
  EXPECT_EQ(free.size(), 3u);
}

TEST(FreePages, ExhaustionThrowsAndChangesNothing) {
  FreePages free(2);
  std::vector<PageId> pages;
  EXPECT_THROW(free.take(3, pages), Error);
  EXPECT_TRUE(pages.empty());
  EXPECT_EQ(free.size(), 2u);
  free.take(2, pages);
  EXPECT_THROW(free.take(1, pages), Error);
  EXPECT_EQ(pages.size(), 2u);
}

struct Layer {
  std::vector<PageId> pages;
};

TEST(SequenceTable, IdsLookupsAndRemovalGiveThePagesBack) {
  SequenceTable<Layer> table("TestCache");
  FreePages free(8);
  table.insert(table.next_id, 2);
  table.insert(5, 2);  // a file's or a copy's id: the next new one comes after it
  EXPECT_EQ(table.next_id, 6u);
  EXPECT_EQ(table.ids(), (std::vector<SeqId>{0, 5}));
  EXPECT_THROW(table.insert(5, 2), Error);
  free.take(3, table.at(5).layers[1].pages);
  EXPECT_EQ(free.size(), 5u);
  table.erase(5, free);
  EXPECT_EQ(free.size(), 8u);
  EXPECT_FALSE(table.contains(5));
  try {
    table.at(5);
    FAIL() << "no error for a removed sequence";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TestCache: no sequence with id 5"), std::string::npos) << e.what();
  }
}

TEST(SequenceTable, InsertKeepsLayersMadeBeforehand) {
  SequenceTable<Layer> table("TestCache");
  std::vector<Layer> layers(2);
  layers[1].pages = {7, 8};
  const auto& s = table.insert(3, std::move(layers));
  ASSERT_EQ(s.layers.size(), 2u);
  EXPECT_EQ(s.layers[1].pages, (std::vector<PageId>{7, 8}));
  EXPECT_EQ(table.next_id, 4u);
  EXPECT_THROW(table.insert(3, std::vector<Layer>(2)), Error);
  EXPECT_EQ(table.at(3).layers[1].pages, (std::vector<PageId>{7, 8}));  // the refused insert changed nothing
}

}  // namespace
}  // namespace kvq::detail
