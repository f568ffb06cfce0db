// The CUDA API of a build without the backend: no devices, and every device request names the reason.
#include "kvq/cuda.hpp"
#include "kvq/detail/cuda_bench_support.hpp"
#include "kvq/error.hpp"

namespace kvq::cuda {

bool built() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "kvq was built without the CUDA backend (KVQ_CUDA=OFF or no nvcc)"; }
std::string device_name(int) { throw Error("no CUDA device: " + unavailable_reason()); }

namespace {
[[noreturn]] void no_backend() { throw Error("no CUDA device: " + unavailable_reason()); }
}  // namespace

DeviceFloats::DeviceFloats(size_t, int) { no_backend(); }
DeviceFloats::~DeviceFloats() = default;
DeviceFloats::DeviceFloats(DeviceFloats&&) noexcept = default;
DeviceFloats& DeviceFloats::operator=(DeviceFloats&&) noexcept = default;
void DeviceFloats::upload(std::span<const float>) { no_backend(); }
std::vector<float> DeviceFloats::download() const { no_backend(); }
void DeviceFloats::fill(float) { no_backend(); }

struct DeviceKVCache::Impl {};
DeviceKVCache::DeviceKVCache(const CacheConfig&, int) { no_backend(); }
DeviceKVCache::DeviceKVCache(const KVCache&, size_t, int) { no_backend(); }
DeviceKVCache::~DeviceKVCache() = default;
DeviceKVCache::DeviceKVCache(DeviceKVCache&&) noexcept = default;
DeviceKVCache& DeviceKVCache::operator=(DeviceKVCache&&) noexcept = default;
const CacheConfig& DeviceKVCache::config() const { no_backend(); }
int DeviceKVCache::device() const { no_backend(); }
const Codec& DeviceKVCache::key_codec(int) const { no_backend(); }
const Codec& DeviceKVCache::value_codec(int) const { no_backend(); }
SeqId DeviceKVCache::add_sequence() { no_backend(); }
void DeviceKVCache::remove_sequence(SeqId) { no_backend(); }
bool DeviceKVCache::has_sequence(SeqId) const { no_backend(); }
std::vector<SeqId> DeviceKVCache::sequences() const { no_backend(); }
size_t DeviceKVCache::length(SeqId, int) const { no_backend(); }
void DeviceKVCache::append(SeqId, int, const float*, const float*, size_t) { no_backend(); }
void DeviceKVCache::append_device(SeqId, int, const float*, const float*, size_t, void*) { no_backend(); }
void DeviceKVCache::append_device_batch(std::span<const SeqId>, int, const float*, const float*,
                                        std::span<const size_t>, void*) {
  no_backend();
}
KVCache DeviceKVCache::to_host(size_t) const { no_backend(); }
size_t DeviceKVCache::page_bytes() const { no_backend(); }
size_t DeviceKVCache::key_block_offset(int) const { no_backend(); }
size_t DeviceKVCache::value_block_offset(int) const { no_backend(); }
size_t DeviceKVCache::residual_slots() const { no_backend(); }
size_t DeviceKVCache::free_pages() const { no_backend(); }
size_t DeviceKVCache::capacity_pages() const { no_backend(); }
const uint8_t* DeviceKVCache::device_pool() const { no_backend(); }
DeviceLayerView DeviceKVCache::view(SeqId, int) const { no_backend(); }

std::string decode_kernel(const DeviceKVCache&, int) { no_backend(); }

struct DecodePlan::Impl {};
DecodePlan::DecodePlan(const DeviceKVCache&, int, std::span<const SeqId>, int, const AttentionOptions&) {
  no_backend();
}
DecodePlan::~DecodePlan() = default;
DecodePlan::DecodePlan(DecodePlan&&) noexcept = default;
DecodePlan& DecodePlan::operator=(DecodePlan&&) noexcept = default;
void DecodePlan::run(const float*, float*, void*) const { no_backend(); }
int DecodePlan::splits() const { no_backend(); }

struct DecodeStep::Impl {};
DecodeStep::DecodeStep(DeviceKVCache&, std::span<const SeqId>, std::span<const int>, int,
                       std::span<const AttentionOptions>, size_t) {
  no_backend();
}
DecodeStep::~DecodeStep() = default;
DecodeStep::DecodeStep(DecodeStep&&) noexcept = default;
DecodeStep& DecodeStep::operator=(DecodeStep&&) noexcept = default;
void DecodeStep::prepare(void*) { no_backend(); }
void DecodeStep::run(int, const float*, const float*, const float*, float*, void*) { no_backend(); }
void DecodeStep::check(void*) { no_backend(); }
size_t DecodeStep::steps() const { no_backend(); }

void decode_attention(const DeviceKVCache&, int, std::span<const SeqId>, const float*, float*, int,
                      const AttentionOptions&, void*) {
  no_backend();
}
SeqId add_sequence_repeating(DeviceKVCache&, SeqId, size_t) { no_backend(); }
double median_ms(const std::function<void()>&, int, int) { no_backend(); }
double copy_bandwidth_gbps(size_t, int, int) { no_backend(); }

}  // namespace kvq::cuda
