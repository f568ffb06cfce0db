#include <cmath>

#include "kvq/codec.hpp"
#include "kvq/detail/calibrate.hpp"
#include "kvq/detail/codec_allocation.hpp"
#include "kvq/error.hpp"

namespace kvq {

CodecChoice choose_layer_codecs(const LayerSensitivity& s, double budget_bits, int head_dim, int block_tokens) {
  KVQ_CHECK(std::isfinite(budget_bits) && budget_bits > 0, "bit budget ", budget_bits, " must be positive");
  const size_t n_layers = s.kld.size();
  KVQ_CHECK(n_layers > 0, "no layers measured");
  // Every (layer, role) stores blocks of T x head_dim elements, so block bytes are the costs, and the budget is
  // B T head_dim / 8 bytes per (layer, role).
  std::array<std::vector<size_t>, 2> bytes;
  for (int role = 0; role < 2; ++role)
    for (const std::string& spec : s.codecs)
      bytes[role].push_back(
          make_codec(spec, {head_dim, block_tokens, 0, role == 0 ? Role::key : Role::value})->block_bytes());
  std::vector<std::vector<AllocationItem>> groups;
  for (size_t l = 0; l < n_layers; ++l)
    for (int role = 0; role < 2; ++role) {
      std::vector<AllocationItem> items;
      for (size_t c = 0; c < s.codecs.size(); ++c) items.push_back({bytes[role][c], s.kld[l][role][c]});
      groups.push_back(items);
    }
  const double elements = static_cast<double>(block_tokens) * head_dim;
  const double budget_bytes = std::floor(budget_bits * elements / 8 * static_cast<double>(groups.size()) + 1e-6);
  size_t cheapest = 0;
  for (const auto& g : groups) {
    size_t lo = g.front().cost;
    for (const AllocationItem& item : g) lo = std::min(lo, item.cost);
    cheapest += lo;
  }
  const double cheapest_bits = 8.0 * static_cast<double>(cheapest) / (elements * static_cast<double>(groups.size()));
  KVQ_CHECK(budget_bytes >= static_cast<double>(cheapest), "a budget of ", budget_bits,
            " bits per element is below the cheapest choice of these codecs (", cheapest_bits, " bits)");
  const std::vector<size_t> chosen = choose_min_loss(groups, static_cast<size_t>(std::min(budget_bytes, 1e15)));

  CodecChoice choice;
  size_t total = 0;
  for (size_t l = 0; l < n_layers; ++l) {
    const size_t k = chosen[2 * l], v = chosen[2 * l + 1];
    choice.layers.push_back({s.codecs[k], s.codecs[v]});
    choice.predicted_kld += s.kld[l][0][k] + s.kld[l][1][v];
    total += bytes[0][k] + bytes[1][v];
  }
  choice.bits_per_element = 8.0 * static_cast<double>(total) / (elements * static_cast<double>(groups.size()));
  return choice;
}

}  // namespace kvq
