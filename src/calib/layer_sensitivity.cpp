#include "kvq/detail/calibrate.hpp"
#include "kvq/error.hpp"

namespace kvq {

LayerSensitivity measure_layer_sensitivity(const LlamaModel& model, const Tokenizer& tokenizer,
                                           std::span<const int> tokens, const std::vector<std::string>& codecs,
                                           const PerplexityOptions& options, const KVCacheSpec& cache,
                                           const std::function<void(int, int)>& progress) {
  KVQ_CHECK(!codecs.empty(), "no candidate codecs to measure");
  const int n_layers = model.config().n_layers;
  LayerSensitivity s;
  s.codecs = codecs;
  s.kld.resize(static_cast<size_t>(n_layers));
  KVCacheSpec f16 = cache;
  f16.key_codec = f16.value_codec = "f16";
  f16.layers.clear();
  f16.layer_codecs.clear();
  for (int l = 0; l < n_layers; ++l) {
    PerplexityOptions o = options;
    o.reference = f16;
    o.caches.clear();
    o.progress = {};
    std::vector<std::array<size_t, 2>> slot;  // [cache]: (role, codec) it measures
    for (size_t c = 0; c < codecs.size(); ++c) {
      if (codecs[c] == "f16") continue;
      for (int role = 0; role < 2; ++role) {
        KVCacheSpec spec = f16;
        spec.layer_codecs.assign(static_cast<size_t>(n_layers), LayerCodecs{"f16", "f16"});
        (role == 0 ? spec.layer_codecs[static_cast<size_t>(l)].key : spec.layer_codecs[static_cast<size_t>(l)].value) =
            codecs[c];
        o.caches.push_back(spec);
        slot.push_back({static_cast<size_t>(role), c});
      }
    }
    auto& kld = s.kld[static_cast<size_t>(l)];
    kld[0].assign(codecs.size(), 0.0);
    kld[1].assign(codecs.size(), 0.0);
    if (!o.caches.empty()) {
      const PerplexityResult r = measure_perplexity(model, tokenizer, tokens, o);
      for (size_t i = 0; i < slot.size(); ++i) kld[slot[i][0]][slot[i][1]] = r.caches[i].kld;
      s.tokens = r.tokens;
    }
    if (progress) progress(l + 1, n_layers);
  }
  return s;
}

}  // namespace kvq
