// The turbo append kernels' norm and quotient on the device against the CPU's: for_each_row_norm
// (src/cuda/row_norm.cuh) over rows of awkward sizes, counts and strides, floats and doubles, must give lane_norm's
// bits (src/codec/lane_norm.hpp), and unit_quotient (src/codec/unit_quotient.hpp) with the device's reciprocal the
// division's, over random rows and quotients at the float midpoints. The host tests (lane_norm_test.cpp,
// unit_quotient_test.cpp) check the same definitions without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "codec/lane_norm.hpp"
#include "codec/unit_quotient.hpp"
#include "cuda/row_norm.cuh"
#include "gpu_test.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using cuda::detail::for_each_row_norm;

/// A device copy of a host vector, freed with it.
template <class T>
struct DeviceVector {
  T* data = nullptr;
  explicit DeviceVector(const std::vector<T>& host) {
    EXPECT_EQ(cudaMalloc(&data, host.size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  ~DeviceVector() { cudaFree(data); }
  std::vector<T> to_host(size_t n) const {
    std::vector<T> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), data, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

template <class Element>
__global__ void row_norms_kernel(const Element* x, int rows, int stride, int d, double* norms) {
  for_each_row_norm(x, rows, stride, d, [&](int t, double norm) { norms[t] = norm; });
}

__global__ void quotients_kernel(const float* x, const double* norms, int n, float* u, double* inverses) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  inverses[i] = __drcp_rn(norms[i]);
  u[i] = unit_quotient(x[i], norms[i], inverses[i]);
}

template <class Element>
void expect_row_norms(std::mt19937_64& rng, int rows, int d, int stride) {
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int> scale(-40, 40);
  std::vector<Element> x(static_cast<size_t>(rows) * stride, Element(-1));  // the gaps between rows are not read
  for (int t = 0; t < rows; ++t) {
    const int e = scale(rng);
    for (int j = 0; j < d; ++j)
      x[static_cast<size_t>(t) * stride + j] = static_cast<Element>(std::ldexp(normal(rng), e));
  }
  for (int j = 0; j < d; ++j) x[j] = Element(0);  // a zero row
  DeviceVector<Element> device_x(x);
  DeviceVector<double> device_norms(std::vector<double>(static_cast<size_t>(rows), -1.0));
  row_norms_kernel<<<1, 256>>>(device_x.data, rows, stride, d, device_norms.data);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<double> norms = device_norms.to_host(static_cast<size_t>(rows));
  for (int t = 0; t < rows; ++t)
    ASSERT_EQ(norms[t], lane_norm(x.data() + static_cast<size_t>(t) * stride, d)) << "row " << t << " of d " << d;
}

TEST(DeviceRowNorm, IsTheCpuNormForEveryShape) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  std::mt19937_64 rng(seed);
  for (const int d : {1, 3, 31, 32, 33, 64, 100, 128, 200, 256, 512})
    for (const int rows : {1, 7, 64, 67, 128}) {
      expect_row_norms<float>(rng, rows, d, d);
      expect_row_norms<double>(rng, rows, d, d + 5);
    }
}

TEST(DeviceUnitQuotient, IsTheDivision) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> scale(-150, 120), shift(0, 60), subnormal(0, (1 << 23) - 2);
  std::vector<float> x;
  std::vector<double> norms;
  // Rows divided by their norms.
  while (x.size() < (1u << 23)) {
    const int d = 128, e = scale(rng);
    float row[d];
    for (float& v : row) v = std::ldexp(normal(rng), e < -149 ? -149 : e);
    const double norm = lane_norm(row, d);
    if (norm == 0) continue;
    x.insert(x.end(), row, row + d);
    norms.insert(norms.end(), d, norm);
  }
  // Quotients within 8 double ulps of float midpoints, normal and subnormal.
  while (x.size() < (1u << 24)) {
    const float xi = static_cast<float>(std::ldexp(1.0 + unit(rng), scale(rng) / 2));
    const float f = static_cast<float>(std::ldexp(1.0 + unit(rng), -shift(rng) - 1));
    const double target = x.size() % 2 ? f + std::ldexp(1.0, std::ilogb(f) - 24)
                                       : std::ldexp(static_cast<double>(2 * subnormal(rng) + 1), -150);
    double norm = static_cast<double>(xi) / target;
    if (!std::isfinite(norm) || norm < xi) continue;
    for (int k = 0; k < 8; ++k) norm = std::nextafter(norm, 0.0);
    for (int k = 0; k < 17; ++k, norm = std::nextafter(norm, INFINITY)) {
      if (norm < xi) continue;
      x.push_back(xi);
      norms.push_back(norm);
    }
  }
  const int n = static_cast<int>(x.size());
  DeviceVector<float> device_x(x), device_u(std::vector<float>(x.size()));
  DeviceVector<double> device_norms(norms), device_inverses(std::vector<double>(x.size()));
  quotients_kernel<<<(n + 255) / 256, 256>>>(device_x.data, device_norms.data, n, device_u.data, device_inverses.data);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> u = device_u.to_host(x.size());
  const std::vector<double> inverses = device_inverses.to_host(x.size());
  int64_t bad = 0, bad_inverse = 0;
  for (int i = 0; i < n; ++i) {
    const float want = static_cast<float>(x[i] / norms[i]);
    bad += std::memcmp(&u[i], &want, sizeof want) != 0;
    bad_inverse += inverses[i] != 1.0 / norms[i];
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(bad_inverse, 0);
}

}  // namespace
}  // namespace kvq
