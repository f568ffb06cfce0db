// The CUDA backend finds its device, and names the reason when there is none.
#include <gtest/gtest.h>

#include "gpu_test.hpp"
#include "kvq/cuda.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

TEST(CudaDevice, BuiltWithTheBackend) { EXPECT_TRUE(cuda::built()); }

TEST(CudaDevice, NoDeviceIsAnErrorWithTheReason) {
  if (cuda::device_count() > 0) {
    EXPECT_EQ(cuda::unavailable_reason(), "");
    EXPECT_THROW(cuda::device_name(cuda::device_count()), Error);
  } else {
    EXPECT_NE(cuda::unavailable_reason(), "");
    EXPECT_THROW(cuda::device_name(0), Error);
  }
}

TEST(CudaDevice, NamesTheDevice) {
  KVQ_REQUIRE_GPU();
  EXPECT_NE(cuda::device_name(0).find("(sm_"), std::string::npos) << cuda::device_name(0);
}

}  // namespace
}  // namespace kvq
