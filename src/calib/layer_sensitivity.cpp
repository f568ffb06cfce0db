// Single-layer sensitivities from one f16 pass: a cache that differs from f16 only in layer l computes, in layers
// 0..l-1, exactly what the f16 reference computes, so each measured cache starts from the reference's residual
// stream entering layer l (LlamaRunner::forward_chunk_from) and the reference runs once for all layers. With an
// anchor codec, the other codecs (and centered keys) run through layer l alone and their figures are scaled from
// the anchor's. Codecs that need training learn each layer's state from the reference's keys and values first.
#include <algorithm>
#include <limits>
#include <memory>
#include <utility>

#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/calibrate.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

// The reference's residual stream, [window][chunk] -> [n_layers + 1][n][dim] (forward_chunk_residuals).
using Residuals = std::vector<std::vector<std::vector<float>>>;

Residuals reference_residuals(LlamaRunner& reference, const std::vector<PerplexityWindow>& windows, int chunk) {
  Residuals r(windows.size());
  for (size_t w = 0; w < windows.size(); ++w) {
    reference.reset();
    const std::vector<int>& inputs = windows[w].inputs;
    for (size_t first = 0; first < inputs.size(); first += static_cast<size_t>(chunk)) {
      const size_t n = std::min(inputs.size() - first, static_cast<size_t>(chunk));
      std::vector<float>& x = r[w].emplace_back(reference.residual_floats(static_cast<int>(n)));
      reference.forward_chunk_residuals({inputs.data() + first, n}, static_cast<int>(first), x, false);
    }
  }
  return r;
}

// The reference's keys and values over every window (the training vectors of codecs that need training).
KVSample reference_kv(LlamaRunner& reference, const std::vector<PerplexityWindow>& windows, int chunk) {
  KVSample all;
  for (const PerplexityWindow& w : windows) {
    reference.reset();
    KVSample one = reference.capture_kv(w.inputs, chunk);
    all.keys.resize(one.keys.size());
    all.values.resize(one.values.size());
    for (size_t l = 0; l < one.keys.size(); ++l) {
      all.keys[l].insert(all.keys[l].end(), one.keys[l].begin(), one.keys[l].end());
      all.values[l].insert(all.values[l].end(), one.values[l].begin(), one.values[l].end());
    }
    all.tokens += one.tokens;
  }
  reference.reset();
  return all;
}

// What a single-layer cache compresses: the layer's keys as they are, its values, or its keys centered.
enum Slot : size_t { plain_keys, values, centered_keys };

std::vector<uint8_t>& state_of(TrainedStates& states, Slot slot) {
  return slot == plain_keys ? states.key : slot == values ? states.value : states.centered_key;
}

// The state `codec` learns as `layer`'s codec in `slot` of a cache with f16's block size and seed (so its seeds),
// from the layer's vectors in `sample`.
std::vector<uint8_t> trained_state(const LlamaConfig& model, const KVCacheSpec& f16, const KVSample& sample,
                                   int layer, Slot slot, const std::string& codec) {
  CacheConfig config;
  config.n_layers = model.n_layers;
  config.n_kv_heads = model.n_kv_heads;
  config.head_dim = model.head_dim();
  config.block_tokens = f16.block_tokens;
  config.seed = f16.seed;
  (slot == values ? config.value_codec : config.key_codec) = codec;
  config.center_keys = slot == centered_keys;  // train_layer centers the keys as the cache would
  KVCache cache(config);  // no pages: only its codecs
  const size_t l = static_cast<size_t>(layer);
  cache.train_layer(layer, sample.keys[l].data(), sample.values[l].data(),
                    sample.tokens * static_cast<size_t>(model.n_kv_heads));
  return (slot == values ? cache.value_codec(layer) : cache.key_codec(layer)).state();
}

// A cache with only `layer`'s keys or values in `codec` (starting from `state`, if any), f16 elsewhere.
KVCacheSpec single_layer_cache(const KVCacheSpec& f16, int n_layers, int layer, Slot slot, const std::string& codec,
                               const std::vector<uint8_t>& state) {
  KVCacheSpec spec = f16;
  spec.layer_codecs.assign(static_cast<size_t>(n_layers), LayerCodecs{"f16", "f16"});
  LayerCodecs& c = spec.layer_codecs[static_cast<size_t>(layer)];
  (slot == values ? c.value : c.key) = codec;
  (slot == values ? c.value_state : c.key_state) = state;
  c.center_keys = slot == centered_keys;
  return spec;
}

// What one layer's measurement shares: the windows, the reference and its residual stream, the scored positions.
struct LayerPass {
  const std::vector<PerplexityWindow>& windows;
  const Residuals& residuals;
  LlamaRunner& reference;
  int layer, n_layers, vocab;
  size_t chunk, from, dim;

