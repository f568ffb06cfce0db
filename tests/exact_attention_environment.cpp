// The test binaries hold attention to the exact kernels' 1e-5 bounds: KVQ_ATTENTION=exact for every test, unless
// the environment asks otherwise. The fast kernels' own tests (fast_attention_kernels_test.cpp) ask for them.
#include <gtest/gtest.h>

#include <cstdlib>

namespace {

class ExactAttention : public ::testing::Environment {
 public:
  void SetUp() override { setenv("KVQ_ATTENTION", "exact", 0); }
};

const ::testing::Environment* const kExactAttention = ::testing::AddGlobalTestEnvironment(new ExactAttention);

}  // namespace
