// GGUF header, metadata and tensor table (kvq::GgufFile). Any bytes either open or raise kvq::Error. An opened
// file is read through every accessor, and each tensor must describe bytes that lie inside the file: its size the
// row size times the rows (computed here without overflow), its offset plus size within the file.
#include <cstdint>

#include "fuzz_check.hpp"
#include "input_file.hpp"
#include "kvq/detail/ggml_quants.hpp"
#include "kvq/detail/gguf.hpp"
#include "kvq/error.hpp"

namespace {

volatile uint64_t sink;  // keeps the reads of tensor bytes

// Every accessor of a value; those of other types must throw kvq::Error.
void read_value(const kvq::GgufValue& v) {
  const auto attempt = [](auto&& read) {
    try {
      read();
    } catch (const kvq::Error&) {
    }
  };
  attempt([&] { sink = sink + v.as_uint(); });
  attempt([&] { sink = sink + static_cast<uint64_t>(v.as_int()); });
  attempt([&] { sink = sink + static_cast<uint64_t>(v.as_float() != 0); });
  attempt([&] { sink = sink + v.as_bool(); });
  attempt([&] { sink = sink + v.as_string().size(); });
  attempt([&] { sink = sink + v.as_strings().size(); });
  attempt([&] { sink = sink + v.as_floats().size(); });
  attempt([&] { sink = sink + v.as_ints().size(); });
  attempt([&] {
    sink = sink + static_cast<uint64_t>(v.element_type());
    for (const kvq::GgufValue& e : v.as_array()) read_value(e);
  });
}

void check_tensor(const kvq::GgufFile& g, const kvq::GgufTensorInfo& t, size_t file_bytes) {
  KVQ_FUZZ_CHECK(g.find_tensor(t.name) == &t && !t.shape.empty(), "a tensor is found by its name");
  uint64_t bytes = kvq::ggml_row_bytes(t.type, t.shape[0]);
  bool overflow = false;  // then no file holds the tensor, and the parser must have refused it
  for (size_t i = 1; i < t.shape.size(); ++i)
    overflow |= __builtin_mul_overflow(bytes, static_cast<uint64_t>(t.shape[i]), &bytes);
  KVQ_FUZZ_CHECK(!overflow && bytes == t.bytes, "a tensor's size is its row size times its rows");
  KVQ_FUZZ_CHECK(t.offset <= file_bytes && t.bytes <= file_bytes - t.offset, "a tensor's bytes lie in the file");
  if (t.bytes > 0) sink = sink + static_cast<uint64_t>(t.data[0]) + static_cast<uint64_t>(t.data[t.bytes - 1]);
  sink = sink + static_cast<uint64_t>(t.elements() + t.rows());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kvq::GgufFile g(kvq::fuzz::input_file().write(data, size));
    KVQ_FUZZ_CHECK(g.version() == 2 || g.version() == 3, "only versions 2 and 3 open");
    for (const auto& [key, value] : g.metadata()) {
      KVQ_FUZZ_CHECK(g.find(key) == &value, "a metadata value is found by its key");
      read_value(value);
    }
    for (const kvq::GgufTensorInfo& t : g.tensors()) check_tensor(g, t, size);
  } catch (const kvq::Error&) {
    // the expected outcome for a damaged file
  }
  return 0;
}
