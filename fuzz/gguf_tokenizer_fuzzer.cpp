// Tokenizers from GGUF metadata (kvq::load_gguf_tokenizer: tokenizer.ggml.model llama or gpt2, tokens, scores,
// token types, merges, special ids, pre-tokenizer): any file either gives a tokenizer or raises kvq::Error; a
// tokenizer passes the checks of tokenizer_checks.hpp on a sample text.
#include <cstdint>

#include "input_file.hpp"
#include "kvq/detail/gguf.hpp"
#include "kvq/error.hpp"
#include "kvq/model.hpp"
#include "tokenizer_checks.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kvq::GgufFile gguf(kvq::fuzz::input_file().write(data, size));
    const auto tok = kvq::load_gguf_tokenizer(gguf);
    kvq::fuzz::check_loaded(*tok);
  } catch (const kvq::Error&) {
    // the expected outcome for a damaged file or a vocabulary kvq does not read
  }
  return 0;
}
