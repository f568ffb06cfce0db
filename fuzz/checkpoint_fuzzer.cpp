// Model checkpoints (kvq::LlamaModel::load): a llama2.c header and the weights it promises, or a GGUF model
// (recognised by its first bytes, as load does). Any bytes either load or raise kvq::Error. A loaded model runs one
// forward pass of one position: every weight view is read, so a view that reaches past the file shows up as a fault
// or a sanitizer report; the logits have the vocabulary's size.
#include <cstdint>

#include "fuzz_check.hpp"
#include "input_file.hpp"
#include "kvq/error.hpp"
#include "kvq/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kvq::LlamaModel model = kvq::LlamaModel::load(kvq::fuzz::input_file().write(data, size));
    const kvq::LlamaConfig& c = model.config();
    c.validate();
    kvq::LlamaRunner runner(model, /*context=*/1, /*threads=*/1);
    const auto logits = runner.forward(0, 0);
    KVQ_FUZZ_CHECK(logits.size() == static_cast<size_t>(c.vocab_size), "one logit per token of the vocabulary");
  } catch (const kvq::Error&) {
    // the expected outcome for a damaged file
  }
  return 0;
}
