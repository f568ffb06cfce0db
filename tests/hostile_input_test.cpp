// What a hostile user found (crafted files, extreme values): each test is named after the hole it keeps closed.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/crc32c.hpp"
#include "expect_error.hpp"
#include "gguf_writer.hpp"
#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/detail/gguf.hpp"
#include "kvq/detail/mapped_file.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"
#include "kvq/model.hpp"
#include "synthetic_llama.hpp"
#include "temp_file.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::expect_error;

std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// --- files that are not regular files ----------------------------------------------------------------------

TEST(HostileFiles, AFifoIsRefusedWithoutBlocking) {
  const std::filesystem::path fifo =
      std::filesystem::temp_directory_path() / ("kvq_" + std::to_string(::getpid()) + "_model.fifo");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { MappedFile file(fifo); }, "not a regular file");
  expect_error([&] { MappedFile file(fifo, FileResidency::copied); }, "not a regular file");
  expect_error([&] { LlamaModel::load(fifo); }, "not a regular file");
  expect_error([&] { KVCache::load(fifo.string()); }, "not a regular file");
  expect_error([&] { MappedFile file(fifo.parent_path()); }, "not a regular file");  // a directory
  std::filesystem::remove(fifo);
}

// --- crafted cache files -------------------------------------------------------------------------------------

// A saved cache as bytes, with the offsets of its payload fields (format: src/cache/cache_file.cpp).
struct SavedCache {
  static constexpr size_t kHeader = 24, kCapacity = kHeader + 20, kLayers = kHeader;
  std::vector<uint8_t> bytes;

  explicit SavedCache(const KVCache& cache) {
    test::TempFile file("hostile_saved.kvq");
    cache.save(file.path().string());
    bytes = read_bytes(file.path());
  }
  template <class T>
  void put(size_t at, T v) {
    std::memcpy(bytes.data() + at, &v, sizeof v);
  }
  /// Writes the file with the header's size and CRC made valid again: only the payload's meaning is hostile.
  void load(const test::TempFile& file) {
    const uint64_t payload = bytes.size() - kHeader;
    put<uint64_t>(16, payload);
    put<uint32_t>(12, crc32c(bytes.data() + kHeader, payload));
    KVCache::load(file.write(bytes).string());
  }
  /// Offset of the first occurrence of `what` in the file.
  size_t find(const void* what, size_t n) const {
    const auto* p = static_cast<const uint8_t*>(what);
    for (size_t i = kHeader; i + n <= bytes.size(); ++i)
      if (std::memcmp(bytes.data() + i, p, n) == 0) return i;
    ADD_FAILURE() << "pattern not in the file";
    return 0;
  }
};

CacheConfig wide_window_config() {
  CacheConfig c;
  c.n_kv_heads = 16;
  c.head_dim = 128;
  c.residual_tokens = 65536;
  c.capacity_pages = 0;
  return c;
}

std::vector<float> random_tokens(Rng& rng, const CacheConfig& c, size_t n, float scale = 1.0f) {
  std::vector<float> x(n * static_cast<size_t>(c.n_kv_heads * c.head_dim));
  for (float& v : x) v = scale * static_cast<float>(rng.normal());
  return x;
}

TEST(HostileCacheFile, LoadAllocatesWhatTheFileHoldsNotWhatItsWindowCouldHold) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  const CacheConfig c = wide_window_config();  // a window of up to 65599 tokens x 16 heads: 1 GiB when full
  KVCache cache(c);
  const SeqId s = cache.add_sequence();
  const std::vector<float> k = random_tokens(rng, c, 3), v = random_tokens(rng, c, 3);
  cache.append(s, 0, k.data(), v.data(), 3);
  SavedCache saved(cache);
  test::TempFile file("hostile_window.kvq");
  const KVCache loaded = KVCache::load(file.write(saved.bytes).string());
  EXPECT_LE(loaded.memory().used_bytes, 4 * saved.bytes.size());
  EXPECT_LE(cache.memory().used_bytes, 4 * saved.bytes.size());
  ASSERT_EQ(loaded.length(s), 3u);
  EXPECT_EQ(std::memcmp(loaded.view(s, 0).residual_key(15), cache.view(s, 0).residual_key(15), 3 * 128 * 4), 0);
}

