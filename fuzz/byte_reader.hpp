// Reads a structure-aware target's input as a sequence of small decisions: fixed-size little-endian numbers from
// the front; zeros once the input runs out, so every input, however short, decodes to something.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kvq::fuzz {

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), left_(size) {}

  template <class Int>
  Int take() {
    Int v = 0;
    const size_t n = sizeof v < left_ ? sizeof v : left_;
    std::memcpy(&v, data_, n);
    data_ += n;
    left_ -= n;
    return v;
  }
  /// A number in [0, n) (n > 0) from one byte.
  size_t pick(size_t n) { return take<uint8_t>() % n; }
  /// The rest of the input, as text.
  std::string_view rest() {
    const std::string_view s(reinterpret_cast<const char*>(data_), left_);
    data_ += left_;
    left_ = 0;
    return s;
  }
  bool empty() const { return left_ == 0; }

 private:
  const uint8_t* data_;
  size_t left_;
};

}  // namespace kvq::fuzz