  // Calls f(first position, positions, the reference's stream entering each layer [n_layers + 1][n][dim]) for
  // every chunk of every window, resetting `runs` at each window.
  template <class F>
  void for_each_chunk(const std::vector<std::unique_ptr<LlamaRunner>>& runs, F&& f) const {
    for (size_t w = 0; w < windows.size(); ++w) {
      for (auto& r : runs) r->reset();
      const size_t positions = windows[w].inputs.size();
      for (size_t first = 0, c = 0; first < positions; first += chunk, ++c)
        f(first, std::min(positions - first, chunk), std::span<const float>(residuals[w][c]));
    }
  }
  std::span<const float> stream(std::span<const float> x, int l, size_t n) const {
    return x.subspan(static_cast<size_t>(l) * n * dim, n * dim);
  }

  // Mean KL divergence of each run (started at `layer`) against the reference over the scored positions.
  std::vector<double> klds(const std::vector<std::unique_ptr<LlamaRunner>>& runs) const {
    if (runs.empty()) return {};
    std::vector<double> kld(runs.size(), 0.0);
    std::vector<std::span<const float>> logits(runs.size());
    ReferenceDistribution ref_row;
    size_t scored = 0;
    for_each_chunk(runs, [&](size_t first, size_t n, std::span<const float> x) {
      const int pos = static_cast<int>(first);
      const std::span<const float> ref_logits = reference.forward_chunk_from(n_layers, stream(x, n_layers, n), pos);
      for (size_t i = 0; i < runs.size(); ++i) logits[i] = runs[i]->forward_chunk_from(layer, stream(x, layer, n), pos);
      for (size_t j = first < from ? from - first : 0; j < n; ++j, ++scored) {
        const auto row = [&](std::span<const float> all) { return all.subspan(j * vocab, static_cast<size_t>(vocab)); };
        ref_row.assign(row(ref_logits));
        for (size_t i = 0; i < runs.size(); ++i)
          kld[i] += ref_row.kl_divergence(row(logits[i]), log_sum_exp(row(logits[i])));
      }
    });
    return mean(kld, scored);
  }

  // Mean squared distance, per scored position, of each run's residual stream leaving `layer` (that layer alone
  // run) from the reference's.
  std::vector<double> local_errors(const std::vector<std::unique_ptr<LlamaRunner>>& runs) const {
    std::vector<double> err(runs.size(), 0.0);
    size_t scored = 0;
    for_each_chunk(runs, [&](size_t first, size_t n, std::span<const float> x) {
      const std::span<const float> want = stream(x, layer + 1, n);
      const size_t j0 = first < from ? from - first : 0;
      for (size_t i = 0; i < runs.size(); ++i) {
        const std::span<const float> got = runs[i]->forward_layer(layer, stream(x, layer, n), static_cast<int>(first));
        for (size_t e = j0 * dim; e < n * dim; ++e) {
          const double d = static_cast<double>(got[e]) - want[e];
          err[i] += d * d;
        }
      }
      scored += n - std::min(n, j0);
    });
    return mean(err, scored);
  }

  static std::vector<double> mean(std::vector<double> sums, size_t scored) {
    KVQ_CHECK(sums.empty() || scored > 0, "no token was scored (windows of one token without BOS, or scoring from "
              "past every window's last position)");
    for (double& x : sums) x /= static_cast<double>(scored);
    return sums;
  }
};

}  // namespace

