// The payload of saved caches (kvq::KVCache::load past its header): the first byte picks the format version (2 to
// 5, all read), the rest is the payload, behind a valid 24-byte header (magic, version, the payload's CRC-32C and
// size, as src/cache/cache_file.cpp writes it) so that every mutation reaches the parser. Any payload either loads
// or raises kvq::Error; a loaded cache passes loaded_cache_checks.hpp.
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/crc32c.hpp"
#include "input_file.hpp"
#include "kvq/cache.hpp"
#include "kvq/error.hpp"
#include "loaded_cache_checks.hpp"

namespace {

std::vector<uint8_t> with_header(uint32_t version, const uint8_t* payload, uint64_t size) {
  std::vector<uint8_t> file(24 + size);
  const uint32_t crc = kvq::crc32c(payload, size);
  std::memcpy(file.data(), "KVQCACHE", 8);
  std::memcpy(file.data() + 8, &version, 4);
  std::memcpy(file.data() + 12, &crc, 4);
  std::memcpy(file.data() + 16, &size, 8);
  if (size > 0) std::memcpy(file.data() + 24, payload, size);
  return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint32_t version = 2 + data[0] % 4;
  const std::vector<uint8_t> file = with_header(version, data + 1, size - 1);
  try {
    const kvq::KVCache cache = kvq::KVCache::load(kvq::fuzz::input_file().write(file.data(), file.size()));
    kvq::fuzz::check_loaded(cache);
  } catch (const kvq::Error&) {
    // the expected outcome for a damaged payload
  }
  return 0;
}