TEST(HostileCacheFile, AWindowLongerThanTheFileIsRefusedBeforeItIsAllocated) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  const CacheConfig c = wide_window_config();
  KVCache cache(c);
  const SeqId s = cache.add_sequence();
  const std::vector<float> k = random_tokens(rng, c, 1), v = random_tokens(rng, c, 1);
  cache.append(s, 0, k.data(), v.data(), 1);
  SavedCache saved(cache);
  // The window's count sits just before its keys: claim 65536 tokens and end the file there.
  const size_t keys = saved.find(k.data(), 128 * 4);
  saved.put<uint32_t>(keys - 4, 65536);
  saved.bytes.resize(keys + 1);  // the sequence's fields are all there, its window's tokens are not
  test::TempFile file("hostile_short.kvq");
  expect_error([&] { saved.load(file); }, "residual tokens");
}

TEST(HostileCacheFile, AnImpossibleCapacityIsAnErrorNotBadAlloc) {
  KVCache cache(wide_window_config());
  cache.add_sequence();
  SavedCache saved(cache);
  saved.put<uint64_t>(SavedCache::kCapacity, 0xFFFFFFFFull);
  test::TempFile file("hostile_capacity.kvq");
  expect_error([&] { saved.load(file); }, "pages");
}

TEST(HostileCacheFile, MoreLayersThanTheFileDescribesAreRefusedBeforeTheirCodecsAreBuilt) {
  KVCache cache(wide_window_config());
  SavedCache saved(cache);
  saved.put<uint32_t>(SavedCache::kLayers, 4096);
  test::TempFile file("hostile_layers.kvq");
  expect_error([&] { saved.load(file); }, "codec states");
}

TEST(HostileCacheFile, NonFiniteWindowsOffsetsAndPagesAreRefusedAtLoad) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  CacheConfig c;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.key_codec = "int4";
  c.value_codec = "f16";
  c.capacity_pages = 4;
  KVCache cache(c);
  const SeqId s = cache.add_sequence();
  const std::vector<float> k = random_tokens(rng, c, 70), v = random_tokens(rng, c, 70);
  cache.append(s, 0, k.data(), v.data(), 70);  // one page, 6 tokens in the window
  test::TempFile file("hostile_nan.kvq");
  for (const float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    SavedCache saved(cache);
    saved.put<float>(saved.find(k.data() + 64 * c.n_kv_heads * 64, 64 * 4) + 8, poison);  // token 64, head 0
    expect_error([&] { saved.load(file); }, "residual keys");
  }
  SavedCache saved(cache);
  const LayerView view = cache.view(s, 0);
  const size_t page = saved.find(cache.page(view.pages[0]), cache.page_bytes());
  std::memset(saved.bytes.data() + page, 0xFF, cache.page_bytes());  // fp16 0xFFFF: NaN scales and values
  expect_error([&] { saved.load(file); }, "block that decodes to");
}

// --- attention that would overflow ----------------------------------------------------------------------------

TEST(HostileAttention, AnOverflowingScoreIsAnErrorNotNaN) {
  CacheConfig c;
  c.head_dim = 64;
  c.key_codec = c.value_codec = "f32";
  KVCache cache(c);
  const SeqId s = cache.add_sequence();
  std::vector<float> k(64, 1e20f), v(64, 1.0f), q(64, 1e20f), out(64);
  cache.append(s, 0, k.data(), v.data(), 1);
  expect_error([&] { decode_attention(cache, 0, std::vector<SeqId>{s}, q, out); }, "not finite");
}

TEST(HostileAttention, OptionsAreCheckedOnceForBothBackEnds) {
  AttentionOptions o;
  EXPECT_FLOAT_EQ(o.resolved_scale(64), 0.125f);
  o.scale = 0.5f;
  EXPECT_FLOAT_EQ(o.resolved_scale(64), 0.5f);
  for (const float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    o.scale = bad;
    expect_error([&] { o.resolved_scale(64); }, "scale");
  }
  o.scale = 0;
  o.splits = -1;
  expect_error([&] { o.resolved_scale(64); }, "splits");
}

// --- crafted checkpoints ----------------------------------------------------------------------------------------

TEST(HostileGguf, TensorsSharingBytesAreRefused) {
  test::GgufWriter w;
  w.tensor("a.weight", {8}, GgmlType::F32, std::vector<uint8_t>(32, 0));
  w.tensor("b.weight", {8}, GgmlType::F32, std::vector<uint8_t>(32, 0));
  std::vector<uint8_t> bytes = w.bytes();
  // b's offset (32) is the last field of its entry, just before the data's alignment padding: point it at a.
  const std::string name = "b.weight";
  const auto at = std::search(bytes.begin(), bytes.end(), name.begin(), name.end()) - bytes.begin();
  const size_t offset_field = static_cast<size_t>(at) + name.size() + 4 + 8 + 4;
  uint64_t offset = 0;
  std::memcpy(&offset, bytes.data() + offset_field, 8);
  ASSERT_EQ(offset, 32u);
  std::memset(bytes.data() + offset_field, 0, 8);
  test::TempFile file("hostile_overlap.gguf");
  expect_error([&] { GgufFile g(file.write(bytes)); }, "overlaps");
}

