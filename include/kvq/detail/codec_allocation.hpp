// Choosing one codec per (layer, role) under a storage budget: a multiple-choice knapsack over measured losses.
#pragma once

#include <cstddef>
#include <vector>

namespace kvq {

/// One choice of a group: what it stores (an integer, e.g. block bytes) and what it is measured to cost.
struct AllocationItem {
  size_t cost = 0;
  double loss = 0;
};

/// One item from each group, total cost <= budget, least total loss (losses add up: the model `kvq calibrate`
/// states). Exact: dynamic programming over the total cost in units of the costs' greatest common divisor.
/// Returns the chosen item's index per group; kvq::Error for an empty group, or when the cheapest items together
/// exceed the budget.
std::vector<size_t> choose_min_loss(const std::vector<std::vector<AllocationItem>>& groups, size_t budget);

}  // namespace kvq
