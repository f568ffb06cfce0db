// Saved caches, as they come (kvq::KVCache::load): any bytes either load or raise kvq::Error. Most mutations fail
// the payload's CRC-32C; cache_payload_fuzzer gets past it. A loaded cache passes loaded_cache_checks.hpp.
#include <cstdint>

#include "input_file.hpp"
#include "kvq/cache.hpp"
#include "kvq/error.hpp"
#include "loaded_cache_checks.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kvq::KVCache cache = kvq::KVCache::load(kvq::fuzz::input_file().write(data, size));
    kvq::fuzz::check_loaded(cache);
  } catch (const kvq::Error&) {
    // the expected outcome for a damaged file
  }
  return 0;
}
