// GGUF parsing: a bounds-checked cursor over the mapped bytes; every count is checked against what is left of
// the file before anything is allocated for it.
#include "kvq/detail/gguf.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "kvq/error.hpp"

namespace kvq {

std::string_view gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::u8: return "u8";
    case GgufType::i8: return "i8";
    case GgufType::u16: return "u16";
    case GgufType::i16: return "i16";
    case GgufType::u32: return "u32";
    case GgufType::i32: return "i32";
    case GgufType::f32: return "f32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::u64: return "u64";
    case GgufType::i64: return "i64";
    case GgufType::f64: return "f64";
  }
  return "unknown";
}

namespace {

bool is_unsigned(GgufType t) {
  return t == GgufType::u8 || t == GgufType::u16 || t == GgufType::u32 || t == GgufType::u64;
}
bool is_signed(GgufType t) {
  return t == GgufType::i8 || t == GgufType::i16 || t == GgufType::i32 || t == GgufType::i64;
}

// Bytes a value of type t occupies at least (strings and arrays: their length fields).
size_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::u8: case GgufType::i8: case GgufType::boolean: return 1;
    case GgufType::u16: case GgufType::i16: return 2;
    case GgufType::u32: case GgufType::i32: case GgufType::f32: return 4;
    case GgufType::u64: case GgufType::i64: case GgufType::f64: case GgufType::string: return 8;
    case GgufType::array: return 12;
  }
  return 1;
}

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr int kMaxDims = 4;              // GGML_MAX_DIMS
constexpr int kMaxArrayNesting = 8;

}  // namespace

// --- GgufValue ---------------------------------------------------------------------------------------------

uint64_t GgufValue::as_uint() const {
  KVQ_CHECK(is_unsigned(type_) || is_signed(type_), "GGUF metadata ", key_, " is ", gguf_type_name(type_),
            ", expected an integer");
  KVQ_CHECK(is_unsigned(type_) || static_cast<int64_t>(bits_) >= 0, "GGUF metadata ", key_, " is negative (",
            static_cast<int64_t>(bits_), ")");
  return bits_;
}

int64_t GgufValue::as_int() const {
  KVQ_CHECK(is_unsigned(type_) || is_signed(type_), "GGUF metadata ", key_, " is ", gguf_type_name(type_),
            ", expected an integer");
  KVQ_CHECK(is_signed(type_) || bits_ <= static_cast<uint64_t>(INT64_MAX), "GGUF metadata ", key_,
            " does not fit in int64");
  return static_cast<int64_t>(bits_);
}

double GgufValue::as_float() const {
  KVQ_CHECK(type_ == GgufType::f32 || type_ == GgufType::f64, "GGUF metadata ", key_, " is ",
            gguf_type_name(type_), ", expected a float");
  return std::bit_cast<double>(bits_);
}

bool GgufValue::as_bool() const {
  KVQ_CHECK(type_ == GgufType::boolean, "GGUF metadata ", key_, " is ", gguf_type_name(type_), ", expected bool");
  return bits_ != 0;
}

std::string_view GgufValue::as_string() const {
  KVQ_CHECK(type_ == GgufType::string, "GGUF metadata ", key_, " is ", gguf_type_name(type_),
            ", expected a string");
  return string_;
}

const std::vector<GgufValue>& GgufValue::as_array() const {
  KVQ_CHECK(type_ == GgufType::array, "GGUF metadata ", key_, " is ", gguf_type_name(type_),
            ", expected an array");
  return elements_;
}

GgufType GgufValue::element_type() const {
  as_array();
  return element_type_;
}

std::vector<std::string_view> GgufValue::as_strings() const {
  std::vector<std::string_view> out;
  out.reserve(as_array().size());
  for (const auto& e : elements_) out.push_back(e.as_string());
  return out;
}

std::vector<float> GgufValue::as_floats() const {
  std::vector<float> out;
  out.reserve(as_array().size());
  for (const auto& e : elements_)
    out.push_back(e.type_ == GgufType::f32 || e.type_ == GgufType::f64 ? static_cast<float>(e.as_float())
                                                                       : static_cast<float>(e.as_int()));
  return out;
}

std::vector<int64_t> GgufValue::as_ints() const {
  std::vector<int64_t> out;
  out.reserve(as_array().size());
  for (const auto& e : elements_) out.push_back(e.as_int());
  return out;
}

// --- GgufTensorInfo ----------------------------------------------------------------------------------------

int64_t GgufTensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t GgufTensorInfo::rows() const { return shape.empty() ? 0 : elements() / shape[0]; }

// --- parsing -----------------------------------------------------------------------------------------------

class GgufParser {
 public:
  explicit GgufParser(GgufFile& f) : f_(f), bytes_(f.file_.bytes()) {}

