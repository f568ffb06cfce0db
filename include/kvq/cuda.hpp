// The CUDA backend's presence: whether this build has it and which devices the machine offers. The device-side
// cache and kernels live in src/cuda/ and are reached through the same kvq API with a device argument.
#pragma once

#include <string>

namespace kvq::cuda {

/// Whether this build has the CUDA backend (CMake option KVQ_CUDA).
bool built();
/// Number of usable CUDA devices: 0 without the backend, a driver or a GPU.
int device_count();
/// Why no device can be used ("" when one can): the build, the driver's error, or no GPU.
std::string unavailable_reason();
/// Name and compute capability of a device, e.g. "NVIDIA H200 (sm_90)". Throws kvq::Error without one.
std::string device_name(int device = 0);

}  // namespace kvq::cuda
