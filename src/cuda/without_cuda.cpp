// The CUDA API of a build without the backend: no devices, and every device request names the reason.
#include "kvq/cuda.hpp"
#include "kvq/error.hpp"

namespace kvq::cuda {

bool built() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "kvq was built without the CUDA backend (KVQ_CUDA=OFF or no nvcc)"; }
std::string device_name(int) { throw Error("no CUDA device: " + unavailable_reason()); }

}  // namespace kvq::cuda
