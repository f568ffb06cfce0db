#include "kvq/detail/codec_allocation.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>

#include "kvq/error.hpp"

namespace kvq {

std::vector<size_t> choose_min_loss(const std::vector<std::vector<AllocationItem>>& groups, size_t budget) {
  size_t unit = 0, cheapest = 0, dearest = 0;
  for (const auto& g : groups) {
    KVQ_CHECK(!g.empty(), "a group without items to choose from");
    size_t lo = std::numeric_limits<size_t>::max(), hi = 0;
    for (const AllocationItem& item : g) {
      unit = std::gcd(unit, item.cost);
      lo = std::min(lo, item.cost);
      hi = std::max(hi, item.cost);
    }
    cheapest += lo;
    dearest += hi;
  }
  KVQ_CHECK(cheapest <= budget, "the budget (", budget, ") is below the cheapest choice (", cheapest, ")");
  if (groups.empty()) return {};
  unit = std::max<size_t>(unit, 1);
  // A budget above the dearest choice buys nothing more.
  const size_t states = std::min(budget, dearest) / unit + 1;
  KVQ_CHECK(states <= (size_t{1} << 26) / groups.size(), "the budget needs ", states, " states per group, too many");

  // best[c]: least loss of the groups so far at total cost exactly c units; choice[g][c]: item taken there.
  constexpr double none = std::numeric_limits<double>::infinity();
  std::vector<double> best(states, none), next(states);
  best[0] = 0;
  std::vector<std::vector<uint32_t>> choice(groups.size(), std::vector<uint32_t>(states, 0));
  for (size_t g = 0; g < groups.size(); ++g) {
    std::fill(next.begin(), next.end(), none);
    for (size_t c = 0; c < states; ++c) {
      if (best[c] == none) continue;
      for (size_t i = 0; i < groups[g].size(); ++i) {
        const size_t to = c + groups[g][i].cost / unit;
        if (to >= states) continue;
        const double loss = best[c] + groups[g][i].loss;
        if (loss < next[to]) next[to] = loss, choice[g][to] = static_cast<uint32_t>(i);
      }
    }
    best.swap(next);
  }
  size_t at = static_cast<size_t>(std::min_element(best.begin(), best.end()) - best.begin());
  std::vector<size_t> chosen(groups.size());
  for (size_t g = groups.size(); g-- > 0;) {
    chosen[g] = choice[g][at];
    at -= groups[g][chosen[g]].cost / unit;
  }
  return chosen;
}

}  // namespace kvq
