// CRC-32C against the published check value and the iSCSI test vectors (RFC 3720, appendix B.4).
#include "core/crc32c.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "kvq/detail/random.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

TEST(Crc32c, StandardCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(Crc32c, IscsiTestVectors) {
  std::vector<uint8_t> zeros(32, 0x00), ones(32, 0xFF), up(32), down(32);
  std::iota(up.begin(), up.end(), uint8_t{0});
  for (int i = 0; i < 32; ++i) down[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down.data(), 32), 0x113FDB5Cu);
}

TEST(Crc32c, IncrementalEqualsOneShotAndSeesEveryBit) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  std::vector<uint8_t> data(1000);
  for (auto& b : data) b = static_cast<uint8_t>(rng.next_u64());
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{333}, size_t{999}, size_t{1000}})
    EXPECT_EQ(crc32c(data.data() + cut, data.size() - cut, crc32c(data.data(), cut)), whole) << cut;
  for (int trial = 0; trial < 50; ++trial) {
    const size_t bit = rng.next_u64() % (8 * data.size());
    data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_NE(crc32c(data.data(), data.size()), whole) << "bit " << bit;
    data[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
}

}  // namespace
}  // namespace kvq
