// Decode attention on the device: the plan (kernel choice, split-K, the codecs' maps uploaded once, where sliding
// windows start), the query map to the key codec's space, the split kernel of the codec pair (decode_kernel.cuh) over
// the pages a window sees whole, its window-start variant over the page a window starts inside, and the merge kernel
// that folds the splits, maps the output back from the value codec's space, adds the fp32 window (from where a
// window starts) and normalizes.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <numbers>
#include <mutex>
#include <optional>
#include <string_view>

#include "attention/precision.hpp"
#include "codec/block_layout.hpp"
#include "codec/int_group.hpp"
#include "codec/kivi.hpp"
#include "codec/signed_byte_levels.hpp"
#include "codec/turbo_mse.hpp"
#include "codec/vecinfer.hpp"
#include "core/half.hpp"
#include "cuda/cuda_check.cuh"
#include "cuda/decode_kernel.cuh"
#include "cuda/decode_pairs.hpp"
#include "cuda/dependent_launch.cuh"
#include "cuda/device_half.cuh"
#include "cuda/device_memory.hpp"
#include "cuda/window_start.hpp"
#include "cache/cuda_backend.hpp"
#include "cuda/device_plan.hpp"
#include "kvq/cuda.hpp"

namespace kvq::cuda {
namespace detail {
namespace {

struct MergeArgs {
  const float* partial_o;
  const float* partial_ml;
  int n_splits, n_q_heads, group, n_kv_heads, slots;
  int value_space;         // VD: the size of the value codec's space, a multiple of D
  const float* value_map;  // Bt[j][c] (VD x D) or null for the identity
  const WindowDesc* windows;
  const float* q;  // original space
  float scale_log2;
  float* out;
};

// Loads of a column of a map in flight per thread: a map comes from L2 or HBM, so a loop that used each load
// before issuing the next would wait out that latency once per row (about 10 us for d = 128 at batch 1); in
// batches of 64, d <= 128 waits once or twice.
constexpr int kMapLoads = 64;

/// sum_j m[j][c] x[j] over j < n (n a multiple of kMapLoads: d and the value spaces are multiples of 64), m row-major with `stride` columns, x in shared memory.
__device__ __forceinline__ float map_column(const float* m, int stride, int c, const float* x, int n) {
  float y[4] = {0, 0, 0, 0};
  for (int j = 0; j < n; j += kMapLoads) {
    float v[kMapLoads];
#pragma unroll
    for (int u = 0; u < kMapLoads; ++u) v[u] = m[static_cast<size_t>(j + u) * stride + c];
#pragma unroll
    for (int u = 0; u < kMapLoads; ++u) y[u % 4] = fmaf(v[u], x[j + u], y[u % 4]);
  }
  return (y[0] + y[1]) + (y[2] + y[3]);
}

// y = Mt^T x for one (sequence, query head): Mt[j][c], D x M (M the key space), blockDim = M.
__global__ void map_queries_kernel(const float* q, const float* map_t, int n_q_heads, int D, float* q_space) {
  extern __shared__ float row[];
  const int M = blockDim.x, c = threadIdx.x;
  const size_t head = static_cast<size_t>(blockIdx.y) * n_q_heads + blockIdx.x;
  wait_for_prior_kernel();
  for (int j = c; j < D; j += M) row[j] = q[head * D + j];
  __syncthreads();
  q_space[head * M + c] = map_column(map_t, M, c, row, D);
}

// KVQ_CUDA_DEPENDENT_LAUNCH=0 launches the kernels one after the other (to time what dependent launches save).
bool dependent_launch_allowed() {
  const char* env = std::getenv("KVQ_CUDA_DEPENDENT_LAUNCH");
  if (env == nullptr || std::string_view(env) == "1") return true;
  KVQ_CHECK(std::string_view(env) == "0", "KVQ_CUDA_DEPENDENT_LAUNCH=", env, ": use 0 or 1");
  return false;
}

constexpr int kWindowChunk = 64;

// Folds tokens [first, count) of the original space into this thread's channel c of (m, l, o), kWindowChunk at a
// time: key(t, j) and value(t, j) token t's key and value in channel j. Scores by warps into sc, in the exp2 domain
// of qv (the query times scale log2 e). Every thread of the block calls it alike (it synchronizes).
template <class Key, class Value>
__device__ __forceinline__ void fold_tokens(int first, int count, const float* qv, float* sc, Key key, Value value,
                                            float& m, float& l, float& o) {
  const int D = blockDim.x, c = threadIdx.x, lane = c & 31, warp = c >> 5, n_warps = D / 32;
  for (int t0 = first; t0 < count; t0 += kWindowChunk) {
    const int n = min(kWindowChunk, count - t0);
    for (int t = warp; t < n; t += n_warps) {
      float part = 0;
      for (int j = lane; j < D; j += 32) part = fmaf(qv[j], key(t0 + t, j), part);
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
      o = fmaf(p, value(t0 + t, c), o);
    }
    m = mx;
    __syncthreads();
  }
}

// One (sequence, query head) per block, blockDim = D: merge the splits, map back, fold in the window and the sink
// tokens (as the CPU, after the window), normalize.
// The splits are summed by 4 groups of D / 4 threads (a float4 of o each), then the groups are added.
__global__ void merge_kernel(const MergeArgs a) {
  extern __shared__ float sh[];
  const int D = blockDim.x, VD = a.value_space, c = threadIdx.x, lane = c & 31, warp = c >> 5, n_warps = D / 32;
  float* o_part = sh;          // [4][D]: the groups' sums of one D-slice of o
  float* o_space = sh + 4 * D; // [VD]: o in the value codec's space
  float* red = o_space + VD;   // [8]: warp maxima, then the groups' sums of l
  float* qv = red + 8;         // [D]
  float* sc = qv + D;         // [kWindowChunk]
  const int qh = blockIdx.x, s = blockIdx.y;
  const size_t row0 = (static_cast<size_t>(s) * a.n_q_heads + qh) * a.n_splits;
  wait_for_prior_kernel();

  float m = -INFINITY;
  for (int i = c; i < a.n_splits; i += D) m = fmaxf(m, a.partial_ml[2 * (row0 + i)]);
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  for (int w = 0; w < n_warps; ++w) m = fmaxf(m, red[w]);
  __syncthreads();  // red is rewritten below

  const int q4 = D / 4, grp = c / q4, c4 = c % q4;
  for (int base = 0; base < VD; base += D) {  // one D-slice of the value space at a time
    float4 acc = make_float4(0, 0, 0, 0);
    float l = 0;
    if (m != -INFINITY)
#pragma unroll 4
      for (int i = grp; i < a.n_splits; i += 4) {  // an empty split (m = -inf, l = 0, o = 0) weighs 0
        const float w = exp2f(a.partial_ml[2 * (row0 + i)] - m);
        l = fmaf(w, a.partial_ml[2 * (row0 + i) + 1], l);
        const float4 x = reinterpret_cast<const float4*>(a.partial_o + (row0 + i) * VD + base)[c4];
        acc = make_float4(fmaf(w, x.x, acc.x), fmaf(w, x.y, acc.y), fmaf(w, x.z, acc.z), fmaf(w, x.w, acc.w));
      }
    reinterpret_cast<float4*>(o_part + grp * D)[c4] = acc;
    if (base == 0 && c4 == 0) red[grp] = l;
    __syncthreads();
    o_space[base + c] = o_part[c] + o_part[D + c] + o_part[2 * D + c] + o_part[3 * D + c];
    __syncthreads();  // o_part is rewritten by the next slice
  }
  float l = red[0] + red[1] + red[2] + red[3];
  float o = o_space[c];
  if (a.value_map != nullptr) o = map_column(a.value_map, D, c, o_space, VD);

  const WindowDesc win = a.windows[s];
  const int kvh = qh / a.group;
  const float* keys = win.window + static_cast<size_t>(kvh) * a.slots * D;
  const float* values = win.window + static_cast<size_t>(a.n_kv_heads + kvh) * a.slots * D;
  qv[c] = a.q[(static_cast<size_t>(s) * a.n_q_heads + qh) * D + c] * a.scale_log2;
  __syncthreads();
  fold_tokens(
      win.first, win.count, qv, sc, [&](int t, int j) { return keys[static_cast<size_t>(t) * D + j]; },
      [&](int t, int j) { return values[static_cast<size_t>(t) * D + j]; }, m, l, o);
  if (win.sinks != nullptr) {
    // f16, widened exactly; keys minus the key offset where pages and window hold centered keys.
    const uint16_t* sink_keys = win.sinks + static_cast<size_t>(kvh) * win.sink_slots * D;
    const uint16_t* sink_values = win.sinks + static_cast<size_t>(a.n_kv_heads + kvh) * win.sink_slots * D;
    const float* offset = win.key_offset != nullptr ? win.key_offset + static_cast<size_t>(kvh) * D : nullptr;
    fold_tokens(
        win.sink_first, win.sink_count, qv, sc,
        [&](int t, int j) {
          const float k = f16_bits_to_float(sink_keys[static_cast<size_t>(t) * D + j]);
          return offset != nullptr ? k - offset[j] : k;
        },
        [&](int t, int j) { return f16_bits_to_float(sink_values[static_cast<size_t>(t) * D + j]); }, m, l, o);
  }
  a.out[(static_cast<size_t>(s) * a.n_q_heads + qh) * D + c] = l > 0 ? o / l : 0.0f;
}

size_t merge_smem(int d, int vd) {
  return sizeof(float) * (5 * static_cast<size_t>(d) + static_cast<size_t>(vd) + 8 + kWindowChunk);
}

// Chunks per warp for a batch of `units` (sequence, kv head) pairs of seq_chunks chunks each: the blocks
// (per_block ranges each) run in waves of `resident` blocks, so the split kernel takes about waves x chunks-per-warp
// chunk steps, and the merge reads every range of a sequence (about ranges / 16 steps: 4 groups, 4 loads in
// flight). The cheapest count, with at most 256 ranges per sequence.
int chunks_per_warp(int seq_chunks, long long units, int per_block, long long resident) {
  constexpr int kMaxRanges = 256;
  int best = seq_chunks;
  double best_cost = INFINITY;
  for (int pw = (seq_chunks + kMaxRanges - 1) / kMaxRanges; pw <= seq_chunks; ++pw) {
    const int ranges = (seq_chunks + pw - 1) / pw;
    const long long blocks = units * ((ranges + per_block - 1) / per_block);
    const long long waves = (blocks + resident - 1) / std::max(1LL, resident);
    const double cost = static_cast<double>(waves) * pw + ranges / 16.0;
    if (cost < best_cost) {
      best_cost = cost;
      best = pw;
    }
  }
  return best;
}

// The kernels' codec identities: what the traits of codec_traits.cuh decode.
std::string codec_id(const Codec& c) {
  const std::string& name = c.spec().name;
  if (name == "kivi" || name == "turbo_mse" || name == "turbo_prod" || name == "turbo_rvq")
    return name + ":" + std::to_string(c.spec().arg(0, 0));
  if (name == "vecinfer")
    return name + ":" + std::to_string(c.spec().arg(0, 8)) + "/" + std::to_string(c.spec().arg(1, 4));
  if (name == "qjl" && c.space_dim() != c.dim()) return name + ":" + std::to_string(c.space_dim());
  return name;
}

std::optional<KernelFor> find_kernel(const Codec& k, const Codec& v) {
  for (const PairKernel& p : pair_kernels())
    if (p.key == codec_id(k) && p.value == codec_id(v)) return p.kernel;
  return std::nullopt;
}

// The pairs this build has, and where the others come from.
std::string pair_list() {
  std::string list = "kernels: ";
  for (const PairKernel& p : pair_kernels()) list += p.key + "/" + p.value + ", ";
  list.resize(list.size() - 2);
  std::string codecs;
  for (const std::string& c : kernel_codecs()) codecs += (codecs.empty() ? "" : ", ") + c;
  if (kAllPairs) return list + "; every pair of " + codecs;
  return list + "; a build with -DKVQ_CUDA_ALL_PAIRS=ON has every key codec with every value codec of " + codecs;
}

std::vector<float> identity(int d) {
  std::vector<float> eye(static_cast<size_t>(d) * d, 0.0f);
  for (int i = 0; i < d; ++i) eye[static_cast<size_t>(i) * d + i] = 1.0f;
  return eye;
}

bool is_identity(const std::vector<float>& m, int d) {
  return m.size() == static_cast<size_t>(d) * d && m == identity(d);
}

template <class T>
DevicePtr<T> upload(const std::vector<T>& host, const std::string& what) {
  DevicePtr<T> dev = device_alloc<T>(host.size(), what);
  if (!host.empty())
    KVQ_CUDA_CHECK(cudaMemcpy(dev.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return dev;
}

}  // namespace

std::vector<float> space_sigma(const Codec& c) {
  if (const auto ip = int_group_params(c)) return {ip->lambda, ip->lambda + c.dim()};
  std::vector<float> s(static_cast<size_t>(c.space_dim()), 1.0f);
  if (const auto qp = qjl_params(c)) std::fill(s.begin(), s.end(), qp->sketch_scale);
  if (const auto tp = turbo_prod_params(c)) std::fill(s.begin() + c.dim(), s.end(), tp->sketch_scale);
  return s;
}

// The byte tables of the 16 nibble levels * 2^12 as fp16 for the kernels' byte-permute lookups
// (CodecArgs::table_hi): low bytes of levels 0-3, 4-7, high bytes of 0-3, 4-7, then the same for 8-15. The kernels
// take the levels as exact fp16 operands: the codecs round them to fp16 precision (FloatCodebook), checked here.
static void level_tables(const Codec& c, const float* levels, uint32_t (&hi)[8]) {
  for (int e = 0; e < 16; ++e) {
    const float x = levels[e] * 4096.0f;
    const uint16_t h = f32_to_f16(x);
    KVQ_CHECK(f16_to_f32(h) == x, "CUDA decode attention: codec '", c.spec().str(), "' has a level ", levels[e],
              " that fp16 does not hold exactly");
    const int word = 4 * (e / 8) + e % 8 / 4, shift = 8 * (e % 4);
    hi[word] |= static_cast<uint32_t>(h & 0xff) << shift;
    hi[2 + word] |= static_cast<uint32_t>(h >> 8) << shift;
  }
}

// The integer path's levels (CodecArgs::levels_i8), rounded as the CPU's fast kernels round them.
static void set_byte_levels(const float* levels, CodecArgs& a) {
  const SignedByteLevels b = signed_byte_levels(levels);
  a.level_unit = b.unit;
  for (int e = 0; e < 16; ++e)
    a.levels_i8[e / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(b.l[e])) << (8 * (e % 4));
}

std::vector<uint32_t> codec_table(const Codec& c, bool key) {
  if (const auto tr = turbo_rvq_params(c)) {  // the two stages' level tables (CodecArgs::table_hi's layout)
    std::vector<uint32_t> table;
    for (const float* levels : tr->stage_levels) {
      uint32_t hi[8] = {};
      level_tables(c, levels, hi);
      table.insert(table.end(), hi, hi + 8);
    }
    return table;
  }
  const auto* vi = dynamic_cast<const VecInferCodec*>(&c);
  if (!vi) return {};
  // Per centroid and 4-channel group: the fp16 pairs (c0, c1), (c2, c3), then (keys) their remainders.
  const std::vector<float>& cb = vi->codebook();
  std::vector<uint32_t> table;
  for (size_t g = 0; g < cb.size(); g += 4) {
    uint32_t hi[2], lo[2];
    for (int h = 0; h < 2; ++h) {
      uint16_t hh[2], ll[2];
      for (int e = 0; e < 2; ++e) {
        const float x = cb[g + 2 * static_cast<size_t>(h) + static_cast<size_t>(e)];
        hh[e] = f32_to_f16(x);
        ll[e] = f32_to_f16(x - f16_to_f32(hh[e]));
      }
      hi[h] = static_cast<uint32_t>(hh[0]) | static_cast<uint32_t>(hh[1]) << 16;
      lo[h] = static_cast<uint32_t>(ll[0]) | static_cast<uint32_t>(ll[1]) << 16;
    }
    table.insert(table.end(), {hi[0], hi[1]});
    if (key) table.insert(table.end(), {lo[0], lo[1]});
  }
  return table;
}

// What the kernels read of a codec's blocks beyond the layout fixed at compile time; checks what they assume.
CodecArgs host_codec_args(const Codec& c, bool key) {
  CodecArgs a;
  a.T = c.block_tokens();
  const size_t d = static_cast<size_t>(c.dim()), T = static_cast<size_t>(a.T);
  if (const auto ip = int_group_params(c)) {
    // A scale per k16 step (int8 keys; int4 keys on the integer path, whose fp16 path needs 32: split_kernel_fn) or
    // per 16 lanes (values).
    const int lane_groups = 16;
    KVQ_CHECK(ip->group % lane_groups == 0, "CUDA decode attention: ", key ? "key" : "value", " codec '",
              c.spec().str(), "' has groups of ", ip->group, " channels; the kernel needs a multiple of ", lane_groups);
    a.group = ip->group;
    for (int g = ip->group / 16; g > 1; g /= 2) ++a.group_shift;
    for (int g = ip->group; g > 1; g /= 2) ++a.group_log2;
    a.groups = c.dim() / ip->group;
    a.sec0 = static_cast<uint32_t>(
        layout::IntGroup{d, T, static_cast<size_t>(ip->bits), static_cast<size_t>(ip->group), key}.scales_offset());
  } else if (const auto kl = kivi_layout(c)) {
    KVQ_CHECK(key || kl->G % 16 == 0, "CUDA decode attention: value codec '", c.spec().str(), "' has groups of ",
              kl->G, " channels; the kernel needs a multiple of 16");
    a.group = static_cast<int>(kl->G);
    for (int g = a.group; g > 1; g /= 2) ++a.group_log2;
    a.groups = c.dim() / a.group;
    a.sec0 = static_cast<uint32_t>(kl->mins_offset());
    a.sec1 = static_cast<uint32_t>(kl->scales_offset());
    if (kl->planes() == 2) a.sec2 = static_cast<uint32_t>(kl->plane_offset(1));  // kivi:3's high bits
  } else if (const auto tm = turbo_mse_params(c)) {
    a.sec0 = static_cast<uint32_t>(tm->layout.norms_offset());
    level_tables(c, tm->nibble_levels, a.table_hi);
    if (key && tm->layout.bits <= kByteLevelMaxBits) set_byte_levels(tm->nibble_levels, a);  // the integer path's
  } else if (const auto tp = turbo_prod_params(c)) {
    a.sec0 = static_cast<uint32_t>(tp->layout.mse().norms_offset());
    a.sec1 = static_cast<uint32_t>(tp->layout.signs_offset());
    a.sec2 = static_cast<uint32_t>(tp->layout.residual_norms_offset());
    level_tables(c, tp->nibble_levels, a.table_hi);
  } else if (const auto tr = turbo_rvq_params(c)) {
    a.sec0 = static_cast<uint32_t>(tr->layout.norms_offset());
    a.sec1 = static_cast<uint32_t>(tr->layout.stage2_offset());
    a.table_bytes = 2 * 8 * sizeof(uint32_t);  // codec_table: both stages' level tables
  } else if (const auto qp = qjl_params(c)) {
    a.sec0 = static_cast<uint32_t>(qp->layout.norms_offset());
  } else if (const auto* vi = dynamic_cast<const VecInferCodec*>(&c)) {
    layout::VecInfer l{d, T, static_cast<size_t>(vi->sub_dim()), static_cast<size_t>(vi->codeword_bits())};
    l.norm = c.block_bytes() > l.block_bytes();  // the gammas follow the index rows
    KVQ_CHECK(key || !l.norm, "CUDA decode attention: value codec '", c.spec().str(),
              "' stores gammas (norm=1); the kernels take vecinfer values without them");
    a.sec1 = l.norm ? static_cast<uint32_t>(l.norms_offset()) : 0u;
    // fp16 hi (+ lo) per float, copied into each block's shared memory, or gathered from global memory
    // (vecinfer_traits.cuh says when and why)
    if (vecinfer_table_in_shared(vi->codeword_bits(), vi->sub_dim()))
      a.table_bytes = static_cast<uint32_t>(vi->codebook().size() * (key ? 4 : 2));
  }
  return a;
}

}  // namespace detail

using namespace detail;

namespace {

bool fast_precision() { return kvq::detail::active_precision() == kvq::detail::Precision::fast; }

// Whether the kernel takes a fast path under KVQ_ATTENTION=fast (the default; the CPU's switch, read at each plan):
// the integer scores of int4/int8, kivi and turbo_mse:1-3 keys, or the fast value path of int4 values in groups of 32
// or 64 channels and of turbo_mse values (the traits' fast_values); else the exact fp16 kernel.
bool fast_path(const Codec& k, const Codec& v) {
  const auto vp = int_group_params(v);
  const bool fast_values = (vp && vp->bits == 4 && vp->group >= 32) || turbo_mse_params(v).has_value();
  const auto kt = turbo_mse_params(k);
  const bool int_scores = int_group_params(k).has_value() || kivi_layout(k).has_value() ||
                          (kt && kt->layout.bits <= kByteLevelMaxBits);
  return fast_precision() && (int_scores || fast_values);
}

}  // namespace

std::string DevicePlan::kernel(const KVCache& cache, int layer) {
  const Codec& k = cache.key_codec(layer);
  const Codec& v = cache.value_codec(layer);
  const int d = cache.config().head_dim;
  KVQ_CHECK(d == 64 || d == 128 || d == 256, "CUDA decode attention: head dimension ", d,
            " has no kernel (64, 128 or 256)");
  KVQ_CHECK(find_kernel(k, v).has_value(), "CUDA decode attention: no kernel for key codec '", k.spec().str(),
            "' with value codec '", v.spec().str(), "' (", pair_list(), ")");
  const bool fast = fast_path(k, v);
  if (const auto ip = int_group_params(k); ip && ip->bits == 4 && ip->group == 16)
    KVQ_CHECK(fast_precision(), "CUDA decode attention: key codec '", k.spec().str(),
              "' (groups of 16 channels) has only the fast kernel (integer scores); KVQ_ATTENTION=exact asks for the "
              "exact one, which needs groups of 32 or 64");
  return "cuda_" + k.spec().name + "_" + v.spec().name + (fast ? "_fast" : "");
}

struct DevicePlan::Impl {
  int device = 0, n_seqs = 0, n_q_heads = 0, n_kv_heads = 0, d = 0, key_space = 0, value_space = 0, group = 0;
  int ranges = 0;  // the split kernel's per (sequence, kv head)
  std::string kernel_name;
  SplitKernel kernel;
  int blocks_per_sm = 0, sms = 0;
  bool dependent_launch = false;  // compute capability 9.0 or later: kernels launched as dependents
  dim3 grid;
  SplitArgs split{};
  // The pages sliding windows start inside, through the kernel's window-start variant (false: no launch).
  bool window_start = false;
  dim3 window_start_grid;
  SplitArgs window_start_args{};
  MergeArgs merge{};
  size_t smem = 0;
  DevicePtr<SeqPages> seqs, window_start_pages;  // the plan's own tables (a DecodeStep's are the step's)
  DevicePtr<WindowDesc> windows;
  DevicePtr<float> key_map, value_map, q_space, partial_o, partial_ml;
  DevicePtr<uint32_t> key_table, value_table;  // the codecs' tables (vecinfer's codebooks)
  // The call as a CUDA graph once it repeats with the same arrays (launch overhead of small shapes).
  std::mutex mutex;
  const float* last_q = nullptr;
  float* last_out = nullptr;
  cudaStream_t capture = nullptr;
  cudaGraphExec_t graph = nullptr;

