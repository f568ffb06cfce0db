// The tokens' norm order (src/codec/lane_norm.hpp) against a host simulation of the CUDA append kernels' sums
// (src/cuda/row_norm.cuh), lane by lane.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "codec/lane_norm.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

// src/cuda/row_norm.cuh's sums, lane by lane: a quad's lane k holds partials k + 4 s in registers rotated by the
// row's place g in the warp, adds them in pairs, then with lanes k ^ 2 and k ^ 1. Every lane, at every g, must end
// with lane_norm's value.
double quad_lane_norm(const float* v, int d, int g, int lane) {
  double sum[4];
  for (int k = 0; k < 4; ++k) {
    double acc[8] = {};
    for (int chunk = 0; chunk < d; chunk += 32)
      for (int i = 0; i < 8; ++i) {
        const int j = chunk + k + 4 * ((i + g) & 7);
        if (j < d) acc[i] += static_cast<double>(v[j]) * v[j];
      }
    for (int i = 0; i < 4; ++i) acc[i] += acc[i + 4];
    for (int i = 0; i < 2; ++i) acc[i] += acc[i + 2];
    sum[k] = acc[0] + acc[1];
  }
  for (const int mask : {2, 1}) {
    double next[4];
    for (int k = 0; k < 4; ++k) next[k] = sum[k] + sum[k ^ mask];
    std::memcpy(sum, next, sizeof sum);
  }
  return std::sqrt(sum[lane]);
}

TEST(LaneNorm, EveryLaneOfTheDeviceSumEndsWithTheSameNorm) {
  KVQ_FRESH_SEED();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> scale(-60, 60);
  for (const int d : {1, 2, 5, 31, 32, 33, 63, 64, 100, 128, 129, 256, 500, 512}) {
    for (int trial = 0; trial < 100; ++trial) {
      std::vector<float> v(static_cast<size_t>(d));
      for (float& e : v) e = std::ldexp(normal(rng), scale(rng) / 4);
      const double norm = lane_norm(v.data(), d);
      for (int g = 0; g < 8; ++g)
        for (int lane = 0; lane < 4; ++lane)
          ASSERT_EQ(quad_lane_norm(v.data(), d, g, lane), norm) << "d " << d << " g " << g << " lane " << lane;
    }
  }
}

TEST(LaneNorm, IsTheNormToRounding) {
  const float v[] = {3.0f, 4.0f, 12.0f};
  EXPECT_EQ(lane_norm(v, 3), 13.0);
  EXPECT_EQ(lane_norm(v, 0), 0.0);
}

}  // namespace
}  // namespace kvq
