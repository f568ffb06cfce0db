// Linked into the libFuzzer binaries only (fuzz/CMakeLists.txt), which carry the C++ runtime (-static-libstdc++) so
// that a host without clang or GCC 12 runs them: libstdc++ 12's std::random_device (libFuzzer's seed) calls glibc's
// arc4random, new in glibc 2.36; this definition, on getrandom (glibc 2.25), keeps the binaries at glibc 2.34.
#include <sys/random.h>

#include <cstdint>

extern "C" uint32_t arc4random() noexcept;
extern "C" uint32_t arc4random() noexcept {
  uint32_t v = 0;
  while (getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) {
  }
  return v;
}
