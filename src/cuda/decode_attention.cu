// Decode attention on the device: the plan (kernel choice, split-K, the codecs' maps uploaded once), the query
// map to the key codec's space, the split kernel of the codec pair (decode_kernel.cuh) and the merge kernel that
// folds the splits, maps the output back from the value codec's space, adds the fp32 window and normalizes.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>

#include "codec/int_group.hpp"
#include "cuda/cuda_check.cuh"
#include "cuda/decode_kernel.cuh"
#include "cuda/decode_pairs.hpp"
#include "cuda/device_memory.hpp"
#include "kvq/block_layout.hpp"
#include "kvq/cuda_cache.hpp"

namespace kvq::cuda {
namespace detail {
namespace {

struct WindowDesc {
  const float* window;  // keys [H][slots][D], then values [H][slots][D]
  int count;
};

struct MergeArgs {
  const float* partial_o;
  const float* partial_ml;
  int n_splits, n_q_heads, group, n_kv_heads, slots;
  const float* value_map;  // Bt[j][c] (D x D) or null for the identity
  const WindowDesc* windows;
  const float* q;  // original space
  float scale_log2;
  float* out;
};

// y = Mt^T x for one (sequence, query head): Mt[j][c], D x D, blockDim = D.
__global__ void map_queries_kernel(const float* q, const float* map_t, int n_q_heads, float* q_space) {
  extern __shared__ float row[];
  const int D = blockDim.x, c = threadIdx.x;
  const size_t base = (static_cast<size_t>(blockIdx.y) * n_q_heads + blockIdx.x) * D;
  row[c] = q[base + c];
  __syncthreads();
  float y = 0;
  for (int j = 0; j < D; ++j) y = fmaf(map_t[static_cast<size_t>(j) * D + c], row[j], y);
  q_space[base + c] = y;
}

constexpr int kWindowChunk = 64;

// One (sequence, query head) per block, blockDim = D: merge the splits, map back, fold in the window, normalize.
__global__ void merge_kernel(const MergeArgs a) {
  extern __shared__ float sh[];
  const int D = blockDim.x, c = threadIdx.x, lane = c & 31, warp = c >> 5, n_warps = D / 32;
  float* o_space = sh;          // [D]
  float* qv = sh + D;           // [D]
  float* sc = qv + D;           // [kWindowChunk]
  const int qh = blockIdx.x, s = blockIdx.y;
  const size_t row0 = (static_cast<size_t>(s) * a.n_q_heads + qh) * a.n_splits;

  float m = -INFINITY;
  for (int i = 0; i < a.n_splits; ++i) m = fmaxf(m, a.partial_ml[2 * (row0 + i)]);
  float l = 0, o = 0;
  if (m != -INFINITY)
    for (int i = 0; i < a.n_splits; ++i) {
      const float mi = a.partial_ml[2 * (row0 + i)];
      if (mi == -INFINITY) continue;
      const float w = exp2f(mi - m);
      l = fmaf(w, a.partial_ml[2 * (row0 + i) + 1], l);
      o = fmaf(w, a.partial_o[(row0 + i) * D + c], o);
    }
  if (a.value_map != nullptr) {
    o_space[c] = o;
    __syncthreads();
    o = 0;
    for (int j = 0; j < D; ++j) o = fmaf(a.value_map[static_cast<size_t>(j) * D + c], o_space[j], o);
  }

  const WindowDesc win = a.windows[s];
  const int kvh = qh / a.group;
  const float* keys = win.window + static_cast<size_t>(kvh) * a.slots * D;
  const float* values = win.window + static_cast<size_t>(a.n_kv_heads + kvh) * a.slots * D;
  qv[c] = a.q[(static_cast<size_t>(s) * a.n_q_heads + qh) * D + c] * a.scale_log2;
  __syncthreads();
  for (int t0 = 0; t0 < win.count; t0 += kWindowChunk) {
    const int n = min(kWindowChunk, win.count - t0);
    for (int t = warp; t < n; t += n_warps) {
      float part = 0;
      for (int j = lane; j < D; j += 32) part = fmaf(qv[j], keys[static_cast<size_t>(t0 + t) * D + j], part);
      for (int off = 16; off > 0; off /= 2) part += __shfl_xor_sync(0xffffffffu, part, off);
      if (lane == 0) sc[t] = part;
    }
    __syncthreads();
    float mx = m;
    for (int t = 0; t < n; ++t) mx = fmaxf(mx, sc[t]);
    const float r = exp2f(m - mx);  // 0 while nothing was seen (m = -inf)
    l *= r;
    o *= r;
    for (int t = 0; t < n; ++t) {
      const float p = exp2f(sc[t] - mx);
      l += p;
      o = fmaf(p, values[static_cast<size_t>(t0 + t) * D + c], o);
    }
    m = mx;
    __syncthreads();
  }
  a.out[(static_cast<size_t>(s) * a.n_q_heads + qh) * D + c] = l > 0 ? o / l : 0.0f;
}

// The kernels' codec identities: what the traits of codec_traits.cuh decode.
std::string codec_id(const Codec& c) {
  const std::string& name = c.spec().name;
  if (name == "kivi" || name == "turbo_mse") return name + ":" + std::to_string(c.spec().arg(0, 0));
  return name;
}

std::optional<Launch> find_launch(const Codec& k, const Codec& v) {
  for (const PairKernel& p : pair_kernels())
    if (p.key == codec_id(k) && p.value == codec_id(v)) return p.launch;
  return std::nullopt;
}

std::string pair_list() {
  std::string list;
  for (const PairKernel& p : pair_kernels()) list += (list.empty() ? "" : ", ") + p.key + "/" + p.value;
  return list;
}

// Per-channel factor folded out of the kernels' decode (codec_traits.cuh): int8/int4's lambda, else 1.
std::vector<float> sigma(const Codec& c) {
  const auto ip = int_group_params(c);
  if (!ip) return std::vector<float>(static_cast<size_t>(c.dim()), 1.0f);
  return {ip->lambda, ip->lambda + c.dim()};
}

CodecArgs host_codec_args(const Codec& c) {
  CodecArgs a;
  a.T = c.block_tokens();
  if (const auto ip = int_group_params(c)) a.group = ip->group;
  return a;
}

std::vector<float> identity(int d) {
  std::vector<float> eye(static_cast<size_t>(d) * d, 0.0f);
  for (int i = 0; i < d; ++i) eye[static_cast<size_t>(i) * d + i] = 1.0f;
  return eye;
}

bool is_identity(const std::vector<float>& m, int d) { return m == identity(d); }

template <class T>
DevicePtr<T> upload(const std::vector<T>& host, const std::string& what) {
  DevicePtr<T> dev = device_alloc<T>(host.size(), what);
  if (!host.empty())
    KVQ_CUDA_CHECK(cudaMemcpy(dev.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return dev;
}

}  // namespace
}  // namespace detail

using namespace detail;

std::string decode_kernel(const DeviceKVCache& cache, int layer) {
  const Codec& k = cache.key_codec(layer);
  const Codec& v = cache.value_codec(layer);
  const int d = cache.config().head_dim;
  KVQ_CHECK(d == 64 || d == 128 || d == 256, "CUDA decode attention: head dimension ", d,
            " has no kernel (64, 128 or 256)");
  KVQ_CHECK(find_launch(k, v).has_value(), "CUDA decode attention: no kernel for key codec '", k.spec().str(),
            "' with value codec '", v.spec().str(), "' (kernels: ", pair_list(), ")");
  return "cuda_" + k.spec().name + "_" + v.spec().name;
}

struct DecodePlan::Impl {
  int device = 0, n_seqs = 0, n_q_heads = 0, n_kv_heads = 0, d = 0, group = 0;
  Launch launch = nullptr;
  SplitArgs split{};
  MergeArgs merge{};
  size_t smem = 0;
  DevicePtr<SeqPages> seqs;
  DevicePtr<WindowDesc> windows;
  DevicePtr<float> key_map, value_map, q_space, partial_o, partial_ml;
};

DecodePlan::DecodePlan(const DeviceKVCache& cache, int layer, std::span<const SeqId> seqs, int n_q_heads,
                       const AttentionOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& p = *impl_;
  const std::string kernel = decode_kernel(cache, layer);
  const CacheConfig& cfg = cache.config();
  p.device = cache.device();
  use_device(p.device);
  p.n_seqs = static_cast<int>(seqs.size());
  p.n_q_heads = n_q_heads;
  p.n_kv_heads = cfg.n_kv_heads;
  p.d = cfg.head_dim;
  KVQ_CHECK(n_q_heads > 0 && n_q_heads % cfg.n_kv_heads == 0, "CUDA decode attention: ", n_q_heads,
            " query heads is not a multiple of the cache's ", cfg.n_kv_heads, " kv heads");
  p.group = n_q_heads / cfg.n_kv_heads;
  KVQ_CHECK(p.group == 1 || p.group == 2 || p.group == 4 || p.group == 8, "CUDA decode attention: GQA group of ",
            p.group, " query heads per kv head has no kernel (1, 2, 4 or 8)");
  const Codec& kc = cache.key_codec(layer);
  const Codec& vc = cache.value_codec(layer);
  p.launch = *find_launch(kc, vc);
  if (const auto ip = int_group_params(kc)) {
    const int lane_elements = kc.spec().name == "int4" ? 8 : 4;  // the key kernel reads one scale per 32-bit lane
    KVQ_CHECK(ip->group % lane_elements == 0, "CUDA decode attention: key codec '", kc.spec().str(),
              "' has groups of ", ip->group, " channels; the kernel needs a multiple of ", lane_elements);
  }
  const int d = p.d, T = cfg.block_tokens;

  // The codecs' maps, once: Kt[j][c] = sigma_k[c] (A_k e_j)[c] and Vt[j][c] = sigma_v[j] (A_v^T e_j)[c].
  std::vector<float> kt(static_cast<size_t>(d) * d), vt(static_cast<size_t>(d) * d);
  const std::vector<float> eye = identity(d), sk = sigma(kc), sv = sigma(vc);
  kc.to_space(eye.data(), d, kt.data());
  vc.from_space(eye.data(), d, vt.data());
  for (int j = 0; j < d; ++j)
    for (int c = 0; c < d; ++c) {
      kt[static_cast<size_t>(j) * d + c] *= sk[static_cast<size_t>(c)];
      vt[static_cast<size_t>(j) * d + c] *= sv[static_cast<size_t>(j)];
    }
  if (!is_identity(kt, d)) p.key_map = upload(kt, "the key codec's query map");
  if (!is_identity(vt, d)) p.value_map = upload(vt, "the value codec's output map");
  p.split.key = host_codec_args(kc);
  p.split.value = host_codec_args(vc);

  // Block tables and windows of the batch.
  std::vector<SeqPages> pages;
  std::vector<WindowDesc> windows;
  int max_pages = 0;
  for (SeqId id : seqs) {
    const DeviceLayerView v = cache.view(id, layer);
    pages.push_back({v.pages, static_cast<int>(v.n_pages)});
    windows.push_back({v.window, v.window_count});
    max_pages = std::max(max_pages, static_cast<int>(v.n_pages));
  }
  p.seqs = upload(pages, "the batch's block tables");
  p.windows = upload(windows, "the batch's windows");

  // Split-K: at least four blocks per multiprocessor over the whole batch, and splits of at most kMaxSplitPages
  // pages (blocks work through their pages in sequence: many short blocks fill the device evenly, a few long ones
  // leave a tail; measured on the H200, docs/perf/h200.md), unless the options say how many.
  constexpr int kMaxSplitPages = 32;
  int sms = 0;
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, p.device));
  const int units = std::max(1, p.n_seqs * p.n_kv_heads);
  const int wanted = std::max((4 * sms + units - 1) / units, (max_pages + kMaxSplitPages - 1) / kMaxSplitPages);
  int splits = options.splits > 0 ? options.splits : wanted;
  splits = std::clamp(splits, 1, std::max(1, max_pages));
  const int per_split = std::max(1, (max_pages + splits - 1) / splits);
  splits = std::max(1, (max_pages + per_split - 1) / per_split);

