// Device discovery for a build with the CUDA backend.
#include <cuda_runtime.h>

#include <string>

#include "cuda/cuda_check.cuh"
#include "kvq/cuda.hpp"

namespace kvq::cuda {

bool built() { return true; }

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::string unavailable_reason() {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) return std::string("the CUDA runtime found no usable device: ") + cudaGetErrorString(status);
  return n > 0 ? "" : "the machine has no CUDA device";
}

std::string device_name(int device) {
  KVQ_CHECK(device_count() > device, "no CUDA device " + std::to_string(device) + ": " + unavailable_reason());
  cudaDeviceProp prop{};
  KVQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")";
}

}  // namespace kvq::cuda