  void parse() {
    KVQ_CHECK(read<uint32_t>("magic") == kMagic, where(), " is not a GGUF file (bad magic)");
    f_.version_ = read<uint32_t>("version");
    KVQ_CHECK(f_.version_ == 2 || f_.version_ == 3, where(), ": unsupported GGUF version ", f_.version_,
              " (kvq reads versions 2 and 3)");
    const uint64_t n_tensors = read<uint64_t>("tensor count");
    const uint64_t n_kv = read<uint64_t>("metadata count");
    check_count(n_kv, 8 + 4 + 1, "metadata count");
    for (uint64_t i = 0; i < n_kv; ++i) read_metadata(i);
    read_alignment();
    check_count(n_tensors, 8 + 4 + 8 + 4 + 8, "tensor count");
    f_.tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) read_tensor_info(i);
    place_tensor_data();
  }

 private:
  std::string where() const { return f_.file_.path().string(); }

  void need(size_t n, std::string_view what) const {
    KVQ_CHECK(n <= bytes_.size() - pos_, where(), ": truncated while reading ", what, " at byte ", pos_, " (needs ",
              n, " bytes, ", bytes_.size() - pos_, " left)");
  }

  template <class T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string_view read_string(std::string_view what) {
    const uint64_t len = read<uint64_t>(what);
    KVQ_CHECK(len <= bytes_.size() - pos_, where(), ": truncated while reading ", what, " (length ", len,
              ", only ", bytes_.size() - pos_, " bytes left)");
    std::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

  // A count of items of at least `min_bytes` each must fit in what is left of the file.
  void check_count(uint64_t count, size_t min_bytes, std::string_view what) const {
    KVQ_CHECK(count <= (bytes_.size() - pos_) / min_bytes, where(), ": ", what, " ", count,
              " is impossible for the ", bytes_.size() - pos_, " bytes left");
  }

  GgufType read_type(std::string_view what) {
    const uint32_t t = read<uint32_t>(what);
    KVQ_CHECK(t <= static_cast<uint32_t>(GgufType::f64), where(), ": unknown GGUF value type ", t, " for ", what);
    return static_cast<GgufType>(t);
  }

  void read_value(GgufValue& v, GgufType type, int depth) {
    v.type_ = type;
    const std::string& what = v.key_;
    switch (type) {
      case GgufType::u8: v.bits_ = read<uint8_t>(what); break;
      case GgufType::i8: v.bits_ = static_cast<uint64_t>(static_cast<int64_t>(read<int8_t>(what))); break;
      case GgufType::u16: v.bits_ = read<uint16_t>(what); break;
      case GgufType::i16: v.bits_ = static_cast<uint64_t>(static_cast<int64_t>(read<int16_t>(what))); break;
      case GgufType::u32: v.bits_ = read<uint32_t>(what); break;
      case GgufType::i32: v.bits_ = static_cast<uint64_t>(static_cast<int64_t>(read<int32_t>(what))); break;
      case GgufType::u64: v.bits_ = read<uint64_t>(what); break;
      case GgufType::i64: v.bits_ = static_cast<uint64_t>(read<int64_t>(what)); break;
      case GgufType::f32: v.bits_ = std::bit_cast<uint64_t>(static_cast<double>(read<float>(what))); break;
      case GgufType::f64: v.bits_ = std::bit_cast<uint64_t>(read<double>(what)); break;
      case GgufType::boolean: {
        const uint8_t b = read<uint8_t>(what);
        KVQ_CHECK(b <= 1, where(), ": GGUF metadata ", what, " is a bool with value ", int{b});
        v.bits_ = b;
        break;
      }
      case GgufType::string: v.string_ = read_string(what); break;
      case GgufType::array: {
        KVQ_CHECK(depth < kMaxArrayNesting, where(), ": GGUF metadata ", what, " nests arrays deeper than ",
                  kMaxArrayNesting);
        v.element_type_ = read_type(what + " (array element type)");
        const uint64_t n = read<uint64_t>(what + " (array length)");
        check_count(n, min_value_bytes(v.element_type_), what + " array length");
        v.elements_.resize(static_cast<size_t>(n));
        for (uint64_t i = 0; i < n; ++i) {
          GgufValue& e = v.elements_[static_cast<size_t>(i)];
          e.key_ = what + "[" + std::to_string(i) + "]";
          read_value(e, v.element_type_, depth + 1);
        }
        break;
      }
    }
  }

  void read_metadata(uint64_t index) {
    const std::string key(read_string(detail::concat("metadata key #", index)));
    GgufValue v;
    v.key_ = key;
    read_value(v, read_type(key), 0);
    KVQ_CHECK(f_.metadata_.emplace(key, std::move(v)).second, where(), ": duplicate GGUF metadata key ", key);
  }

  void read_alignment() {
    const GgufValue* a = f_.find("general.alignment");
    if (!a) return;
    const uint64_t alignment = a->as_uint();
    KVQ_CHECK(alignment > 0 && alignment <= (1u << 20) && std::has_single_bit(alignment), where(),
              ": general.alignment ", alignment, " is not a power of two in [1, 2^20]");
    f_.alignment_ = static_cast<size_t>(alignment);
  }

  void read_tensor_info(uint64_t index) {
    GgufTensorInfo t;
    t.name = std::string(read_string(detail::concat("tensor name #", index)));
    const uint32_t n_dims = read<uint32_t>(t.name + " dimension count");
    KVQ_CHECK(n_dims >= 1 && n_dims <= kMaxDims, where(), ": tensor ", t.name, " has ", n_dims,
              " dimensions (1..", kMaxDims, " allowed)");
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = read<uint64_t>(t.name + " shape");
      KVQ_CHECK(dim >= 1 && dim <= (uint64_t{1} << 40) && elements <= (uint64_t{1} << 62) / dim, where(),
                ": tensor ", t.name, " has an invalid shape (dimension ", d, " = ", dim, ")");
      elements *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const uint32_t type = read<uint32_t>(t.name + " type");
    t.type = static_cast<GgmlType>(type);
    const GgmlTypeTraits* traits = ggml_type_traits(t.type);
    KVQ_CHECK(traits != nullptr, where(), ": tensor ", t.name, " has unknown ggml type id ", type);
    KVQ_CHECK(t.shape[0] % traits->block_size == 0, where(), ": tensor ", t.name, " rows of ", t.shape[0],
              " elements are not a whole number of ", traits->name, " blocks of ", traits->block_size);
    // Up to 2^62 elements of up to 8 bytes: the size can exceed 64 bits (and would wrap to a small one).
    const size_t row_bytes = ggml_row_bytes(t.type, t.shape[0]);
    const uint64_t rows = elements / static_cast<uint64_t>(t.shape[0]);
    KVQ_CHECK(rows <= std::numeric_limits<size_t>::max() / row_bytes, where(), ": tensor ", t.name, " of ", elements,
              " elements is larger than any file");
    t.bytes = row_bytes * static_cast<size_t>(rows);
    t.offset = read<uint64_t>(t.name + " offset");
    KVQ_CHECK(t.offset % f_.alignment_ == 0, where(), ": tensor ", t.name, " offset ", t.offset,
              " is not a multiple of the alignment ", f_.alignment_);
    KVQ_CHECK(f_.tensor_index_.emplace(t.name, f_.tensors_.size()).second, where(), ": duplicate tensor name ",
              t.name);
    f_.tensors_.push_back(std::move(t));
  }

  void place_tensor_data() {
    const size_t data_start = (pos_ + f_.alignment_ - 1) / f_.alignment_ * f_.alignment_;
    KVQ_CHECK(data_start <= bytes_.size() || f_.tensors_.empty(), where(), ": truncated before the tensor data (",
              bytes_.size(), " bytes, data would start at ", data_start, ")");
    const size_t data_size = data_start <= bytes_.size() ? bytes_.size() - data_start : 0;
    for (auto& t : f_.tensors_) {
      KVQ_CHECK(t.offset <= data_size && t.bytes <= data_size - t.offset, where(), ": tensor ", t.name,
                " data [", t.offset, ", +", t.bytes, ") lies outside the ", data_size, " bytes of tensor data");
      t.data = bytes_.data() + data_start + t.offset;
    }
    reject_overlaps();
  }

  // Writers lay tensors out one after another; two tensors sharing bytes are a crafted file (one tensor's data
  // read as another type's).
  void reject_overlaps() const {
    std::vector<const GgufTensorInfo*> by_offset;
    for (const auto& t : f_.tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const GgufTensorInfo &prev = *by_offset[i - 1], &t = *by_offset[i];
      KVQ_CHECK(prev.offset + prev.bytes <= t.offset || prev.bytes == 0 || t.bytes == 0, where(), ": tensor ",
                t.name, " data [", t.offset, ", +", t.bytes, ") overlaps tensor ", prev.name, " [", prev.offset, ", +",
                prev.bytes, ")");
    }
  }

  GgufFile& f_;
  std::span<const std::byte> bytes_;
  size_t pos_ = 0;
};

GgufFile::GgufFile(const std::filesystem::path& path, FileResidency residency) : file_(path, residency) {
  GgufParser(*this).parse();
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufValue& GgufFile::at(std::string_view key) const {
  const GgufValue* v = find(key);
  KVQ_CHECK(v != nullptr, path().string(), ": GGUF metadata key ", key, " is missing");
  return *v;
}

std::span<const std::byte> GgufFile::header_bytes() const {
  const std::span<const std::byte> all = file_.bytes();
  if (tensors_.empty()) return all;
  const std::byte* data_section = tensors_.front().data - tensors_.front().offset;
  return all.first(static_cast<size_t>(data_section - all.data()));
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  KVQ_CHECK(t != nullptr, path().string(), ": tensor ", name, " is missing");
  return *t;
}

}  // namespace kvq
