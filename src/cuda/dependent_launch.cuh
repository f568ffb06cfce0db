// Programmatic dependent launch (sm_90): a kernel launched by launch_dependent may be scheduled while the kernel
// before it on the stream still runs, so that its blocks are resident and their shared memory set up when that
// kernel ends instead of a launch latency later. Such a kernel calls wait_for_prior_kernel() before it reads any
// global memory (the earlier kernel's results and its writes are visible after it); a kernel calls
// allow_next_kernel() where its successor may be scheduled (when every block has called it or ended).
#pragma once

#include <cuda_runtime.h>

namespace kvq::cuda::detail {

__device__ __forceinline__ void wait_for_prior_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/// Launches fn with args on stream; with `dependent` (a device of compute capability 9.0 or later) as a
/// programmatic dependent of the stream's previous kernel, otherwise as a plain launch.
inline cudaError_t launch_dependent(const void* fn, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                    void** args, bool dependent) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = dependent ? 1 : 0;
  return cudaLaunchKernelExC(&config, fn, args);
}

}  // namespace kvq::cuda::detail