  SplitArgs& a = p.split;
  a.pool = cache.device_pool();
  a.page_bytes = cache.page_bytes();
  a.key_offset = cache.key_block_offset(0);
  a.key_stride = cache.key_block_offset(1 % cfg.n_kv_heads) - a.key_offset;
  a.value_offset = cache.value_block_offset(0);
  a.value_stride = cache.value_block_offset(1 % cfg.n_kv_heads) - a.value_offset;
  a.key_bytes = static_cast<int>(layout::align16(kc.block_bytes()));
  a.value_bytes = static_cast<int>(layout::align16(vc.block_bytes()));
  a.T = T;
  a.n_q_heads = n_q_heads;
  a.n_splits = splits;
  a.pages_per_split = per_split;
  a.seqs = p.seqs.get();
  const float scale = options.scale > 0 ? options.scale : 1.0f / std::sqrt(static_cast<float>(d));
  a.scale_log2 = scale * std::numbers::log2e_v<float>;

  int smem_limit = 0;
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, p.device));
  // The split kernel's dynamic shared memory (decode_kernel.cuh): page stages, scores [G][T] rounded up to 16
  // bytes, m, l, alpha [G], levels, and the final reduction [2 * kThreads / d][G][d].
  auto smem_for = [&](int stages) {
    return static_cast<size_t>(a.key_bytes + a.value_bytes) * stages +
           sizeof(float) * ((p.group * T + 3) / 4 * 4 + 3 * p.group + 2 * kMaxLevels) +
           sizeof(float) * (2 * kThreads / d) * p.group * d;
  };
  a.stages = smem_for(2) <= static_cast<size_t>(smem_limit) ? 2 : 1;
  p.smem = smem_for(a.stages);
  KVQ_CHECK(p.smem <= static_cast<size_t>(smem_limit), "CUDA decode attention: a page of ", kernel, " needs ",
            p.smem, " bytes of shared memory, the device offers ", smem_limit);

  const size_t rows = static_cast<size_t>(p.n_seqs) * n_q_heads;
  p.partial_o = device_alloc<float>(rows * splits * d, "split-K partial outputs");
  p.partial_ml = device_alloc<float>(rows * splits * 2, "split-K partial maxima and sums");
  if (p.key_map) p.q_space = device_alloc<float>(rows * d, "queries in the key codec's space");
  a.partial_o = p.partial_o.get();
  a.partial_ml = p.partial_ml.get();

  MergeArgs& m = p.merge;
  m.partial_o = a.partial_o;
  m.partial_ml = a.partial_ml;
  m.n_splits = splits;
  m.n_q_heads = n_q_heads;
  m.group = p.group;
  m.n_kv_heads = cfg.n_kv_heads;
  m.slots = static_cast<int>(cache.residual_slots());
  m.value_map = p.value_map.get();
  m.windows = p.windows.get();
  m.scale_log2 = a.scale_log2;
}

