// The bookkeeping every cache keeps about its pages, whatever memory they live in (a KVCache on the CPU or on a
// CUDA device): where a kv head's key and value blocks lie in a page, which pages of the pool are free, and which
// sequences exist with each layer's state. Not part of the API (cache.hpp's KVCache holds these as members).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "kvq/error.hpp"

namespace kvq {

using SeqId = uint64_t;
using PageId = uint32_t;

namespace detail {

/// Where blocks lie inside a page: every kv head's key block, then every head's value block, each at a 64-byte
/// aligned stride (vector loads of a block start aligned, on the CPU and on the GPU).
struct PageLayout {
  static constexpr size_t kAlign = 64;

  size_t key_stride = 0, value_stride = 0, page_bytes = 0;
  int n_kv_heads = 0;

  PageLayout() = default;
  PageLayout(size_t key_block_bytes, size_t value_block_bytes, int n_kv_heads);
  size_t key_offset(int head) const { return static_cast<size_t>(head) * key_stride; }
  size_t value_offset(int head) const {
    return static_cast<size_t>(n_kv_heads) * key_stride + static_cast<size_t>(head) * value_stride;
  }
};

/// The free pages of a pool: those given back (a stack: the last one given back is the next one out), then
/// [fresh, capacity), never handed out. Nothing here grows with the capacity: a pool is address space until used.
class FreePages {
 public:
  explicit FreePages(size_t capacity = 0) : capacity_(capacity) {}

  size_t size() const { return given_back_.size() + (capacity_ - fresh_); }
  size_t capacity() const { return capacity_; }
  /// The j-th page (from 0) that take() would hand out now; takes of n0, n1, ... pages in a row hand out
  /// next(0 .. n0), then next(n0 .. n0 + n1), ... (a batched device append numbers its pages so).
  PageId next(size_t j) const {
    return j < given_back_.size() ? given_back_[given_back_.size() - 1 - j]
                                  : static_cast<PageId>(fresh_ + (j - given_back_.size()));
  }
  /// Moves the next n free pages to the end of `into` (whose capacity the caller reserved); throws, if at all,
  /// before it changes anything.
  void take(size_t n, std::vector<PageId>& into);
  /// A removed sequence's pages of one layer: the layer's first page is the next one out.
  void give_back(std::span<const PageId> pages) { given_back_.insert(given_back_.end(), pages.rbegin(), pages.rend()); }

 private:
  std::vector<PageId> given_back_;
  size_t fresh_ = 0, capacity_ = 0;
};

/// The sequences of a cache, each with one Layer per model layer, and the id the next new one gets. `owner` names
/// the cache in errors.
template <class Layer>
class SequenceTable {
 public:
  struct Sequence {
    std::vector<Layer> layers;
  };

  explicit SequenceTable(const char* owner = "KVCache") : owner_(owner) {}

  /// A sequence under `id` with n_layers default layers (an id that exists is a corrupt input: refused).
  Sequence& insert(SeqId id, int n_layers) { return insert(id, std::vector<Layer>(static_cast<size_t>(n_layers))); }
  /// A sequence under `id` with layers made beforehand (the device cache's hold device memory: a failed
  /// allocation then leaves no sequence behind).
  Sequence& insert(SeqId id, std::vector<Layer> layers) {
    KVQ_CHECK(map_.count(id) == 0, owner_, ": sequence id ", id, " exists already");
    Sequence s;
    s.layers = std::move(layers);
    if (id >= next_id) next_id = id + 1;
    return map_.emplace(id, std::move(s)).first->second;
  }
  const Sequence& at(SeqId id) const {
    const auto it = map_.find(id);
    KVQ_CHECK(it != map_.end(), owner_, ": no sequence with id ", id);
    return it->second;
  }
  Sequence& at(SeqId id) { return const_cast<Sequence&>(static_cast<const SequenceTable&>(*this).at(id)); }
  bool contains(SeqId id) const { return map_.count(id) != 0; }
  /// Removes a sequence, its layers' pages given back to `free`.
  void erase(SeqId id, FreePages& free) {
    for (const Layer& l : at(id).layers) free.give_back(l.pages);
    map_.erase(id);
  }
  std::vector<SeqId> ids() const {
    std::vector<SeqId> out;
    for (const auto& entry : map_) out.push_back(entry.first);
    return out;
  }
  size_t size() const { return map_.size(); }
  auto begin() const { return map_.begin(); }
  auto end() const { return map_.end(); }
  auto begin() { return map_.begin(); }
  auto end() { return map_.end(); }

  SeqId next_id = 0;  // add_sequence's next id; a file or a copy may set it past the ids it holds

 private:
  const char* owner_;
  std::map<SeqId, Sequence> map_;
};

}  // namespace detail
}  // namespace kvq
