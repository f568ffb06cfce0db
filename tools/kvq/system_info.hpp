// What the benchmarks print about the machine they ran on.
#pragma once

#include <string>

namespace kvq::cli {

/// The CPU's model name from /proc/cpuinfo, or "unknown".
std::string cpu_model();

}  // namespace kvq::cli
