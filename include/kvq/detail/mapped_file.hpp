// A read-only memory mapping of a whole file (RAII): model weights are read in place, never copied.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>

namespace kvq {

class MappedFile {
 public:
  /// Maps `path` read-only; kvq::Error naming the path when it cannot be opened, is empty or cannot be mapped.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  /// The file's bytes; the address stays valid while this object (or the one it was moved into) lives.
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvq
