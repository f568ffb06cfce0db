// The CUDA API of a build without the backend: no devices, and every device request names the reason.
#include "cache/cuda_backend.hpp"
#include "cuda/device_plan.hpp"
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

namespace detail {

struct DeviceStore {};
struct DeviceLayer {};
void DeviceDeleter::operator()(DeviceStore* p) const noexcept { delete p; }
void DeviceDeleter::operator()(DeviceLayer* p) const noexcept { delete p; }

void Backend::open(KVCache&, int) { no_backend(); }
void Backend::moved(KVCache&) noexcept {}
void Backend::add_sequence(KVCache&, SeqId) { no_backend(); }
void Backend::append(KVCache&, SeqId, int, const float*, const float*, size_t) { no_backend(); }
void Backend::append_batch(KVCache&, const char*, std::span<const SeqId>, int, const float*, const float*,
                           std::span<const size_t>, void*) {
  no_backend();
}
LayerView Backend::view(const KVCache&, SeqId, int) { no_backend(); }
const uint8_t* Backend::pool(const KVCache&) { no_backend(); }
void Backend::add_memory(const KVCache&, CacheMemory&) { no_backend(); }
void Backend::trained(KVCache&, int) { no_backend(); }
void Backend::upload(KVCache&, const KVCache&) { no_backend(); }
void Backend::synchronize(const KVCache&) { no_backend(); }
KVCache::LayerState Backend::host_layer(const KVCache&, const KVCache::LayerState&) { no_backend(); }
void Backend::copy_to_host(const KVCache&, void*, const void*, size_t) { no_backend(); }

struct DevicePlan::Impl {};
DevicePlan::DevicePlan(const KVCache&, int, std::span<const SeqId>, int, const AttentionOptions&) { no_backend(); }
DevicePlan::DevicePlan(const KVCache&, int, int, int, const AttentionOptions&, size_t, const DecodeTables&) {
  no_backend();
}
DevicePlan::~DevicePlan() = default;
DevicePlan::DevicePlan(DevicePlan&&) noexcept = default;
DevicePlan& DevicePlan::operator=(DevicePlan&&) noexcept = default;
void DevicePlan::run(const float*, float*, size_t, void*) const { no_backend(); }
void DevicePlan::enqueue(const float*, float*, void*) const { no_backend(); }
int DevicePlan::splits() const { no_backend(); }
std::string DevicePlan::kernel(const KVCache&, int) { no_backend(); }
void synchronize(void*) { no_backend(); }

}  // namespace detail

struct DecodeStep::Impl {};
DecodeStep::DecodeStep(KVCache&, std::span<const SeqId>, std::span<const int>, int,
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

SeqId add_sequence_repeating(KVCache&, SeqId, size_t) { no_backend(); }
double median_ms(const std::function<void()>&, int, int) { no_backend(); }
double copy_bandwidth_gbps(size_t, int, int) { no_backend(); }

}  // namespace kvq::cuda