  ~Impl() {
    if (graph) cudaGraphExecDestroy(graph);
    if (capture) cudaStreamDestroy(capture);
  }

  void choose_kernel(const KVCache& cache, int layer, int n_q_heads);
  void shape(const KVCache& cache, int max_pages, const DecodeTables& tables, const AttentionOptions& options,
             float scale);

  // The three kernels of one call (four with the window-start variant), enqueued on `stream`, each after the first
  // a dependent launch of the one before it (and the first of the kernel that wrote q).
  void enqueue(const float* q_dev, float* out_dev, cudaStream_t stream) const {
    const dim3 rows(static_cast<unsigned>(n_q_heads), static_cast<unsigned>(n_seqs));
    SplitArgs a = split;
    a.q_space = q_dev;
    if (key_map) {
      const float* map = key_map.get();
      float* space = q_space.get();
      int heads = n_q_heads, dim = d;
      void* map_args[] = {&q_dev, &map, &heads, &dim, &space};
      KVQ_CUDA_CHECK(launch_dependent(reinterpret_cast<const void*>(&map_queries_kernel), rows,
                                      dim3(static_cast<unsigned>(key_space)), d * sizeof(float), stream, map_args,
                                      dependent_launch));
      a.q_space = q_space.get();
    }
    const dim3 threads(static_cast<unsigned>(kernel.threads));
    void* args[] = {&a};
    KVQ_CUDA_CHECK(launch_dependent(kernel.fn, grid, threads, smem, stream, args, dependent_launch));
    if (window_start) {
      SplitArgs w = window_start_args;
      w.q_space = a.q_space;
      void* w_args[] = {&w};
      KVQ_CUDA_CHECK(
          launch_dependent(kernel.window_start_fn, window_start_grid, threads, smem, stream, w_args, dependent_launch));
    }
    MergeArgs m = merge;
    m.q = q_dev;
    m.out = out_dev;
    void* m_args[] = {&m};
    KVQ_CUDA_CHECK(launch_dependent(reinterpret_cast<const void*>(&merge_kernel), rows, dim3(static_cast<unsigned>(d)),
                                    merge_smem(d, value_space), stream, m_args, dependent_launch));
  }
};

// What does not depend on the batch: the pair's kernel, the codecs' maps and tables, shared memory and occupancy.
void DevicePlan::Impl::choose_kernel(const KVCache& cache, int layer, int n_q_heads_) {
  kernel_name = DevicePlan::kernel(cache, layer);
  const CacheConfig& cfg = cache.config();
  KVQ_CHECK(cache.device().is_cuda(), "CUDA decode attention: a ", cache.device().str(), " cache");
  device = cache.device().index;
  use_device(device);
  n_q_heads = n_q_heads_;
  n_kv_heads = cfg.n_kv_heads;
  d = cfg.head_dim;
  KVQ_CHECK(n_q_heads > 0 && n_q_heads % cfg.n_kv_heads == 0, "CUDA decode attention: ", n_q_heads,
            " query heads is not a multiple of the cache's ", cfg.n_kv_heads, " kv heads");
  group = n_q_heads / cfg.n_kv_heads;
  KVQ_CHECK(group == 1 || group == 2 || group == 4 || group == 8, "CUDA decode attention: GQA group of ", group,
            " query heads per kv head has no kernel (1, 2, 4 or 8)");
  const Codec& kc = cache.key_codec(layer);
  const Codec& vc = cache.value_codec(layer);
  const int T = cfg.block_tokens;
  SplitArgs& a = split;
  a.key = host_codec_args(kc, true);
  a.value = host_codec_args(vc, false);
  key_table = upload(codec_table(kc, true), "the key codec's table");
  value_table = upload(codec_table(vc, false), "the value codec's table");
  a.key.table = key_table.get();
  a.value.table = value_table.get();
  kernel = (*find_kernel(kc, vc))(d, a.key, a.value, fast_precision());
  KVQ_CHECK(kernel.fn != nullptr, "CUDA decode attention: no instantiation for d = ", d, " (", kernel_name, ")");
  KVQ_CHECK(kernel.fast == fast_path(kc, vc), "CUDA decode attention: ", kernel_name, " has no fast path");
  KVQ_CHECK(T % kernel.chunk == 0, "CUDA decode attention: pages of ", T, " tokens are not whole chunks of ",
            kernel.chunk, " (", kernel_name, ")");

  // The codecs' maps, once: Kt[j][c] = sigma_k[c] (A_k e_j)[c] (d x M, M the key space) and Vt[j][c] = sigma_v[j]
  // (A_v^T e_j)[c] (VD x d, VD the value space).
  const int M = kc.space_dim(), VD = vc.space_dim();
  key_space = M;
  value_space = VD;
  KVQ_CHECK(VD % d == 0, "CUDA decode attention: value codec '", vc.spec().str(), "' has a space of ", VD,
            " channels; the kernels take a multiple of d = ", d);
  std::vector<float> kt(static_cast<size_t>(d) * M), vt(static_cast<size_t>(VD) * d);
  const std::vector<float> sk = space_sigma(kc), sv = space_sigma(vc);
  kc.to_space(identity(d).data(), d, kt.data());
  vc.from_space(identity(VD).data(), VD, vt.data());
  for (int j = 0; j < d; ++j)
    for (int c = 0; c < M; ++c) kt[static_cast<size_t>(j) * M + c] *= sk[static_cast<size_t>(c)];
  for (int j = 0; j < VD; ++j)
    for (int c = 0; c < d; ++c) vt[static_cast<size_t>(j) * d + c] *= sv[static_cast<size_t>(j)];
  if (!is_identity(kt, d)) key_map = upload(kt, "the key codec's query map");
  if (!is_identity(vt, d)) value_map = upload(vt, "the value codec's output map");

  // Shared memory: the block's query tables, then per warp its tables and its pipeline stages.
  int smem_limit = 0;
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int major = 0;
  KVQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  dependent_launch = major >= 9 && dependent_launch_allowed();
  const SplitKernel& k = kernel;
  a.stage_bytes = k.code_bytes + k.param_bytes;
  const size_t warp_bytes = static_cast<size_t>(k.warp_bytes) + static_cast<size_t>(k.stages) * a.stage_bytes;
  smem = static_cast<size_t>(k.block_bytes) + a.key.table_bytes + a.value.table_bytes +
         static_cast<size_t>(k.warps) * warp_bytes;
  KVQ_CHECK(smem <= static_cast<size_t>(smem_limit), "CUDA decode attention: ", kernel_name, " needs ", smem,
            " bytes of shared memory per block, the device offers ", smem_limit);
  KVQ_CUDA_CHECK(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  KVQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, k.fn, k.threads, smem));
}

// The grid, split-K and workspace for n_seqs sequences of at most max_pages pages each, read from `tables`.
void DevicePlan::Impl::shape(const KVCache& cache, int max_pages, const DecodeTables& tables,
                             const AttentionOptions& options, float scale) {
  const CacheConfig& cfg = cache.config();
  const SplitKernel& k = kernel;
  const int T = cfg.block_tokens, VD = value_space;
  SplitArgs& a = split;
  // Split-K: each warp (k.parts warps for d > 128) takes a range of chunks of one (sequence, kv head); how many
  // chunks a range holds comes from the waves the batch's blocks make on the device (chunks_per_warp), unless the
  // options say how many ranges per sequence.
  const int per_block = k.warps / k.parts;
  const int seq_chunks = std::max(1, max_pages * (T / k.chunk));
  const long long units = std::max(1, n_seqs * n_kv_heads);
  int per_warp = options.splits > 0
                     ? (seq_chunks + options.splits - 1) / options.splits
                     : chunks_per_warp(seq_chunks, units, per_block, static_cast<long long>(blocks_per_sm) * sms);
  per_warp = std::clamp(per_warp, 1, seq_chunks);
  const int n_ranges = (seq_chunks + per_warp - 1) / per_warp;
  grid = dim3(static_cast<unsigned>((n_ranges + per_block - 1) / per_block), static_cast<unsigned>(n_kv_heads),
              static_cast<unsigned>(n_seqs));
  ranges = static_cast<int>(grid.x) * per_block;
  // The window-start variant: one block per (sequence, kv head) whose ranges share the page's chunks, its partial
  // states in slots after the split kernel's, folded by the merge like any range.
  window_start = tables.window_start != nullptr;
  const int splits = ranges + (window_start ? per_block : 0);

  a.pool = Backend::pool(cache);
  a.page_bytes = cache.page_bytes();
  a.key_offset = cache.key_block_offset(0);
  a.key_stride = cache.key_block_offset(1 % cfg.n_kv_heads) - a.key_offset;
  a.value_offset = cache.value_block_offset(0);
  a.value_stride = cache.value_block_offset(1 % cfg.n_kv_heads) - a.value_offset;
  a.G = group;
  a.n_q_heads = n_q_heads;
  a.n_splits = splits;
  a.chunks_per_warp = per_warp;
  for (int c = T / k.chunk; c > 1; c /= 2) ++a.page_shift;
  a.seqs = tables.seqs;
  a.scale_log2 = scale * std::numbers::log2e_v<float>;

  const size_t rows = static_cast<size_t>(n_seqs) * n_q_heads;
  partial_o = device_alloc<float>(rows * splits * VD, "split-K partial outputs");
  partial_ml = device_alloc<float>(rows * splits * 2, "split-K partial maxima and sums");
  if (key_map) q_space = device_alloc<float>(rows * key_space, "queries in the key codec's space");
  a.partial_o = partial_o.get();
  a.partial_ml = partial_ml.get();
  if (window_start) {
    KVQ_CUDA_CHECK(cudaFuncSetAttribute(k.window_start_fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
    SplitArgs& w = window_start_args;
    w = a;
    w.seqs = tables.window_start;
    const int page_chunks = T / k.chunk;
    w.chunks_per_warp = (page_chunks + per_block - 1) / per_block;
    w.partial_o = a.partial_o + static_cast<size_t>(ranges) * VD;
    w.partial_ml = a.partial_ml + 2 * static_cast<size_t>(ranges);
    window_start_grid = dim3(1, static_cast<unsigned>(n_kv_heads), static_cast<unsigned>(n_seqs));
  }

  MergeArgs& m = merge;
  m.partial_o = a.partial_o;
  m.partial_ml = a.partial_ml;
  m.n_splits = splits;
  m.n_q_heads = n_q_heads;
  m.group = group;
  m.n_kv_heads = cfg.n_kv_heads;
  m.slots = cfg.residual_tokens + cfg.block_tokens - 1;
  m.value_space = VD;
  m.value_map = value_map.get();
  m.windows = tables.windows;
  m.scale_log2 = a.scale_log2;
}

DevicePlan::DevicePlan(const KVCache& cache, int layer, std::span<const SeqId> seqs, int n_q_heads,
                       const AttentionOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& p = *impl_;
  const float scale = options.resolved_scale(cache.config().head_dim);  // the CPU's checks, before any allocation
  p.choose_kernel(cache, layer, n_q_heads);
  p.n_seqs = static_cast<int>(seqs.size());

  // Block tables and windows of the batch, from where a sliding window starts (window_start.hpp): the split
  // kernel reads the pages the window sees whole, its window-start variant the page the window starts inside.
  const int T = cache.config().block_tokens;
  std::vector<SeqPages> pages, start_pages;
  std::vector<WindowDesc> windows;
  int max_pages = 0;
  bool starts_inside_a_page = false;
  for (SeqId id : seqs) {
    const LayerView v = cache.view(id, layer);
    const WindowStart w = window_start(v.pages.size(), T, v.residual_count, options.window, v.sink_count);
    const size_t whole = w.first_whole_page();
    pages.push_back({v.device_pages + whole, static_cast<int>(v.pages.size() - whole), 0});
    start_pages.push_back({v.device_pages + w.page, w.in_page > 0 ? 1 : 0, w.in_page});
    const int sink_slots = static_cast<int>(v.sink_stride / static_cast<size_t>(cache.config().head_dim));
    windows.push_back({v.residual_keys, v.residual_count, w.in_residual, v.sink_keys, sink_slots, v.sink_count,
                       w.in_sinks, v.key_offset});
    max_pages = std::max(max_pages, pages.back().n_pages);
    starts_inside_a_page |= w.in_page > 0;
  }
  p.seqs = upload(pages, "the batch's block tables");
  p.windows = upload(windows, "the batch's windows");
  if (starts_inside_a_page) p.window_start_pages = upload(start_pages, "the pages the batch's windows start in");
  p.shape(cache, max_pages, {p.seqs.get(), p.windows.get(), p.window_start_pages.get()}, options, scale);
}

DevicePlan::DevicePlan(const KVCache& cache, int layer, int n_seqs, int n_q_heads,
                       const AttentionOptions& options, size_t max_pages, const DecodeTables& tables)
    : impl_(std::make_unique<Impl>()) {
  Impl& p = *impl_;
  const float scale = options.resolved_scale(cache.config().head_dim);
  p.choose_kernel(cache, layer, n_q_heads);
  p.n_seqs = n_seqs;
  KVQ_CHECK(max_pages <= static_cast<size_t>(INT_MAX), "CUDA decode attention: ", max_pages, " pages per sequence");
  p.shape(cache, static_cast<int>(max_pages), tables, options, scale);
}

DevicePlan::~DevicePlan() = default;
DevicePlan::DevicePlan(DevicePlan&&) noexcept = default;
DevicePlan& DevicePlan::operator=(DevicePlan&&) noexcept = default;

int DevicePlan::splits() const { return impl_->ranges; }

void DevicePlan::enqueue(const float* q_dev, float* out_dev, void* stream) const {
  if (impl_->n_seqs > 0) impl_->enqueue(q_dev, out_dev, static_cast<cudaStream_t>(stream));
}

void DevicePlan::run(const float* q_dev, float* out_dev, size_t n_floats, void* stream_ptr) const {
  Impl& p = *impl_;
  const size_t batch = static_cast<size_t>(p.n_seqs) * static_cast<size_t>(p.n_q_heads) * static_cast<size_t>(p.d);
  KVQ_CHECK(n_floats == batch, "DecodePlan::run: q and out hold ", n_floats, " floats; the plan's batch takes ", batch,
            " ([", p.n_seqs, " sequences][", p.n_q_heads, " query heads][", p.d, "])");
  if (p.n_seqs == 0) return;
  KVQ_CHECK(q_dev != nullptr && out_dev != nullptr, "CUDA decode attention: null query or output");
  use_device(p.device);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const std::lock_guard<std::mutex> lock(p.mutex);
  const bool repeat = q_dev == p.last_q && out_dev == p.last_out;
  if (!repeat) {  // a first call with these arrays: checked, then plain launches
    for (const void* x : {static_cast<const void*>(q_dev), static_cast<const void*>(out_dev)}) {
      cudaPointerAttributes at{};
      KVQ_CHECK(cudaPointerGetAttributes(&at, x) == cudaSuccess &&
                    (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged) && at.device == p.device,
                "CUDA decode attention: ", x == q_dev ? "q" : "out", " is not memory of the cache's device cuda:",
                p.device);
    }
    if (p.graph) KVQ_CUDA_CHECK(cudaGraphExecDestroy(p.graph));
    p.graph = nullptr;
    p.last_q = q_dev;
    p.last_out = out_dev;
    p.enqueue(q_dev, out_dev, stream);
    return;
  }
  if (!p.graph) {  // the second: capture the three kernels once
    if (!p.capture) KVQ_CUDA_CHECK(cudaStreamCreateWithFlags(&p.capture, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    KVQ_CUDA_CHECK(cudaStreamBeginCapture(p.capture, cudaStreamCaptureModeThreadLocal));
    try {
      p.enqueue(q_dev, out_dev, p.capture);
    } catch (...) {
      cudaStreamEndCapture(p.capture, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    KVQ_CUDA_CHECK(cudaStreamEndCapture(p.capture, &graph));
    const cudaError_t status = cudaGraphInstantiate(&p.graph, graph, 0);
    cudaGraphDestroy(graph);
    KVQ_CUDA_CHECK(status);
  }
  KVQ_CUDA_CHECK(cudaGraphLaunch(p.graph, stream));
}

void detail::synchronize(void* stream) { KVQ_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))); }

}  // namespace kvq::cuda
