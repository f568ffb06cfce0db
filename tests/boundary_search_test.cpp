// The turbo_mse and turbo_rvq append encoders' binary search over a codebook's boundaries and their level tables
// (src/cuda/boundary_search.cuh), run on the host, against FloatCodebook (the CPU encoders' linear count and
// levels): every boundary, its neighbouring floats, the centroids, signed zeros, infinities, NaN and random values,
// for every width of the sphere codebooks and of turbo_rvq's residual ones, several d; and sorted lists with repeated
// boundaries.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "codec/lloyd_max.hpp"
#include "codec/turbo_parts.hpp"
#include "cuda/boundary_search.cuh"
#include "test_seed.hpp"

namespace kvq::cuda::detail {
namespace {

uint32_t linear_count(const std::vector<float>& boundaries, float v) {
  uint32_t idx = 0;
  for (const float b : boundaries) idx += v > b;
  return idx;
}

// The values where a search could go wrong: each boundary and the floats beside it, plus the edges of float.
std::vector<float> probes(const std::vector<float>& boundaries, const float* centroids, int n_centroids,
                          std::mt19937& rng) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min()};
  for (const float b : boundaries)
    for (const float x : {b, std::nextafter(b, inf), std::nextafter(b, -inf)}) v.push_back(x);
  for (int i = 0; i < n_centroids; ++i) v.push_back(centroids[i]);
  std::normal_distribution<float> gauss(0.0f, 0.2f);
  for (int i = 0; i < 20000; ++i) v.push_back(gauss(rng));
  return v;
}

template <int Bits>
void expect_search_is_the_count(const std::vector<float>& boundaries, const std::vector<float>& values) {
  ASSERT_EQ(boundaries.size(), static_cast<size_t>((1 << Bits) - 1));
  const BoundarySearch<Bits> search(boundaries.data());
  for (const float v : values) ASSERT_EQ(search.index(v), linear_count(boundaries, v)) << "v = " << v;
}

template <int Bits>
void check_book(const FloatCodebook& book, std::mt19937& rng) {
  const auto values = probes(book.boundaries(), book.centroids(), book.size(), rng);
  expect_search_is_the_count<Bits>(book.boundaries(), values);
  for (const float v : values) ASSERT_EQ(linear_count(book.boundaries(), v), book.nearest(v));
  const LevelTable<Bits> levels(book.centroids());
  for (int i = 0; i < book.size(); ++i) ASSERT_EQ(levels.level(static_cast<uint32_t>(i)), book[i]) << "level " << i;
}

template <int Bits>
void check_codebooks(std::mt19937& rng) {
  for (const int d : {32, 64, 128, 256}) {
    SCOPED_TRACE("bits " + std::to_string(Bits) + ", d = " + std::to_string(d));
    check_book<Bits>(FloatCodebook(sphere_lloyd_max(d, Bits)), rng);
    check_book<Bits>(FloatCodebook(sphere_residual_lloyd_max(d, Bits, Bits)), rng);  // turbo_rvq's second stage
  }
}

TEST(BoundarySearch, EqualsTheCodebooksLinearCount) {
  KVQ_FRESH_SEED();
  std::mt19937 rng(static_cast<uint32_t>(seed));
  check_codebooks<1>(rng);
  check_codebooks<2>(rng);
  check_codebooks<3>(rng);
  check_codebooks<4>(rng);
}

// Sorted with repeats (a codebook whose rounded centroids coincide): still the count of boundaries below v.
TEST(BoundarySearch, RepeatedBoundaries) {
  KVQ_FRESH_SEED();
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const std::vector<float> three = {-0.5f, -0.5f, -0.1f, 0.0f, 0.0f, 0.0f, 0.7f};
  const std::vector<float> four = {-1.0f, -1.0f, -1.0f, -0.25f, -0.25f, 0.0f, 0.0f, 0.125f,
                                   0.125f, 0.125f, 0.5f, 0.5f, 0.75f, 2.0f, 2.0f};
  const float none[1] = {0.0f};
  expect_search_is_the_count<3>(three, probes(three, none, 1, rng));
  expect_search_is_the_count<4>(four, probes(four, none, 1, rng));
}

}  // namespace
}  // namespace kvq::cuda::detail
