// Fresh random inputs for every test run: each test draws its seed from the clock unless KVQ_TEST_SEED is set,
// and prints it on failure (SCOPED_TRACE) so that a failing draw can be replayed.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace kvq::test {

inline uint64_t fresh_seed() {
  if (const char* env = std::getenv("KVQ_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  static uint64_t counter = 0;
  return static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count()) + 7919 * ++counter;
}

}  // namespace kvq::test

/// Declares `uint64_t seed` for the current test and reports it if the test fails.
#define KVQ_FRESH_SEED()                                   \
  const uint64_t seed = ::kvq::test::fresh_seed();         \
  SCOPED_TRACE("replay with KVQ_TEST_SEED=" + std::to_string(seed))
