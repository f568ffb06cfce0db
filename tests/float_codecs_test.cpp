// The float codecs' range rule: a finite value that f16 or bf16 would round to Inf is rejected, naming where it is.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvq/codec.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

std::string encode_error(const std::string& spec, float value) {
  const auto codec = make_codec(spec, CodecParams{16, 4, 0, Role::key});
  std::vector<float> x(4 * 16, 1.0f);
  x[2 * 16 + 5] = value;  // token 2, channel 5
  std::vector<uint8_t> block(codec->block_bytes());
  try {
    codec->encode(x.data(), 4, block.data());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(FloatCodecs, ValuesBeyondTheFormatAreRejected) {
  for (float v : {65504.0f, -65504.0f, 65519.0f, 6e-8f, -1e-30f}) EXPECT_EQ(encode_error("f16", v), "") << v;
  for (float v : {65520.0f, -70000.0f, 1e30f}) {
    const std::string e = encode_error("f16", v);
    EXPECT_NE(e.find("token 2 channel 5"), std::string::npos) << v << ": " << e;
    EXPECT_NE(e.find("beyond the format's range"), std::string::npos) << e;
  }
  EXPECT_EQ(encode_error("bf16", 3.0e38f), "");
  EXPECT_NE(encode_error("bf16", 3.4e38f), "");
  EXPECT_EQ(encode_error("f32", 3.4e38f), "");
}

}  // namespace
}  // namespace kvq
