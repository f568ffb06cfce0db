// Codec specs (kvq::CodecSpec::parse) and the codecs built from them (kvq::make_codec). The first three bytes pick
// the codec's parameters: the head dimension (from a list: the multiples of 16 up to 128, which every codec takes,
// and a few that codecs refuse; larger ones only cost time), the block's tokens (0..255), the role and the seed; the
// fourth how many tokens to encode. The rest is the spec's text. Any text either parses or raises kvq::Error, and a parsed spec survives its canonical
// text (parse(str()) == spec). Any spec either builds a codec or raises kvq::Error. A codec that needs no training
// encodes a block of Gaussian tokens, decodes it, and scores and accumulates over it.
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "byte_reader.hpp"
#include "fuzz_check.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/error.hpp"

namespace {

constexpr std::array kDims{16, 32, 48, 64, 80, 96, 112, 128, 0, 8, 24, 100, 520, -16};

// Encodes 1 + tokens % T tokens, decodes them, and runs the attention primitives over the block.
void exercise(const kvq::Codec& codec, uint8_t tokens, uint64_t seed) {
  const int T = codec.block_tokens(), d = codec.dim(), m = codec.space_dim();
  const int n = 1 + tokens % T;
  const std::vector<float> x = kvq::gaussian_vectors(static_cast<size_t>(n), d, seed);
  std::vector<uint8_t> block(codec.block_bytes());
  codec.encode(x.data(), n, block.data());
  std::vector<float> decoded(x.size());
  codec.decode(block.data(), n, decoded.data());
  constexpr int kQueries = 2;
  const std::vector<float> q = kvq::gaussian_vectors(kQueries, d, seed + 1);
  std::vector<float> scores(static_cast<size_t>(kQueries) * T), acc(static_cast<size_t>(kQueries) * m);
  codec.prepare(q.data(), kQueries)->scores(block.data(), n, scores.data());
  std::vector<float> w(scores.size(), 1.0f / static_cast<float>(n));
  codec.accumulate(w.data(), kQueries, block.data(), n, acc.data());
  std::vector<float> out(static_cast<size_t>(kQueries) * d);
  codec.from_space(acc.data(), kQueries, out.data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvq::fuzz::ByteReader in(data, size);
  kvq::CodecParams params;
  params.dim = kDims[in.pick(kDims.size())];
  params.block_tokens = in.take<uint8_t>();
  const uint8_t role_and_seed = in.take<uint8_t>();
  params.role = role_and_seed & 1 ? kvq::Role::value : kvq::Role::key;
  params.seed = role_and_seed >> 1;
  const uint8_t tokens = in.take<uint8_t>();
  const std::string_view text = in.rest();
  try {
    const kvq::CodecSpec spec = kvq::CodecSpec::parse(text);
    KVQ_FUZZ_CHECK(kvq::CodecSpec::parse(spec.str()) == spec, "a spec survives its canonical text");
    const std::unique_ptr<kvq::Codec> codec = kvq::make_codec(text, params);
    KVQ_FUZZ_CHECK(codec->block_bytes() > 0 && codec->space_dim() > 0, "a codec has a layout");
    if (!codec->needs_training()) exercise(*codec, tokens, params.seed);
  } catch (const kvq::Error&) {
    // the expected outcome for a bad spec or parameters a codec refuses
  }
  return 0;
}
