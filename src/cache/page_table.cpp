#include "kvq/detail/page_table.hpp"

#include <algorithm>

namespace kvq::detail {

namespace {
size_t aligned(size_t n) { return (n + PageLayout::kAlign - 1) / PageLayout::kAlign * PageLayout::kAlign; }
}  // namespace

PageLayout::PageLayout(size_t key_block_bytes, size_t value_block_bytes, int heads)
    : key_stride(aligned(key_block_bytes)), value_stride(aligned(value_block_bytes)), n_kv_heads(heads) {
  page_bytes = static_cast<size_t>(n_kv_heads) * (key_stride + value_stride);
}

void FreePages::take(size_t n, std::vector<PageId>& into) {
  KVQ_CHECK(n <= size(), "KV cache: ", n, " pages asked for, ", size(), " free");
  const size_t from_given = std::min(n, given_back_.size()), fresh = fresh_ + (n - from_given);
  // Room for every page ever handed out to come back: removing a sequence then never allocates.
  if (given_back_.capacity() < fresh) given_back_.reserve(std::max(fresh, 2 * given_back_.capacity()));
  for (size_t j = 0; j < n; ++j) into.push_back(next(j));
  given_back_.resize(given_back_.size() - from_given);
  fresh_ = fresh;
}

}  // namespace kvq::detail
