#include <array>
#include <cstdint>

#include "core/crc32c.hpp"
#include "kvq/detail/calibration.hpp"

namespace kvq {

ModelIdentity model_identity(const LlamaModel& model) {
  const LlamaConfig& c = model.config();
  ModelIdentity id;
  id.n_layers = c.n_layers;
  id.n_heads = c.n_heads;
  id.n_kv_heads = c.n_kv_heads;
  id.head_dim = c.head_dim();
  id.channel_layout = c.rope_style == RopeStyle::adjacent_pairs ? "rope_adjacent_pairs" : "rope_halves";
  if (const GgufFile* gguf = model.gguf()) {
    id.architecture = std::string(gguf->at("general.architecture").as_string());
    const std::span<const std::byte> header = gguf->header_bytes();
    id.model_crc32c = crc32c(header.data(), header.size());
  } else {  // llama2.c: the header's fields are all the file says of itself
    id.architecture = "llama2.c";
    const std::array<int32_t, 7> header{c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
                                        c.max_seq_len};
    id.model_crc32c = crc32c(header.data(), sizeof(header));
  }
  return id;
}

}  // namespace kvq
