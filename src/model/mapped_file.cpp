#include "kvq/detail/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "core/system_memory.hpp"
#include "kvq/error.hpp"

namespace kvq {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Anonymous memory for n bytes, from a 2 MiB boundary where n reaches one (the kernel backs only aligned 2 MiB
// ranges with huge pages; a smaller file gets 4 KiB pages, without a 2 MiB page to clear): the region, its length,
// and the start.
struct HugeRegion {
  void* region = nullptr;
  size_t bytes = 0;
  std::byte* start = nullptr;
};

HugeRegion map_huge(size_t n) {
  HugeRegion r;
  const bool huge = n >= kHugePage;
  r.bytes = huge ? (n + kHugePage - 1) / kHugePage * kHugePage + kHugePage : n;
  r.region = ::mmap(nullptr, r.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r.region == MAP_FAILED) return {};
  if (!huge) {
    r.start = static_cast<std::byte*>(r.region);
    return r;
  }
  const auto at = reinterpret_cast<uintptr_t>(r.region);
  r.start = reinterpret_cast<std::byte*>((at + kHugePage - 1) / kHugePage * kHugePage);
#ifdef MADV_HUGEPAGE
  ::madvise(r.start, r.bytes - kHugePage, MADV_HUGEPAGE);  // advice: where THP is off, 4 KiB pages it is
#endif
  return r;
}

// Reads n bytes of fd from offset 0 into `to`; errno's message where it fails, empty when done.
std::string read_all(int fd, std::byte* to, size_t n) {
  for (size_t done = 0; done < n;) {
    const ssize_t got = ::pread(fd, to + done, n - done, static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return std::strerror(errno);
    if (got == 0) return "the file became shorter while it was read";
    done += static_cast<size_t>(got);
  }
  return {};
}

}  // namespace

size_t largest_copied_file(size_t available) {
  return available == 0 ? std::numeric_limits<size_t>::max() : available / 4 * 3;
}

MappedFile::MappedFile(const std::filesystem::path& path, FileResidency residency)
    : MappedFile(path, residency, residency == FileResidency::copied ? detail::available_memory_bytes() : 0) {}

MappedFile::MappedFile(const std::filesystem::path& path, FileResidency residency, size_t available_memory)
    : path_(path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  KVQ_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(detail::concat(path, " is not a regular file"));
  }
  if (st.st_size == 0) {
    ::close(fd);
    throw Error(detail::concat(path, " is empty"));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (residency == FileResidency::copied && size_ <= largest_copied_file(available_memory)) {
    const HugeRegion r = map_huge(size_);
    const std::string failed = r.region ? read_all(fd, r.start, size_) : std::strerror(errno);
    ::close(fd);
    if (!failed.empty()) {
      if (r.region) ::munmap(r.region, r.bytes);
      throw Error(detail::concat("cannot read ", path, " into memory: ", failed));
    }
    ::mprotect(r.region, r.bytes, PROT_READ);
    region_ = r.region;
    region_bytes_ = r.bytes;
    data_ = r.start;
    residency_ = FileResidency::copied;
    return;
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  KVQ_CHECK(p != MAP_FAILED, "cannot map ", path, ": ", std::strerror(map_errno));
  region_ = p;
  region_bytes_ = size_;
  data_ = static_cast<const std::byte*>(p);
}

MappedFile::~MappedFile() {
  if (region_) ::munmap(region_, region_bytes_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      residency_(other.residency_),
      region_(std::exchange(other.region_, nullptr)),
      region_bytes_(std::exchange(other.region_bytes_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (region_) ::munmap(region_, region_bytes_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    residency_ = other.residency_;
    region_ = std::exchange(other.region_, nullptr);
    region_bytes_ = std::exchange(other.region_bytes_, 0);
  }
  return *this;
}

}  // namespace kvq
