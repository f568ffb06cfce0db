#include "core/bitpack.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

TEST(Bitpack, RoundTripEveryWidthAndAwkwardLength) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  for (int bits = 1; bits <= 8; ++bits)
    for (size_t n : {1, 3, 7, 8, 9, 15, 17, 31, 33, 128, 1001}) {
      std::vector<uint8_t> idx(n), back(n);
      for (auto& v : idx) v = static_cast<uint8_t>(rng.next_u64() & ((1u << bits) - 1));
      std::vector<uint8_t> packed(packed_bytes(n, bits));
      pack_bits(idx.data(), n, bits, packed.data());
      unpack_bits(packed.data(), n, bits, back.data());
      ASSERT_EQ(idx, back) << "bits=" << bits << " n=" << n;
    }
}

TEST(Bitpack, WideIndicesRoundTrip) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  for (int bits = 1; bits <= 16; ++bits) {
    const size_t n = 97;
    std::vector<uint16_t> idx(n), back(n);
    for (auto& v : idx) v = static_cast<uint16_t>(rng.next_u64() & ((1u << bits) - 1));
    std::vector<uint8_t> packed(packed_bytes(n, bits));
    pack_bits16(idx.data(), n, bits, packed.data());
    unpack_bits16(packed.data(), n, bits, back.data());
    ASSERT_EQ(idx, back) << "bits=" << bits;
  }
}

TEST(Bitpack, DocumentedLayout) {
  // 4-bit: index 2i is the low nibble of byte i.
  const uint8_t four[4] = {0x1, 0x2, 0xf, 0x7};
  uint8_t out4[2];
  pack_bits(four, 4, 4, out4);
  EXPECT_EQ(out4[0], 0x21);
  EXPECT_EQ(out4[1], 0x7f);
  // 3-bit: eight indices fill exactly three bytes, LSB first.
  const uint8_t three[8] = {1, 2, 3, 4, 5, 6, 7, 0};
  EXPECT_EQ(packed_bytes(8, 3), 3u);
  uint8_t out3[3];
  pack_bits(three, 8, 3, out3);
  uint32_t stream = out3[0] | (out3[1] << 8) | (out3[2] << 16);
  for (int i = 0; i < 8; ++i) EXPECT_EQ((stream >> (3 * i)) & 7u, three[i]) << i;
  // 1-bit: index i is bit i % 8 of byte i / 8.
  const uint8_t one[9] = {1, 0, 0, 0, 0, 0, 0, 1, 1};
  uint8_t out1[2];
  pack_bits(one, 9, 1, out1);
  EXPECT_EQ(out1[0], 0x81);
  EXPECT_EQ(out1[1], 0x01);
}

TEST(Bitpack, RejectsOversizedIndexAndBadWidth) {
  const uint8_t idx[2] = {3, 4};
  uint8_t out[1];
  EXPECT_THROW(pack_bits(idx, 2, 2, out), Error);
  EXPECT_THROW(pack_bits(idx, 2, 0, out), Error);
  EXPECT_THROW(pack_bits(idx, 2, 9, out), Error);
}

}  // namespace
}  // namespace kvq
