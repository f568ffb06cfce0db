// Owning handles of device memory (cudaMalloc / cudaFree) for the CUDA layer's host code.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

#include "cuda/cuda_check.cuh"

namespace kvq::cuda::detail {

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};

template <class T>
using DevicePtr = std::unique_ptr<T[], CudaFree>;

/// n elements of T on the current device; `what` names the allocation in the error (e.g. a full device).
template <class T>
DevicePtr<T> device_alloc(size_t n, const std::string& what) {
  void* p = nullptr;
  if (n == 0) return DevicePtr<T>(nullptr);
  const cudaError_t status = cudaMalloc(&p, n * sizeof(T));
  if (status != cudaSuccess)
    throw Error("cudaMalloc of " + std::to_string(n * sizeof(T)) + " bytes for " + what +
                " failed: " + cudaGetErrorString(status));
  return DevicePtr<T>(static_cast<T*>(p));
}

struct CudaFreeHost {
  void operator()(void* p) const { cudaFreeHost(p); }
};

/// n elements of T in pinned host memory (cudaMallocHost): staging whose copies need no bounce buffer.
template <class T>
std::unique_ptr<T[], CudaFreeHost> pinned_alloc(size_t n, const std::string& what) {
  void* p = nullptr;
  const cudaError_t status = cudaMallocHost(&p, n * sizeof(T));
  if (status != cudaSuccess)
    throw Error("cudaMallocHost of " + std::to_string(n * sizeof(T)) + " bytes for " + what +
                " failed: " + cudaGetErrorString(status));
  return std::unique_ptr<T[], CudaFreeHost>(static_cast<T*>(p));
}

/// Makes `device` current, naming the reason when it does not exist.
void use_device(int device);

}  // namespace kvq::cuda::detail
