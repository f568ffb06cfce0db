#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "kvq/codec.hpp"
#include "kvq/detail/calibrate.hpp"
#include "kvq/detail/codec_allocation.hpp"
#include "kvq/error.hpp"

namespace kvq {

size_t key_offset_bytes_per_block(int head_dim, int block_tokens, int sequence_tokens) {
  KVQ_CHECK(head_dim > 0 && block_tokens > 0 && sequence_tokens > 0, "key offsets of head dimension ", head_dim,
            " over ", sequence_tokens, " tokens in blocks of ", block_tokens);
  const size_t spread = static_cast<size_t>(4) * static_cast<size_t>(head_dim) * static_cast<size_t>(block_tokens);
  return (spread + static_cast<size_t>(sequence_tokens) - 1) / static_cast<size_t>(sequence_tokens);
}

CodecChoice choose_layer_codecs(const LayerSensitivity& s, double budget_bits, int head_dim, int block_tokens,
                                int sequence_tokens) {
  KVQ_CHECK(std::isfinite(budget_bits) && budget_bits > 0, "bit budget ", budget_bits, " must be positive");
  KVQ_CHECK(sequence_tokens >= 0, "a budget over sequences of ", sequence_tokens, " tokens");
  const int n = sequence_tokens > 0 ? sequence_tokens : std::max(s.window, 1);  // what offsets and sinks spread over
  const size_t n_layers = s.kld.size();
  KVQ_CHECK(n_layers > 0, "no layers measured");
  KVQ_CHECK(!s.measured_centered() || s.centered_kld.size() == n_layers, "centered keys measured in ",
            s.centered_kld.size(), " of ", n_layers, " layers");
  KVQ_CHECK(s.states.empty() || (s.states.size() == n_layers && s.states.front().size() == s.codecs.size()),
            "trained states of ", s.states.size(), " layers for ", n_layers, " layers");
  // Every (layer, role) stores blocks of T x head_dim elements, so block bytes are the costs, and the budget is
  // B T head_dim / 8 bytes per (layer, role). Centered keys add their offsets' share of each block.
  std::array<std::vector<size_t>, 2> bytes;
  for (int role = 0; role < 2; ++role)
    for (const std::string& spec : s.codecs)
      bytes[role].push_back(
          make_codec(spec, {head_dim, block_tokens, 0, role == 0 ? Role::key : Role::value})->block_bytes());
  const size_t offset_bytes =
      s.measured_centered() ? key_offset_bytes_per_block(head_dim, block_tokens, n) : 0;
  // A key item: (codec, centered); a value item: its codec.
  struct KeyItem {
    size_t codec;
    bool centered;
  };
  std::vector<std::vector<KeyItem>> key_items(n_layers);
  std::vector<std::vector<AllocationItem>> groups;
  for (size_t l = 0; l < n_layers; ++l) {
    std::vector<AllocationItem> keys, values;
    for (size_t c = 0; c < s.codecs.size(); ++c) {
      keys.push_back({bytes[0][c], s.kld[l][0][c]});
      key_items[l].push_back({c, false});
      if (s.measured_centered() && !std::isnan(s.centered_kld[l][c])) {
        keys.push_back({bytes[0][c] + offset_bytes, s.centered_kld[l][c]});
        key_items[l].push_back({c, true});
      }
      values.push_back({bytes[1][c], s.kld[l][1][c]});
    }
    groups.push_back(keys);
    groups.push_back(values);
  }
  const double elements = static_cast<double>(block_tokens) * head_dim;
  // Sinks first: of a window's tokens, the min(S, window) sinks cost 16 bits each, the blocks get the rest.
  const double sink_share = s.sink_tokens > 0 ? static_cast<double>(std::min(s.sink_tokens, n)) / n : 0;
  KVQ_CHECK(budget_bits > 16 * sink_share && sink_share < 1, "a budget of ", budget_bits, " bits per element is "
            "spent on ", s.sink_tokens, " f16 sink tokens in sequences of ", n, " tokens (", 16 * sink_share,
            " bits)");
  const double block_bits = (budget_bits - 16 * sink_share) / (1 - sink_share);
  const double budget_bytes = std::floor(block_bits * elements / 8 * static_cast<double>(groups.size()) + 1e-6);
  size_t cheapest = 0;
  for (const auto& g : groups) {
    size_t lo = g.front().cost;
    for (const AllocationItem& item : g) lo = std::min(lo, item.cost);
    cheapest += lo;
  }
  const double cheapest_bits = sink_bits(
      8.0 * static_cast<double>(cheapest) / (elements * static_cast<double>(groups.size())), s.sink_tokens,
      n);
  KVQ_CHECK(budget_bytes >= static_cast<double>(cheapest), "a budget of ", budget_bits,
            " bits per element is below the cheapest choice of these codecs (", cheapest_bits, " bits)");
  const std::vector<size_t> chosen = choose_min_loss(groups, static_cast<size_t>(std::min(budget_bytes, 1e15)));

  CodecChoice choice;
  size_t total = 0;
  for (size_t l = 0; l < n_layers; ++l) {
    const AllocationItem& k = groups[2 * l][chosen[2 * l]];
    const AllocationItem& v = groups[2 * l + 1][chosen[2 * l + 1]];
    const KeyItem key = key_items[l][chosen[2 * l]];
    const size_t value = chosen[2 * l + 1];
    LayerCodecs& c = choice.layers.emplace_back(LayerCodecs{s.codecs[key.codec], s.codecs[value], key.centered});
    if (!s.states.empty()) {  // the states the chosen figures were measured with
      c.key_state = key.centered ? s.states[l][key.codec].centered_key : s.states[l][key.codec].key;
      c.value_state = s.states[l][value].value;
    }
    choice.predicted_kld += k.loss + v.loss;
    total += k.cost + v.cost;
  }
  const double block_bits_chosen = 8.0 * static_cast<double>(total) / (elements * static_cast<double>(groups.size()));
  choice.bits_per_element = sink_bits(block_bits_chosen, s.sink_tokens, n);
  return choice;
}

}  // namespace kvq
