// The Python objects of the two caches: each a C++ cache with the lock its calls take turns on (without_gil.hpp),
// and for the CPU cache the thread pool its attention calls split their work over. KVCache.to_device and
// DeviceKVCache.to_host make one from the other.
#pragma once

#include <cstddef>
#include <mutex>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/cuda.hpp"

namespace kvq::python {

struct PyKVCache {
  KVCache cache;
  ThreadPool pool;
  std::mutex mutex;
};

struct PyDeviceKVCache {
  KVCache cache;  // on a CUDA device
  std::mutex mutex;
};

/// KVCache.to_device: a device copy of the CPU cache (device_cache_binding.cpp); capacity_pages 0: the host's.
PyDeviceKVCache* to_device(PyKVCache& host, int device, size_t capacity_pages);
/// The threads of a CPU cache's pool for the argument `threads` (0: one per core); kvq.Error for a negative count.
int pool_size(int threads);

}  // namespace kvq::python
