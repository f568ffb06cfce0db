// How much memory this machine has, for the checks made before large allocations (the cache's page pool, a model
// file's copy).
#pragma once

#include <cstddef>

namespace kvq::detail {

/// The machine's physical memory in bytes, or 0 where unknown.
size_t physical_memory_bytes();

/// The memory that can be allocated now without swapping (Linux's MemAvailable: free memory plus the page cache
/// and other memory the kernel can reclaim), or 0 where unknown.
size_t available_memory_bytes();

}  // namespace kvq::detail