DecodePlan::~DecodePlan() = default;
DecodePlan::DecodePlan(DecodePlan&&) noexcept = default;
DecodePlan& DecodePlan::operator=(DecodePlan&&) noexcept = default;

int DecodePlan::splits() const { return impl_->split.n_splits; }

void DecodePlan::run(const float* q_dev, float* out_dev, void* stream_ptr) const {
  const Impl& p = *impl_;
  if (p.n_seqs == 0) return;
  KVQ_CHECK(q_dev != nullptr && out_dev != nullptr, "CUDA decode attention: null query or output");
  use_device(p.device);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const dim3 rows(static_cast<unsigned>(p.n_q_heads), static_cast<unsigned>(p.n_seqs));
  SplitArgs a = p.split;
  a.q_space = q_dev;
  if (p.key_map) {
    map_queries_kernel<<<rows, p.d, p.d * sizeof(float), stream>>>(q_dev, p.key_map.get(), p.n_q_heads,
                                                                    p.q_space.get());
    KVQ_CUDA_CHECK(cudaGetLastError());
    a.q_space = p.q_space.get();
  }
  const dim3 grid(static_cast<unsigned>(a.n_splits), static_cast<unsigned>(p.n_kv_heads),
                  static_cast<unsigned>(p.n_seqs));
  KVQ_CHECK(p.launch(a, p.d, p.group, grid, p.smem, stream), "CUDA decode attention: no instantiation for d = ",
            p.d, ", group ", p.group);
  MergeArgs m = p.merge;
  m.q = q_dev;
  m.out = out_dev;
  merge_kernel<<<rows, p.d, (2 * p.d + kWindowChunk) * sizeof(float), stream>>>(m);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void decode_attention(const DeviceKVCache& cache, int layer, std::span<const SeqId> seqs, const float* q_dev,
                      float* out_dev, int n_q_heads, const AttentionOptions& options, void* stream) {
  const DecodePlan plan(cache, layer, seqs, n_q_heads, options);
  plan.run(q_dev, out_dev, stream);
  KVQ_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

}  // namespace kvq::cuda
