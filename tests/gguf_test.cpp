// The GGUF reader on files written byte by byte: every metadata type, tensor placement under an alignment, and a
// clear kvq::Error for each kind of corruption (never a crash: every truncation of a valid file is tried).
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include "gguf_writer.hpp"
#include "kvq/detail/gguf.hpp"
#include "kvq/error.hpp"
#include "temp_file.hpp"

namespace kvq {
namespace {

using test::GgufWriter;
using test::TempFile;

std::vector<uint8_t> float_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A small valid file: one of each metadata type, an F32 tensor [3 rows x 4] and a Q8_0 tensor [2 rows x 32].
GgufWriter sample_writer(size_t alignment) {
  GgufWriter w;
  if (alignment != 32) {
    w.kv<uint32_t>("general.alignment", GgufType::u32, static_cast<uint32_t>(alignment));
    w.set_alignment(alignment);
  }
  w.kv<uint8_t>("t.u8", GgufType::u8, 200);
  w.kv<int8_t>("t.i8", GgufType::i8, -100);
  w.kv<uint16_t>("t.u16", GgufType::u16, 60000);
  w.kv<int16_t>("t.i16", GgufType::i16, -30000);
  w.kv<uint32_t>("t.u32", GgufType::u32, 4000000000u);
  w.kv<int32_t>("t.i32", GgufType::i32, -2000000000);
  w.kv<float>("t.f32", GgufType::f32, 0.25f);
  w.kv<uint8_t>("t.bool", GgufType::boolean, 1);
  w.kv_string("t.string", "héllo");
  w.kv<uint64_t>("t.u64", GgufType::u64, 1ull << 60);
  w.kv<int64_t>("t.i64", GgufType::i64, -(1ll << 60));
  w.kv<double>("t.f64", GgufType::f64, -1.5);
  w.kv_array<int32_t>("t.ints", GgufType::i32, {3, -1, 4});
  w.kv_array<float>("t.floats", GgufType::f32, {0.5f, -2.0f});
  w.kv_strings("t.strings", {"a", "", "ccc"});
  {  // an array of two arrays of u8
    std::vector<uint8_t> v;
    GgufWriter::put<uint32_t>(v, static_cast<uint32_t>(GgufType::array));
    GgufWriter::put<uint64_t>(v, 2);
    for (uint8_t len : {1, 2}) {
      GgufWriter::put<uint32_t>(v, static_cast<uint32_t>(GgufType::u8));
      GgufWriter::put<uint64_t>(v, len);
      for (uint8_t k = 0; k < len; ++k) v.push_back(static_cast<uint8_t>(10 + k));
    }
    w.kv_raw("t.nested", GgufType::array, v);
  }
  w.tensor("weights", {4, 3}, GgmlType::F32, float_bytes({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  std::vector<uint8_t> q8(2 * 34, 0);
  q8[0] = 0x00, q8[1] = 0x3c;  // d = 1.0 in fp16
  q8[2] = 7;
  w.tensor("q8", {32, 2}, GgmlType::Q8_0, q8);
  return w;
}

std::string error_of(const std::filesystem::path& p) {
  try {
    GgufFile f(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void expect_error(const std::vector<uint8_t>& bytes, const std::string& needle) {
  TempFile file("gguf_error.gguf");
  const std::string msg = error_of(file.write(bytes));
  EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected to contain: " << needle;
}

TEST(Gguf, ReadsEveryValueTypeAndPlacesTensors) {
  for (size_t alignment : {32, 64, 8}) {
    SCOPED_TRACE("alignment " + std::to_string(alignment));
    TempFile file("gguf_sample.gguf");
    const GgufFile f(file.write(sample_writer(alignment).bytes()));
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), alignment);
    EXPECT_EQ(f.at("t.u8").as_uint(), 200u);
    EXPECT_EQ(f.at("t.i8").as_int(), -100);
    EXPECT_EQ(f.at("t.u16").as_uint(), 60000u);
    EXPECT_EQ(f.at("t.i16").as_int(), -30000);
    EXPECT_EQ(f.at("t.u32").as_uint(), 4000000000u);
    EXPECT_EQ(f.at("t.i32").as_int(), -2000000000);
    EXPECT_EQ(f.at("t.f32").as_float(), 0.25);
    EXPECT_TRUE(f.at("t.bool").as_bool());
    EXPECT_EQ(f.at("t.string").as_string(), "héllo");
    EXPECT_EQ(f.at("t.u64").as_uint(), 1ull << 60);
    EXPECT_EQ(f.at("t.i64").as_int(), -(1ll << 60));
    EXPECT_EQ(f.at("t.f64").as_float(), -1.5);
    EXPECT_EQ(f.at("t.ints").as_ints(), (std::vector<int64_t>{3, -1, 4}));
    EXPECT_EQ(f.at("t.floats").as_floats(), (std::vector<float>{0.5f, -2.0f}));
    EXPECT_EQ(f.at("t.strings").as_strings(), (std::vector<std::string_view>{"a", "", "ccc"}));
    EXPECT_EQ(f.at("t.strings").element_type(), GgufType::string);
    const auto& nested = f.at("t.nested").as_array();
    ASSERT_EQ(nested.size(), 2u);
    EXPECT_EQ(nested[1].as_ints(), (std::vector<int64_t>{10, 11}));
    EXPECT_EQ(f.find("t.absent"), nullptr);

    ASSERT_EQ(f.tensors().size(), 2u);
    const GgufTensorInfo& wt = f.tensor("weights");
    EXPECT_EQ(wt.type, GgmlType::F32);
    EXPECT_EQ(wt.shape, (std::vector<int64_t>{4, 3}));
    EXPECT_EQ(wt.rows(), 3);
    EXPECT_EQ(wt.bytes, 48u);
    float last;
    std::memcpy(&last, wt.data + 44, 4);
    EXPECT_EQ(last, 12.0f);
    const GgufTensorInfo& q8 = f.tensor("q8");
    EXPECT_EQ(q8.offset % alignment, 0u);
    EXPECT_EQ(q8.bytes, 68u);
    float row[32];
    dequantize_row(q8.type, q8.data, row, 32);
    EXPECT_EQ(row[0], 7.0f);
  }
}

TEST(Gguf, AccessorsNameTheKeyOnTypeMismatch) {
  TempFile file("gguf_sample.gguf");
  const GgufFile f(file.write(sample_writer(32).bytes()));
  try {
    f.at("t.string").as_uint();
    FAIL() << "expected kvq::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.string is string, expected an integer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f.at("t.i8").as_uint(), Error);  // negative
  EXPECT_THROW(f.at("t.strings").as_ints(), Error);
  EXPECT_THROW(f.at("t.absent"), Error);
  EXPECT_THROW(f.tensor("absent"), Error);
}

TEST(Gguf, ReadsVersion2) {
  GgufWriter w = sample_writer(32);
  w.set_version(2);
  TempFile file("gguf_v2.gguf");
  EXPECT_EQ(GgufFile(file.write(w.bytes())).version(), 2u);
}

TEST(Gguf, EveryTruncationIsAnError) {
  const std::vector<uint8_t> full = sample_writer(32).bytes();
  TempFile file("gguf_cut.gguf");
  file.write(full);
  for (size_t n = full.size(); n-- > 0;) {
    file.truncate(n);
    const std::string msg = error_of(file.path());
    ASSERT_NE(msg, "(no error)") << "prefix of " << n << " bytes";
    if (n > 0) {
      EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("lies outside") != std::string::npos ||
                  msg.find("is impossible") != std::string::npos)
          << msg;
    }
  }
}

TEST(Gguf, CorruptionsGiveClearErrors) {
  const std::vector<uint8_t> good = sample_writer(32).bytes();
  {
    auto b = good;
    b[0] = 'X';
    expect_error(b, "bad magic");
  }
  {
    auto b = good;
    b[4] = 4;
    expect_error(b, "unsupported GGUF version 4");
  }
  {
    auto b = good;  // tensor count far beyond what the file could hold
    b[8 + 7] = 0x10;
    expect_error(b, "tensor count");
  }
  {
    GgufWriter w;
    w.kv<uint32_t>("bad.type", static_cast<GgufType>(13), 0);
    expect_error(w.bytes(), "unknown GGUF value type 13 for bad.type");
  }
  {
    GgufWriter w;  // an array claiming 2^40 elements
    std::vector<uint8_t> v;
    GgufWriter::put<uint32_t>(v, static_cast<uint32_t>(GgufType::u32));
    GgufWriter::put<uint64_t>(v, 1ull << 40);
    w.kv_raw("huge", GgufType::array, v);
    expect_error(w.bytes(), "huge array length");
  }
  {
    GgufWriter w;
    w.kv<uint8_t>("flag", GgufType::boolean, 2);
    expect_error(w.bytes(), "flag is a bool with value 2");
  }
  {
    GgufWriter w;
    w.kv<uint32_t>("general.alignment", GgufType::u32, 24);
    expect_error(w.bytes(), "general.alignment 24 is not a power of two");
  }
  {
    GgufWriter w;
    w.kv<uint8_t>("dup", GgufType::u8, 1);
    w.kv<uint8_t>("dup", GgufType::u8, 2);
    expect_error(w.bytes(), "duplicate GGUF metadata key dup");
  }
  {
    GgufWriter w;
    w.tensor("odd", {4}, static_cast<GgmlType>(77), std::vector<uint8_t>(16));
    expect_error(w.bytes(), "tensor odd has unknown ggml type id 77");
  }
  {
    GgufWriter w;
    w.tensor("partial", {48}, GgmlType::Q4_0, std::vector<uint8_t>(36));
    expect_error(w.bytes(), "partial rows of 48 elements are not a whole number of Q4_0 blocks");
  }
  {
    GgufWriter w;
    w.tensor("t", {4, 0}, GgmlType::F32, {});
    expect_error(w.bytes(), "tensor t has an invalid shape");
  }
  {
    GgufWriter w;
    w.tensor("t", {1, 1, 1, 1, 1}, GgmlType::F32, std::vector<uint8_t>(4));
    expect_error(w.bytes(), "tensor t has 5 dimensions");
  }
  {
    GgufWriter w;
    w.tensor("a", {8}, GgmlType::F32, std::vector<uint8_t>(32));
    w.tensor("a", {8}, GgmlType::F32, std::vector<uint8_t>(32));
    expect_error(w.bytes(), "duplicate tensor name a");
  }
  {
    GgufWriter w;  // data shorter than the tensor needs
    w.tensor("short", {16}, GgmlType::F32, std::vector<uint8_t>(40));
    expect_error(w.bytes(), "tensor short data [0, +64) lies outside the 40 bytes of tensor data");
  }
  {
    // The last tensor's offset moved past the end of the file, and then to a misaligned place.
    GgufWriter w;
    w.tensor("x", {8}, GgmlType::F32, std::vector<uint8_t>(32));
    auto b = w.bytes();
    const size_t offset_at = 24 + 8 + 1 + 4 + 8 + 4;  // header, name, n_dims, dim, type
    uint64_t offset = 1ull << 50;
    std::memcpy(b.data() + offset_at, &offset, 8);
    expect_error(b, "tensor x data [1125899906842624, +32) lies outside");
    offset = 4;
    std::memcpy(b.data() + offset_at, &offset, 8);
    expect_error(b, "tensor x offset 4 is not a multiple of the alignment 32");
  }
}

TEST(Gguf, MissingAndEmptyFiles) {
  TempFile file("gguf_empty.gguf");
  EXPECT_NE(error_of(file.write({})).find("is empty"), std::string::npos);
  EXPECT_NE(error_of("/nonexistent/kvq.gguf").find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace kvq
