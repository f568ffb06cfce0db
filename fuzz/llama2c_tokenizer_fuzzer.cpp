// llama2.c tokenizer files (kvq::load_llama2c_tokenizer): any bytes either load or raise kvq::Error; a loaded
// tokenizer passes the checks of tokenizer_checks.hpp on a sample text.
#include <cstdint>

#include "input_file.hpp"
#include "kvq/error.hpp"
#include "kvq/model.hpp"
#include "tokenizer_checks.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto tok = kvq::load_llama2c_tokenizer(kvq::fuzz::input_file().write(data, size));
    kvq::fuzz::check_loaded(*tok);
  } catch (const kvq::Error&) {
    // the expected outcome for a damaged file
  }
  return 0;
}
