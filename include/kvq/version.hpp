// The version of kvq: one number for the library, the command-line program and the Python package, set by
// project(kvq VERSION ...) in CMakeLists.txt (pyproject.toml reads it from there).
#pragma once

#include <string>

namespace kvq {

/// "major.minor.patch", e.g. "0.1.0".
std::string version();

}  // namespace kvq
