// A whole file's bytes in memory (RAII), read-only: a mapping of the file, or a copy read into anonymous memory
// that the kernel backs with 2 MiB pages where it can (transparent huge pages). Model weights take the copy: every
// decode step streams all of them, and over 4 KiB pages each page's TLB miss walks the page tables, twice over on a
// virtual machine (measured on a 2-core cloud VM: 9 GB/s streaming a file mapping, 16 GB/s over huge pages). A file
// too large for the memory available stays mapped: a copy could not be paged out (no swap) where the mapping's
// pages are read again from the file.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>

namespace kvq {

/// How a MappedFile holds the bytes.
enum class FileResidency {
  mapped,  ///< a mapping of the file (pages read on first touch, shared with the page cache)
  copied,  ///< read at once into anonymous memory (from 2 MiB up: 2 MiB aligned, advised to use huge pages)
};

/// The largest file a `copied` MappedFile copies when `available` bytes of memory are available (3/4 of them: the
/// rest is left to what the program allocates next, a KV cache's pages); any size where `available` is 0 (unknown).
size_t largest_copied_file(size_t available);

class MappedFile {
 public:
  /// Maps or reads `path`; kvq::Error naming the path when it cannot be opened, is not a regular file, is empty,
  /// cannot be mapped or read. `copied` maps instead a file larger than largest_copied_file(the memory available
  /// now).
  explicit MappedFile(const std::filesystem::path& path, FileResidency residency = FileResidency::mapped);
  /// The same with the memory available given (0: unknown).
  MappedFile(const std::filesystem::path& path, FileResidency residency, size_t available_memory);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  /// The file's bytes; the address stays valid while this object (or the one it was moved into) lives.
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }
  /// How the bytes are held: `mapped` also where `copied` was asked for a file too large to copy.
  FileResidency residency() const { return residency_; }

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  FileResidency residency_ = FileResidency::mapped;
  void* region_ = nullptr;  // what munmap releases: the file's mapping, or the copy's (larger, for the alignment)
  size_t region_bytes_ = 0;
};

}  // namespace kvq
