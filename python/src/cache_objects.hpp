// The Python object of kvq.KVCache: the C++ cache, on the CPU or a CUDA device, with the lock its calls take turns
// on (without_gil.hpp) and the thread pool a CPU cache's attention calls split their work over; and what the
// binding's two files (cache_binding.cpp, device_cache_binding.cpp) share about where a cache's arrays lie.
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>
#include <mutex>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"

namespace kvq::python {

struct PyKVCache {
  KVCache cache;
  ThreadPool pool;  // a CUDA cache's has one worker, unused
  std::mutex mutex;
};

/// The threads of a CPU cache's pool for the argument `threads` (0: one per core); kvq.Error for a negative count.
int pool_size(int threads);
/// Where a cache's arrays must lie, as arrays.hpp's float_input takes it: kCpu, or its CUDA device's id.
int place_of(const KVCache& cache);
/// kvq._device's function `name` (Python policy for device calls: kvq/_device.py).
nanobind::object device_policy(const char* name);
/// The cudaStream_t a call on a CUDA cache runs on (kvq/_device.py: stream_handle); null for a CPU cache.
void* stream_of(const PyKVCache& self, const nanobind::object& stream);
/// kvq.KVCache's methods for CUDA caches only (append_batch, decode_step), kvq.DecodeStep, cuda_available.
void bind_device_cache(nanobind::module_& m, nanobind::class_<PyKVCache>& cls);

}  // namespace kvq::python
