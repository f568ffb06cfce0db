// The append kernels' register Hadamard transform (src/cuda/hadamard_lanes.cuh) run on the host as a warp runs it:
// 32 threads in lockstep, one per lane, exchanging values through a barrier where the device shuffles. Every row
// must equal the CPU's fast transform (src/rotation/hadamard.cpp) bit for bit, which is what keeps the device's
// int8/int4 and turbo_mse codes identical to the CPU encoders'.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "cuda/hadamard_lanes.cuh"
#include "kvq/detail/synthetic.hpp"
#include "rotation/rotations.hpp"
#include "test_seed.hpp"

namespace kvq::cuda::detail {
namespace {

constexpr int kLanes = 32;

// lane ^ m's value, as __shfl_xor_sync returns it: every lane posts its value, then reads its partner's.
struct HostXor {
  std::vector<float>* posted;
  std::barrier<>* sync;
  int lane;
  float operator()(float value, int m) const {
    (*posted)[static_cast<size_t>(lane)] = value;
    sync->arrive_and_wait();
    const float other = (*posted)[static_cast<size_t>(lane ^ m)];
    sync->arrive_and_wait();
    return other;
  }
};

template <int E>
std::vector<float> warp_transform(const std::vector<float>& x, const std::vector<float>& signs, float scale, int d) {
  std::vector<float> y(x.size());
  std::vector<float> posted(kLanes);
  std::barrier<> sync(kLanes);
  std::vector<std::thread> lanes;
  const int active = d / E;
  for (int lane = 0; lane < kLanes; ++lane)
    lanes.emplace_back([&, lane] {
      for (size_t row = 0; row < x.size() / static_cast<size_t>(d); ++row) {
        float v[E] = {};
        const size_t at = row * static_cast<size_t>(d) + static_cast<size_t>(lane * E);
        if (lane < active) std::memcpy(v, &x[at], sizeof(v));
        hadamard_row_lanes<E>(v, signs.data(), scale, lane, active, HostXor{&posted, &sync, lane});
        if (lane < active) std::memcpy(&y[at], v, sizeof(v));
      }
    });
  for (std::thread& t : lanes) t.join();
  return y;
}

// The same, R rows at a time through hadamard_rows_lanes (the device's hadamard_rows up to d = 128: two rows a
// warp, the lane's signs loaded once).
template <int E, int R>
std::vector<float> warp_transform_rows(const std::vector<float>& x, const std::vector<float>& signs, float scale,
                                       int d) {
  std::vector<float> y(x.size());
  std::vector<float> posted(kLanes);
  std::barrier<> sync(kLanes);
  std::vector<std::thread> lanes;
  const int active = d / E;
  const size_t rows = x.size() / static_cast<size_t>(d);
  for (int lane = 0; lane < kLanes; ++lane)
    lanes.emplace_back([&, lane] {
      float sign[E] = {};
      if (lane < active) std::memcpy(sign, &signs[static_cast<size_t>(lane * E)], sizeof(sign));
      for (size_t row0 = 0; row0 < rows; row0 += R) {
        float v[R][E] = {};
        for (size_t i = 0; i < R && row0 + i < rows; ++i)
          if (lane < active) std::memcpy(v[i], &x[(row0 + i) * static_cast<size_t>(d) + lane * E], sizeof(v[i]));
        hadamard_rows_lanes<E, R>(v, sign, scale, lane, active, HostXor{&posted, &sync, lane});
        for (size_t i = 0; i < R && row0 + i < rows; ++i)
          if (lane < active) std::memcpy(&y[(row0 + i) * static_cast<size_t>(d) + lane * E], v[i], sizeof(v[i]));
      }
    });
  for (std::thread& t : lanes) t.join();
  return y;
}

std::vector<float> warp_transform_two_rows(const std::vector<float>& x, const std::vector<float>& signs,
                                           float scale, int d) {
  switch (std::max(1, d / 32)) {
    case 1: return warp_transform_rows<1, 2>(x, signs, scale, d);
    case 2: return warp_transform_rows<2, 2>(x, signs, scale, d);
    case 4: return warp_transform_rows<4, 2>(x, signs, scale, d);
    case 8: return warp_transform_rows<8, 2>(x, signs, scale, d);
    default: return warp_transform_rows<16, 2>(x, signs, scale, d);
  }
}

std::vector<float> warp_transform(const std::vector<float>& x, const std::vector<float>& signs, float scale, int d) {
  switch (std::max(1, d / 32)) {
    case 1: return warp_transform<1>(x, signs, scale, d);
    case 2: return warp_transform<2>(x, signs, scale, d);
    case 4: return warp_transform<4>(x, signs, scale, d);
    case 8: return warp_transform<8>(x, signs, scale, d);
    default: return warp_transform<16>(x, signs, scale, d);
  }
}

TEST(HadamardLanes, WarpTransformIsBitIdenticalWithTheCpuTransform) {
  KVQ_FRESH_SEED();
  for (const int d : {8, 16, 32, 64, 128, 256, 512}) {
    SCOPED_TRACE("d = " + std::to_string(d));
    const auto rotation = make_hadamard_rotation(d, seed);
    // The signs as the device encoder derives them (device_encoder.cpp): R^T e_0 = s / sqrt(d).
    std::vector<float> e0(static_cast<size_t>(d), 0.0f), row0(static_cast<size_t>(d)), signs(static_cast<size_t>(d));
    e0[0] = 1.0f;
    rotation->apply_inverse(e0.data(), row0.data(), 1);
    for (size_t j = 0; j < signs.size(); ++j) signs[j] = row0[j] < 0 ? -1.0f : 1.0f;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    // Gaussian rows, and rows of mixed magnitudes (where the order of additions shows most).
    constexpr size_t kRows = 6;
    std::vector<float> x = gaussian_vectors(kRows, d, seed + 1);
    for (size_t i = 0; i < x.size(); i += 3) x[i] *= 1e4f;
    std::vector<float> want(x.size());
    rotation->apply(x.data(), want.data(), kRows);
    // One row at a time, and two rows at a time (an odd count: the last pair's second row is zeros, not stored).
    for (const size_t rows : {kRows, kRows - 1}) {
      const std::vector<float> xr(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(rows * static_cast<size_t>(d)));
      for (const bool two : {false, true}) {
        SCOPED_TRACE(std::string(two ? "two rows at a time" : "one row at a time") + ", rows = " +
                     std::to_string(rows));
        const std::vector<float> got =
            two ? warp_transform_two_rows(xr, signs, scale, d) : warp_transform(xr, signs, scale, d);
        size_t differ = 0;
        for (size_t i = 0; i < xr.size(); ++i) differ += std::memcmp(&want[i], &got[i], sizeof(float)) != 0;
        EXPECT_EQ(differ, 0u) << "of " << xr.size();
      }
    }
  }
}

}  // namespace
}  // namespace kvq::cuda::detail
