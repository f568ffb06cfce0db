#include "core/system_memory.hpp"

#include <cstdio>
#include <fstream>
#include <string>

#if defined(__linux__)
#include <unistd.h>
#endif

namespace kvq::detail {

size_t physical_memory_bytes() {
#if defined(__linux__)
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return static_cast<size_t>(pages) * static_cast<size_t>(page);
#endif
  return 0;
}

size_t available_memory_bytes() {
  // One line per field ("MemAvailable:   123456 kB"); some fields have no unit, so read whole lines.
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) return static_cast<size_t>(kib) * 1024;
  }
  return 0;
}

}  // namespace kvq::detail
