// KVQ_CUDA_CHECK: every CUDA runtime call's error becomes a kvq::Error naming the call and the error.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kvq/error.hpp"

#define KVQ_CUDA_CHECK(call)                                                                             \
  do {                                                                                                    \
    const cudaError_t kvq_cuda_status_ = (call);                                                          \
    if (kvq_cuda_status_ != cudaSuccess)                                                                  \
      throw ::kvq::Error(std::string(#call) + " failed: " + cudaGetErrorString(kvq_cuda_status_));        \
  } while (0)