TEST(HostileGguf, AHugeBlockCountIsRefusedBeforeTheLayersAreAllocated) {
  test::GgufWriter w;
  w.kv_string("general.architecture", "llama");
  for (const char* key : {"llama.embedding_length", "llama.feed_forward_length", "llama.context_length"})
    w.kv<uint32_t>(key, GgufType::u32, 64);
  w.kv<uint32_t>("llama.attention.head_count", GgufType::u32, 4);
  w.kv<uint32_t>("llama.block_count", GgufType::u32, 1000000);
  w.tensor("token_embd.weight", {64, 4}, GgmlType::F32, std::vector<uint8_t>(64 * 4 * 4, 0));
  test::TempFile file("hostile_blocks.gguf");
  expect_error([&] { LlamaModel::load(file.write(w.bytes())); }, "block_count = 1000000");
}

// A forward pass over weights that hold NaN stops at the stage that produced it, named.
void expect_forward_error(const LlamaModel& model, const std::string& stage) {
  LlamaRunner runner(model, 16, 1, KVCacheSpec{"int4", "int4"});
  expect_error([&] { runner.forward(3, 0); }, stage);
}

TEST(HostileGguf, NaNWeightsStopTheForwardPassNamingTheStage) {
  KVQ_FRESH_SEED();
  expect_forward_error(test::SyntheticLlama(seed, 512, "token_embd.weight").model(), "the token embedding of token 3");
  expect_forward_error(test::SyntheticLlama(seed, 512, "blk.1.attn_k.weight").model(), "layer 1's key projection");
  expect_forward_error(test::SyntheticLlama(seed, 512, "blk.0.ffn_down.weight").model(),
                       "layer 0's feed-forward network");
  expect_forward_error(test::SyntheticLlama(seed, 512, "output.weight").model(), "the classifier");
}

// A llama2.c checkpoint: the 7-int header, then every weight as fp32.
std::vector<uint8_t> llama2c_file(const int32_t (&header)[7], size_t floats, float value) {
  std::vector<uint8_t> bytes(sizeof header + floats * 4);
  std::memcpy(bytes.data(), header, sizeof header);
  for (size_t i = 0; i < floats; ++i) std::memcpy(bytes.data() + sizeof header + 4 * i, &value, 4);
  return bytes;
}

TEST(HostileLlama2c, NaNWeightsStopTheForwardPass) {
  const int32_t header[7] = {32, 64, 1, 2, 2, 16, 8};  // dim, hidden, layers, heads, kv heads, vocab, seq
  const size_t floats = 16 * 32 + 32 + 3 * 32 * 32 + 32 * 32 + 32 + 3 * 32 * 64 + 32 + 8 * 16;
  test::TempFile file("hostile_nan.bin");
  const LlamaModel model = LlamaModel::load(file.write(llama2c_file(header, floats, NAN)));
  LlamaRunner runner(model, 8, 1, KVCacheSpec{});
  expect_error([&] { runner.forward(1, 0); }, "the token embedding of token 1");
}

TEST(HostileLlama2c, AVocabSizeOfIntMinIsRefusedWithoutOverflow) {
  const int32_t header[7] = {32, 64, 1, 2, 2, std::numeric_limits<int32_t>::min(), 8};
  test::TempFile file("hostile_vocab.bin");
  expect_error([&] { LlamaModel::load(file.write(llama2c_file(header, 64, 0.0f))); }, "implausible llama2.c header");
}

TEST(HostileRunner, NegativeThreadsAreAnError) {
  const int32_t header[7] = {32, 64, 1, 2, 2, 16, 8};
  const size_t floats = 16 * 32 + 32 + 3 * 32 * 32 + 32 * 32 + 32 + 3 * 32 * 64 + 32 + 8 * 16;
  test::TempFile file("hostile_threads.bin");
  const LlamaModel model = LlamaModel::load(file.write(llama2c_file(header, floats, 0.01f)));
  expect_error([&] { LlamaRunner runner(model, 8, -1, KVCacheSpec{}); }, "threads = -1");
}

}  // namespace
}  // namespace kvq
