// A property a target checks beyond "no crash, no sanitizer report": when it fails, the target names it and stops
// the process, which libFuzzer reports as a crash (saving the input) and a replay as a failed test.
#pragma once

#include <cstdio>

#define KVQ_FUZZ_CHECK(cond, what)                                                      \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "kvq fuzz check failed: %s (%s)\n", what, #cond);            \
      std::fflush(stderr);                                                              \
      __builtin_trap();                                                                 \
    }                                                                                   \
  } while (0)
