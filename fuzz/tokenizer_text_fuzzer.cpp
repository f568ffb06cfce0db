// The tokenizers on any text, encode then decode. The first byte picks the tokenizer, the rest is the text:
//   0  llama2.c's tok512 (../shared/data/models/tok512.bin; inputs for it are skipped where the file is absent)
//   1  the SentencePiece GGUF of small_gguf_tokenizers.hpp
//   2  its byte-level BPE GGUF with the gpt2 pre-tokenizer
//   3  the same with smollm's (digits split one by one)
// Ids lie in the vocabulary and, since each of them can spell every byte, decode(encode(text)) == text wherever the
// text does not write out a control token (which encodes to itself and decodes to nothing). Every text is valid
// input: an exception is a finding too.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "byte_reader.hpp"
#include "fuzz_check.hpp"
#include "input_file.hpp"
#include "kvq/detail/gguf.hpp"
#include "kvq/model.hpp"
#include "small_gguf_tokenizers.hpp"
#include "tokenizer_checks.hpp"

namespace {

struct Candidate {
  std::unique_ptr<kvq::Tokenizer> tokenizer;     // null where its file is absent
  std::vector<std::string_view> control_texts;  // texts that encode to a control token
};

std::unique_ptr<kvq::Tokenizer> from_gguf(const std::vector<uint8_t>& bytes) {
  kvq::fuzz::InputFile file;
  return kvq::load_gguf_tokenizer(kvq::GgufFile(file.write(bytes.data(), bytes.size())));
}

std::vector<Candidate> load_tokenizers() {
  std::vector<Candidate> c(4);
  const std::filesystem::path tok512 = std::filesystem::path(KVQ_SOURCE_DIR) / "../shared/data/models/tok512.bin";
  if (std::filesystem::exists(tok512)) c[0].tokenizer = kvq::load_llama2c_tokenizer(tok512);
  c[1] = {from_gguf(kvq::fuzz::sentencepiece_gguf()), {"<s>", "</s>", "<start_of_turn>"}};
  for (size_t i : {2, 3})
    c[i] = {from_gguf(kvq::fuzz::byte_level_bpe_gguf(i == 2 ? "gpt2" : "smollm")),
            {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}};
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<Candidate> candidates = load_tokenizers();
  kvq::fuzz::ByteReader in(data, size);
  const Candidate& c = candidates[in.pick(candidates.size())];
  if (!c.tokenizer) return 0;
  const std::string_view text = in.rest();
  const std::string decoded = kvq::fuzz::encode_decode(*c.tokenizer, text);
  bool writes_control = false;
  for (std::string_view control : c.control_texts) writes_control |= text.find(control) != std::string_view::npos;
  KVQ_FUZZ_CHECK(writes_control || decoded == text, "decode(encode(text)) gives the text back");
  return 0;
}
