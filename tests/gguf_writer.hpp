// Builds GGUF files byte by byte for tests: metadata of any type, tensors with given bytes, any alignment.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/detail/gguf.hpp"

namespace kvq::test {

class GgufWriter {
 public:
  /// Appends raw little-endian bytes of a trivially copyable value to `out`.
  template <class T>
  static void put(std::vector<uint8_t>& out, const T& v) {
    const size_t at = out.size();
    out.resize(at + sizeof v);
    std::memcpy(out.data() + at, &v, sizeof v);
  }
  static void put_string(std::vector<uint8_t>& out, std::string_view s) {
    put<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
  }

  /// A metadata entry whose value bytes (after the type id) are given as they are stored.
  void kv_raw(std::string_view key, GgufType type, const std::vector<uint8_t>& value) {
    put_string(kv_, key);
    put<uint32_t>(kv_, static_cast<uint32_t>(type));
    kv_.insert(kv_.end(), value.begin(), value.end());
    ++n_kv_;
  }
  template <class T>
  void kv(std::string_view key, GgufType type, T value) {
    std::vector<uint8_t> v;
    put(v, value);
    kv_raw(key, type, v);
  }
  void kv_string(std::string_view key, std::string_view value) {
    std::vector<uint8_t> v;
    put_string(v, value);
    kv_raw(key, GgufType::string, v);
  }
  void kv_strings(std::string_view key, const std::vector<std::string>& values) {
    std::vector<uint8_t> v;
    put<uint32_t>(v, static_cast<uint32_t>(GgufType::string));
    put<uint64_t>(v, values.size());
    for (const auto& s : values) put_string(v, s);
    kv_raw(key, GgufType::array, v);
  }
  template <class T>
  void kv_array(std::string_view key, GgufType element_type, const std::vector<T>& values) {
    std::vector<uint8_t> v;
    put<uint32_t>(v, static_cast<uint32_t>(element_type));
    put<uint64_t>(v, values.size());
    for (const T& x : values) put(v, x);
    kv_raw(key, GgufType::array, v);
  }

  /// A tensor with shape in ggml order (shape[0] = row length) and its stored bytes.
  void tensor(std::string_view name, std::vector<uint64_t> shape, GgmlType type, std::vector<uint8_t> data) {
    tensors_.push_back({std::string(name), std::move(shape), type, std::move(data)});
  }

  void set_version(uint32_t v) { version_ = v; }
  void set_alignment(size_t a) { alignment_ = a; }  // must match a general.alignment entry if not 32

  /// The whole file; tensor data laid out in order, each at a multiple of the alignment, nothing after the last.
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out;
    put<uint32_t>(out, 0x46554747);
    put<uint32_t>(out, version_);
    put<uint64_t>(out, tensors_.size());
    put<uint64_t>(out, n_kv_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      put_string(out, t.name);
      put<uint32_t>(out, static_cast<uint32_t>(t.shape.size()));
      for (uint64_t d : t.shape) put(out, d);
      put<uint32_t>(out, static_cast<uint32_t>(t.type));
      put(out, offset);
      offset = align(offset + t.data.size());
    }
    out.resize(align(out.size()), 0);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out.insert(out.end(), tensors_[i].data.begin(), tensors_[i].data.end());
      if (i + 1 < tensors_.size()) out.resize(align(out.size()), 0);
    }
    return out;
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> shape;
    GgmlType type;
    std::vector<uint8_t> data;
  };
  uint64_t align(uint64_t n) const { return (n + alignment_ - 1) / alignment_ * alignment_; }

  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
  uint32_t version_ = 3;
  size_t alignment_ = 32;
};

}  // namespace kvq::test
