// The fuzzer's input as a file, for the loaders that take a path: one memfd per process, rewritten for every input
// and named by its /proc/self/fd path. Nothing lands on disk, nothing is left behind, and parallel fuzzing jobs
// never share a file.
#pragma once

#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace kvq::fuzz {

class InputFile {
 public:
  InputFile() : fd_(::memfd_create("kvq_fuzz_input", MFD_CLOEXEC)), path_("/proc/self/fd/" + std::to_string(fd_)) {
    if (fd_ < 0) std::abort();  // the harness itself is broken, not the code under test
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  /// Makes the file hold exactly data[0, size) and returns its path. Whatever mapped the previous contents must be
  /// gone: a mapping beyond the new end would fault.
  const std::string& write(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

/// The process's input file.
inline InputFile& input_file() {
  static InputFile file;
  return file;
}

}  // namespace kvq::fuzz