LayerSensitivity measure_layer_sensitivity(const LlamaModel& model, const Tokenizer& tokenizer,
                                           std::span<const int> tokens, const std::vector<std::string>& codecs,
                                           const PerplexityOptions& options, const KVCacheSpec& cache,
                                           KeyCandidates keys, const std::string& anchor,
                                           const std::function<void(int, int)>& progress) {
  KVQ_CHECK(!codecs.empty(), "no candidate codecs to measure");
  for (const std::string& c : codecs) make_codec(c, CodecParams{});  // an unknown codec fails before any work
  KVQ_CHECK(anchor.empty() || (anchor != "f16" && std::find(codecs.begin(), codecs.end(), anchor) != codecs.end()),
            "the anchor codec ", anchor, " must be one of the candidates other than f16");
  const LlamaConfig& config = model.config();
  const int n_layers = config.n_layers, bos = tokenizer.add_bos() ? 1 : 0;
  KVQ_CHECK(options.window >= 2 && options.window + bos <= config.max_seq_len, "window ", options.window,
            bos ? " + BOS" : "", " must be in [2, the model's context of ", config.max_seq_len, "]");
  KVQ_CHECK(options.chunk >= 1, "forward chunk ", options.chunk, " must be at least 1 token");
  KVQ_CHECK(options.score_from >= 0 && options.score_from < options.window, "scoring from position ",
            options.score_from, " leaves nothing to score in windows of ", options.window, " tokens");
  KVQ_CHECK(!tokens.empty(), "calibration of an empty text");

  KVCacheSpec f16 = cache;
  f16.key_codec = f16.value_codec = "f16";
  f16.center_keys = false;
  f16.layers.clear();
  f16.layer_codecs.clear();
  const auto make_runner = [&](const KVCacheSpec& spec) {
    auto runner = std::make_unique<LlamaRunner>(model, options.window + bos, options.threads, spec);
    runner->set_product_input(options.product_input);
    KVQ_CHECK(!runner->needs_calibration(), "the key/value codecs ", spec.label(), " were not trained");
    return runner;
  };
  // Whether each candidate needs training (in either role: the codecs that do, need it in both).
  std::vector<bool> trains(codecs.size());
  for (size_t c = 0; c < codecs.size(); ++c)
    trains[c] = make_codec(codecs[c], {config.head_dim(), cache.block_tokens, 0, Role::key})->needs_training();
  const std::vector<PerplexityWindow> windows = perplexity_windows(tokenizer, tokens, options.window);
  const std::unique_ptr<LlamaRunner> reference = make_runner(f16);
  const Residuals residuals = reference_residuals(*reference, windows, options.chunk);
  const KVSample sample = std::find(trains.begin(), trains.end(), true) != trains.end()
                              ? reference_kv(*reference, windows, options.chunk)
                              : KVSample{};
  if (progress) progress(0, n_layers);

  LayerSensitivity s;
  s.codecs = codecs;
  s.window = options.window;
  s.sink_tokens = cache.sink_tokens;
  s.kld.resize(static_cast<size_t>(n_layers));
  if (keys == KeyCandidates::plain_and_centered) s.centered_kld.resize(static_cast<size_t>(n_layers));
  if (sample.tokens > 0) s.states.assign(static_cast<size_t>(n_layers), std::vector<TrainedStates>(codecs.size()));
  // The slots each codec is measured in.
  std::vector<std::vector<Slot>> slots(codecs.size());
  for (size_t c = 0; c < codecs.size(); ++c) {
    if (codecs[c] == "f16") continue;
    slots[c] = {plain_keys, values};
    if (s.measured_centered() && centering_applies(codecs[c])) slots[c].push_back(centered_keys);
  }
  for (const PerplexityWindow& w : windows)
    s.tokens += w.inputs.size() - std::min(w.inputs.size(), static_cast<size_t>(options.score_from));
  for (int l = 0; l < n_layers; ++l) {
    const LayerPass pass{windows, residuals, *reference, l, n_layers, config.vocab_size,
                         static_cast<size_t>(options.chunk), static_cast<size_t>(options.score_from),
                         static_cast<size_t>(config.dim)};
    // [run]: (slot, codec) it measures, for the codecs run to the logits and for those run through layer l only.
    // With an anchor, its plain keys and values run to the logits; everything, the anchor included, runs locally.
    std::vector<std::pair<Slot, size_t>> measured, local;
    std::vector<std::unique_ptr<LlamaRunner>> measured_runs, local_runs;
    for (size_t c = 0; c < codecs.size(); ++c)
      for (Slot slot : slots[c]) {
        std::vector<uint8_t> state;
        if (trains[c])
          state = state_of(s.states[static_cast<size_t>(l)][c], slot) =
              trained_state(config, f16, sample, l, slot, codecs[c]);
        const KVCacheSpec spec = single_layer_cache(f16, n_layers, l, slot, codecs[c], state);
        if (anchor.empty() || (codecs[c] == anchor && slot != centered_keys)) {
          measured_runs.push_back(make_runner(spec));
          measured.emplace_back(slot, c);
        }
        if (!anchor.empty()) {
          local_runs.push_back(make_runner(spec));
          local.emplace_back(slot, c);
        }
      }
    // [slot][codec], the figures of this layer.
    std::array<std::vector<double>, 3> figure;
    for (auto& f : figure) f.assign(codecs.size(), 0.0);
    const std::vector<double> kld = pass.klds(measured_runs);
    for (size_t i = 0; i < measured.size(); ++i) figure[measured[i].first][measured[i].second] = kld[i];
    if (!anchor.empty()) {
      // The anchor's KL divergence per unit of local error, for keys and for values, scales every codec's local
      // error; centered keys are keys.
      const std::vector<double> err = pass.local_errors(local_runs);
      const size_t a = static_cast<size_t>(std::find(codecs.begin(), codecs.end(), anchor) - codecs.begin());
      const auto role_of = [](Slot slot) { return slot == values ? values : plain_keys; };
      std::array<double, 2> anchor_err{};
      for (size_t i = 0; i < local.size(); ++i)
        if (local[i].second == a && local[i].first != centered_keys) anchor_err[local[i].first] = err[i];
      for (size_t i = 0; i < local.size(); ++i) {
        const auto [slot, c] = local[i];
        if (c == a && slot != centered_keys) continue;
        const Slot role = role_of(slot);
        figure[slot][c] = anchor_err[role] > 0 ? figure[role][a] * err[i] / anchor_err[role] : 0.0;
      }
    }
    s.kld[static_cast<size_t>(l)] = {figure[plain_keys], figure[values]};
    if (s.measured_centered()) {
      std::vector<double>& centered = s.centered_kld[static_cast<size_t>(l)];
      centered = figure[centered_keys];
      for (size_t c = 0; c < codecs.size(); ++c)
        if (!centering_applies(codecs[c])) centered[c] = std::numeric_limits<double>::quiet_NaN();
    }
    if (progress) progress(l + 1, n_layers);
  }
  return s;
}

}  // namespace kvq
