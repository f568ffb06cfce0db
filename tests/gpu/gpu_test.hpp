// KVQ_REQUIRE_GPU(): skips the test, naming the reason, where no CUDA device can be used.
#pragma once

#include <gtest/gtest.h>

#include "kvq/cuda.hpp"

#define KVQ_REQUIRE_GPU()                                                              \
  do {                                                                                 \
    if (::kvq::cuda::device_count() == 0) GTEST_SKIP() << ::kvq::cuda::unavailable_reason(); \
  } while (0)
