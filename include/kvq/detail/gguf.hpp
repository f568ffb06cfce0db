// GGUF (versions 2 and 3): the llama.cpp model file. Layout, all little-endian:
//   magic "GGUF", uint32 version, uint64 tensor_count, uint64 metadata_count,
//   metadata_count x { string key, uint32 value_type, value },
//   tensor_count x { string name, uint32 n_dims, uint64 dims[n_dims], uint32 ggml_type, uint64 offset },
//   padding to `general.alignment` (default 32), then the tensor data; each offset is relative to the data start
//   and a multiple of the alignment. A string is uint64 length + bytes (no terminator); an array is
//   uint32 element_type, uint64 count, elements.
// The file is memory-mapped; metadata strings and tensor data are views into the mapping. Every length and offset
// is checked against the file before it is used: a corrupt or truncated file gives kvq::Error naming the field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/detail/ggml_quants.hpp"
#include "kvq/detail/mapped_file.hpp"

namespace kvq {

/// GGUF metadata value types (numbers fixed by the format).
enum class GgufType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12,
};

std::string_view gguf_type_name(GgufType type);

/// One metadata value: a scalar, a string or an array of values. Accessors check the type and name the key.
class GgufValue {
 public:
  GgufType type() const { return type_; }
  /// Any integer type holding a non-negative value (kvq::Error otherwise).
  uint64_t as_uint() const;
  /// Any integer type whose value fits in int64.
  int64_t as_int() const;
  /// f32 or f64.
  double as_float() const;
  bool as_bool() const;
  /// A view into the mapped file.
  std::string_view as_string() const;
  /// The elements of an array (kvq::Error for a non-array).
  const std::vector<GgufValue>& as_array() const;
  /// The element type of an array.
  GgufType element_type() const;

  /// Convenience: an array of strings, or of numbers converted to float / int64.
  std::vector<std::string_view> as_strings() const;
  std::vector<float> as_floats() const;
  std::vector<int64_t> as_ints() const;

 private:
  friend class GgufParser;
  std::string key_;  // for error messages ("tokenizer.ggml.tokens[3]")
  GgufType type_ = GgufType::u8;
  GgufType element_type_ = GgufType::u8;
  uint64_t bits_ = 0;  // integers and bool (signed ones sign-extended), or the bit pattern of a double
  std::string_view string_;
  std::vector<GgufValue> elements_;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type;
  std::vector<int64_t> shape;  ///< ggml order: shape[0] is the row length (contiguous), shape[1] the rows, ...
  uint64_t offset;             ///< from the start of the data section
  size_t bytes;                ///< total size of the data
  const std::byte* data;       ///< into the mapping

  int64_t elements() const;
  /// Rows of shape[0] elements (product of shape[1..]).
  int64_t rows() const;
};

class GgufFile {
 public:
  /// Opens and validates `path` (header, metadata, tensor infos, data bounds); `residency`: how its bytes are held
  /// (mapped_file.hpp; a model's weights are copied).
  explicit GgufFile(const std::filesystem::path& path, FileResidency residency = FileResidency::mapped);

  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  const std::filesystem::path& path() const { return file_.path(); }
  /// How the file's bytes are held (a `copied` file too large for the memory available stays mapped).
  FileResidency residency() const { return file_.residency(); }

  /// All metadata, ordered by key.
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  /// The value of `key`, or nullptr.
  const GgufValue* find(std::string_view key) const;
  /// The value of `key` (kvq::Error naming the key and file when absent).
  const GgufValue& at(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  /// The file's bytes before its tensor data: header, metadata and tensor infos (what identifies a model).
  std::span<const std::byte> header_bytes() const;
  /// The tensor called `name`, or nullptr.
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  /// The tensor called `name` (kvq::Error naming it when absent).
  const GgufTensorInfo& tensor(std::string_view name) const;

 private:
  friend class GgufParser;
  MappedFile file_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace kvq
