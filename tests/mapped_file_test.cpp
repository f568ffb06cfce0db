// A file's bytes in memory, mapped or copied (kvq/detail/mapped_file.hpp): both hold the file's bytes, a copy of
// 2 MiB or more from a 2 MiB boundary (where huge pages can back it), also once moved.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/system_memory.hpp"
#include "kvq/detail/mapped_file.hpp"
#include "kvq/detail/random.hpp"
#include "temp_file.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

TEST(MappedFile, MappedAndCopiedHoldTheFileBytes) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  for (size_t n : {size_t{1}, size_t{4095}, size_t{3} << 20}) {  // one byte, under a page, past a huge page
    SCOPED_TRACE(n);
    std::vector<uint8_t> bytes(n);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng.next_u64());
    const test::TempFile file("mapped_file.bin");
    file.write(bytes);
    const MappedFile mapped(file.path());
    MappedFile copied(file.path(), FileResidency::copied);
    ASSERT_EQ(mapped.bytes().size(), n);
    ASSERT_EQ(copied.bytes().size(), n);
    EXPECT_EQ(std::memcmp(mapped.bytes().data(), bytes.data(), n), 0);
    EXPECT_EQ(std::memcmp(copied.bytes().data(), bytes.data(), n), 0);
    if (n >= (size_t{2} << 20)) {  // smaller copies take 4 KiB pages
      EXPECT_EQ(reinterpret_cast<uintptr_t>(copied.bytes().data()) % (uintptr_t{2} << 20), 0u);
    }
    EXPECT_EQ(mapped.residency(), FileResidency::mapped);
    EXPECT_EQ(copied.residency(), FileResidency::copied);
    const MappedFile moved = std::move(copied);
    EXPECT_EQ(moved.residency(), FileResidency::copied);
    EXPECT_EQ(moved.bytes().size(), n);
    EXPECT_EQ(std::memcmp(moved.bytes().data(), bytes.data(), n), 0);
  }
}

// A copy cannot be paged out without swap, a mapping's pages are read again from the file: a file larger than 3/4
// of the memory available stays mapped, with the same bytes.
TEST(MappedFile, AFileTooLargeForTheMemoryAvailableStaysMapped) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  const size_t n = (size_t{3} << 20) + 5;
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng.next_u64());
  const test::TempFile file("mapped_file_large.bin");
  file.write(bytes);
  const MappedFile fits(file.path(), FileResidency::copied, n / 3 * 4 + 4);
  const MappedFile too_large(file.path(), FileResidency::copied, n);
  EXPECT_EQ(fits.residency(), FileResidency::copied);
  EXPECT_EQ(too_large.residency(), FileResidency::mapped);
  for (const MappedFile* f : {&fits, &too_large}) {
    ASSERT_EQ(f->bytes().size(), n);
    EXPECT_EQ(std::memcmp(f->bytes().data(), bytes.data(), n), 0);
  }
  EXPECT_EQ(largest_copied_file(size_t{4} << 30), size_t{3} << 30);
  EXPECT_EQ(largest_copied_file(0), std::numeric_limits<size_t>::max());  // unknown: copied, as asked
}

// The figures the copy and the cache pool's checks read: on Linux both known, and no more available than there is.
TEST(SystemMemory, AvailableIsKnownAndAtMostThePhysicalMemory) {
#if defined(__linux__)
  const size_t physical = detail::physical_memory_bytes(), available = detail::available_memory_bytes();
  EXPECT_GT(physical, 0u);
  EXPECT_GT(available, 0u);
  EXPECT_LE(available, physical);
#else
  GTEST_SKIP() << "the memory queries read Linux's sysconf and /proc/meminfo";
#endif
}

}  // namespace
}  // namespace kvq
