// The append kernel family: one thread block encodes one page's block of one kv head. A launch covers the new pages
// of every sequence of a batch: the page's entry (EncodePage) names its sequence's stream and its first token. The
// block copies the page's T tokens of that head from the stream (the fp32 window, then the fresh tokens) into shared
// memory, all in flight at once (cp.async, no registers held), centers them where the cache centers keys and notes
// the first NaN or Inf among the fresh ones, lets the codec (`Enc`) rotate, normalize, quantize and pack them into a
// zeroed copy of the block in shared memory, and stores the block into the pool with coalesced stores.
//
// An Enc provides `static constexpr int kBlocksPerSM` (the blocks of kEncodeThreads per SM its registers must
// allow: __launch_bounds__), `size_t scratch_floats(int T, int d) const` (shared memory it needs beyond the tile) and
// `__device__ void encode(const EncodeContext&, float* tile, float* scratch, uint32_t* block) const`, called by
// every thread of the block; it writes whole 32-bit words of codes (one writer per word, no atomics), 16-bit fields
// with put_half, or fields with put_bits (shared-memory atomics, where several threads fill the bytes of one word),
// and reports values it cannot store with EncodeContext::report.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/cuda_check.cuh"
#include "cuda/device_encoder.hpp"
#include "cuda/encode_layout.cuh"
#include "cuda/fragment_ops.cuh"

namespace kvq::cuda::detail {

constexpr int kEncodeThreads = 256;
constexpr size_t kEncodeMaxSharedBytes = 200 * 1024;  // H200: up to 227 KB per block with the opt-in

struct EncodeContext {
  int page;  // the page's index in the launch: a report names its token t as page * T + t
  int head, T, d;
  FastDiv dd;  // division by d
  unsigned long long* error;
  /// Token t (of this page), channel c cannot be stored.
  __device__ void report(int t, int c) const {
    atomicMin(error, error_position(static_cast<size_t>(page) * T + t, head, c));
  }
};

/// ORs `value` (already masked to its width) into bit `place.shift` of byte `place.byte` of the block.
__device__ __forceinline__ void put_bits(uint32_t* block, const CodePlace& place, uint32_t value) {
  if (value != 0) atomicOr(block + place.byte / 4, value << (place.shift + 8 * (place.byte % 4)));
}
/// Stores a 16-bit field at an even byte offset (one writer per field).
__device__ __forceinline__ void put_half(uint32_t* block, uint32_t byte, uint16_t bits) {
  reinterpret_cast<uint16_t*>(block)[byte / 2] = bits;
}

/// Shared memory an Enc's scratch takes, rounded to whole float4 so that the block behind it is 16-byte aligned.
template <class Enc>
__host__ __device__ size_t scratch_quads(const Enc& enc, int T, int d) {
  return (enc.scratch_floats(T, d) + 3) / 4;
}


/// Whole quads of the block (zeroed and stored as such): its shared memory rounded up to 16 bytes.
__host__ __device__ inline size_t block_quads(size_t block_bytes) { return (block_bytes + 15) / 16; }

// blockIdx.z picks the role: keys and values of one codec kind share a launch. The parameters stay in the
// parameter space (__grid_constant__), addressed by reference. Shared memory: the tile (T x d floats), the Enc's
// scratch, then the block.
template <class Enc>
__global__ void __launch_bounds__(kEncodeThreads, Enc::kBlocksPerSM)
    encode_pages_kernel(const __grid_constant__ EncodeRole r0, const __grid_constant__ EncodeRole r1,
                        const __grid_constant__ Enc e0, const __grid_constant__ Enc e1) {
  extern __shared__ float4 shared4[];
  const bool second = blockIdx.z == 1;
  const EncodeRole& role = second ? r1 : r0;
  const EncodeSource& src = role.src;
  const Enc& enc = second ? e1 : e0;
  const int page = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y), T = src.T, d = src.d;
  const EncodePage job = role.pages[page];
  if (job.stream == kNoStream) return;
  const EncodeStream stream = src.streams[job.stream];
  const int used = stream.used, first = static_cast<int>(job.first);
  const FastDiv dd = FastDiv::of(d);
  float* tile = reinterpret_cast<float*>(shared4);
  float* scratch = tile + T * d;
  // (the block's offset in 32 bits: it is held through the encoder)
  float4* block4 = shared4 + (T * d / 4 + (static_cast<int>(enc.scratch_floats(T, d)) + 3) / 4);
  uint32_t* block = reinterpret_cast<uint32_t*>(block4);
  const int quads_out = static_cast<int>(block_quads(role.dst.block_bytes));
  const int tid = static_cast<int>(threadIdx.x);  // (threadIdx.x again after the encoder: a register less there)
  // Row t of the page: the window's slot first + t for t < in_window, else the stream's fresh token
  // first + t - used; each source a fixed stride per row from its origin (in floats). Window rows are copied as they
  // are, or centered where the offset is new in this append; fresh rows are checked for NaN / Inf (the first one's
  // flat index in fresh_base, by atomicMin) and centered where the stream has an offset.
  const int in_window = used - first;
  const int window_rows = min(max(in_window, 0), T);
  const size_t window_origin = (static_cast<size_t>(h) * src.slots + first) * d;
  const long long fresh_stride = static_cast<long long>(src.H) * d;
  const long long fresh_origin =
      (static_cast<long long>(stream.fresh_first) - in_window) * fresh_stride + static_cast<long long>(h) * d;
  const bool center_fresh = stream.offset != nullptr, center_window = center_fresh && stream.center_window;
  // The quad x of row t, channels c.. holds a NaN or Inf: its flat index in fresh_base.
  auto nonfinite = [&](const float4& x, int t, int c) {
    const int j = isfinite(x.x) ? isfinite(x.y) ? isfinite(x.z) ? 3 : 2 : 1 : 0;
    atomicMin(role.nonfinite, static_cast<unsigned long long>(fresh_origin + t * fresh_stride + c + j));
  };
  // The whole tile in flight at once, held by no registers, while the block is zeroed; then each thread checks and
  // centers the quads it copied (visible to it after its wait), and the barrier publishes them.
  // Where d divides a sweep of the block (4 floats a thread: d a power of two up to 1024, the usual case), a thread's
  // quads are the same 4 channels c of rows t0, t0 + step, ...: a fixed stride apart in the tile and in each source,
  // no division per quad, the offset's channels read once, and the NaN / Inf test one predicate per quad with the
  // position formed once, for the thread's first such quad (left uncentered so that its values tell which channel:
  // an append that holds one is refused, and its pages are not used).
  constexpr int kSweep = 4 * kEncodeThreads;
  const bool fixed_channels = dd.shift >= 0 && d <= kSweep;
  const int lstep = fixed_channels ? __ffs(kSweep) - 1 - dd.shift : 0, step = 1 << lstep;
  const int t0 = fixed_channels ? (4 * tid) >> dd.shift : 0, c0 = (4 * tid) & (d - 1);
  if (fixed_channels) {
    int t = t0;
    float4* to = shared4 + tid;
    if (t < window_rows) {
      const float* from = stream.window + (window_origin + static_cast<size_t>(t * d + c0));
      for (; t < window_rows; t += step, to += kEncodeThreads, from += step * d) cp_async16_cg(to, from);
    }
    if (t < T) {
      const float* from = src.fresh_base + (fresh_origin + t * fresh_stride + c0);
      const long long jump = step * fresh_stride;
#pragma unroll 4
      for (; t < T; t += step, to += kEncodeThreads, from += jump) cp_async16_cg(to, from);
    }
  } else {
#pragma unroll 1
    for (int i = tid; i < T * d / 4; i += kEncodeThreads) {
      const int t = dd.div(4 * i), c = dd.mod(4 * i);
      const float* row = t < in_window ? stream.window + (window_origin + static_cast<size_t>(t * d))
                                       : src.fresh_base + (fresh_origin + t * fresh_stride);
      cp_async16_cg(shared4 + i, row + c);
    }
  }
#pragma unroll 1
  for (int i = tid; i < quads_out; i += kEncodeThreads) block4[i] = float4{};
  cp_async_commit();
  cp_async_wait<0>();
  if (fixed_channels) {
    const float4 mu = center_fresh ? *reinterpret_cast<const float4*>(stream.offset + h * d + c0) : float4{};
    auto center = [&](float4* at, const float4& x) {
      *at = {__fsub_rn(x.x, mu.x), __fsub_rn(x.y, mu.y), __fsub_rn(x.z, mu.z), __fsub_rn(x.w, mu.w)};
    };
    int t = t0;
    float4* at = shared4 + tid;
    if (center_window) {
      for (; t < window_rows; t += step, at += kEncodeThreads) center(at, *at);
    } else if (t < window_rows) {  // past the window rows: they stay as copied
      const int k = (window_rows - t + step - 1) >> lstep;
      t += k * step;
      at += k * kEncodeThreads;
    }
    auto finite = [](const float4& x) {
      return (fabsf(x.x) < INFINITY) & (fabsf(x.y) < INFINITY) & (fabsf(x.z) < INFINITY) & (fabsf(x.w) < INFINITY);
    };
    const int t_fresh = t;
    float4* const at_fresh = at;
    int bad = T;  // the thread's first fresh row with a NaN or Inf
    if (center_fresh) {
      // A quad with a NaN or Inf stays uncentered (its values tell which channel), its row noted.
#pragma unroll 4
      for (; t < T; t += step, at += kEncodeThreads) {
        const float4 x = *at;
        if (finite(x))
          center(at, x);
        else
          bad = min(bad, t);
      }
    } else {
      // One predicate over every quad; the rows searched again only where it fails.
      bool all = true;
#pragma unroll 4
      for (; t < T; t += step, at += kEncodeThreads) all &= finite(*at);
      if (!all) [[unlikely]] {
        for (t = t_fresh, at = at_fresh; finite(*at); t += step, at += kEncodeThreads) {
        }
        bad = t;
      }
    }
    if (bad < T) [[unlikely]]
      nonfinite(at_fresh[((bad - t_fresh) >> lstep) * kEncodeThreads], bad, c0);
  } else {
#pragma unroll 1
    for (int i = tid; i < T * d / 4; i += kEncodeThreads) {
      const int t = dd.div(4 * i), c = dd.mod(4 * i);
      const bool from_window = t < in_window;
      const bool centered = center_fresh && (!from_window || center_window);
      if (from_window && !centered) continue;
      const float4 x = shared4[i];
      if (!from_window && !(isfinite(x.x) && isfinite(x.y) && isfinite(x.z) && isfinite(x.w))) nonfinite(x, t, c);
      if (centered) {
        const float4 mu = *reinterpret_cast<const float4*>(stream.offset + h * d + c);
        shared4[i] = {__fsub_rn(x.x, mu.x), __fsub_rn(x.y, mu.y), __fsub_rn(x.z, mu.z), __fsub_rn(x.w, mu.w)};
      }
    }
  }
  __syncthreads();
  enc.encode(EncodeContext{page, h, T, d, dd, role.error}, tile, scratch, block);
  __syncthreads();
  // The target page read again here rather than held through the encoder (a register it would spill for).
  const PageId target = role.pages[page].target;
  uint8_t* out = role.dst.pool + static_cast<size_t>(target) * role.dst.page_bytes +
                 role.dst.block_offset + static_cast<size_t>(h) * role.dst.head_stride;
  const int words = static_cast<int>((role.dst.block_bytes + 3) / 4);
  if (words % 4 == 0) {  // blocks start 64-byte aligned
    for (int i = threadIdx.x; i < words / 4; i += blockDim.x)
      reinterpret_cast<uint4*>(out)[i] = reinterpret_cast<const uint4*>(block)[i];
  } else {
    for (int i = threadIdx.x; i < words; i += blockDim.x) reinterpret_cast<uint32_t*>(out)[i] = block[i];
  }
}

/// Launches one block per (page, head) of one role, or of both (e1, r1 non-null: the value role, the same kind of
/// encoder); throws kvq::Error where a page does not fit in shared memory.
template <class Enc>
void launch_encode(const char* codec, const Enc& e0, const EncodeRole& r0, const Enc* e1, const EncodeRole* r1,
                   size_t n_pages, cudaStream_t stream) {
  if (n_pages == 0) return;
  auto need = [](const Enc& e, const EncodeRole& r) {
    return (static_cast<size_t>(r.src.T) * r.src.d / 4 + scratch_quads(e, r.src.T, r.src.d)) * sizeof(float4) +
           block_quads(r.dst.block_bytes) * sizeof(float4);
  };
  const size_t shared = std::max(need(e0, r0), e1 != nullptr ? need(*e1, *r1) : 0);
  KVQ_CHECK(shared <= kEncodeMaxSharedBytes, "KVCache::append_device: ", codec, ": a page of ", r0.src.T,
            " tokens x d = ", r0.src.d, " needs ", shared, " bytes of shared memory to encode (the limit is ",
            kEncodeMaxSharedBytes, ")");
  KVQ_CUDA_CHECK(cudaFuncSetAttribute(encode_pages_kernel<Enc>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(shared)));
  const dim3 grid(static_cast<unsigned>(n_pages), static_cast<unsigned>(r0.src.H), e1 != nullptr ? 2u : 1u);
  encode_pages_kernel<Enc><<<grid, kEncodeThreads, shared, stream>>>(r0, e1 != nullptr ? *r1 : r0, e0,
                                                                     e1 != nullptr ? *e1 : e0);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

/// The DeviceEncoder of one Enc type: keys and values in one launch where both are of this type.
template <class Enc>
class EncoderOf : public DeviceEncoder {
 public:
  bool encode(const EncodeRole& role, const DeviceEncoder* partner, const EncodeRole* partner_role, size_t n_pages,
              cudaStream_t stream) const override {
    const auto* p = dynamic_cast<const EncoderOf<Enc>*>(partner);
    launch_encode(name_.c_str(), enc_, role, p != nullptr ? &p->enc_ : nullptr, p != nullptr ? partner_role : nullptr,
                  n_pages, stream);
    return p != nullptr;
  }

 protected:
  explicit EncoderOf(std::string name) : name_(std::move(name)) {}
  Enc enc_{};

 private:
  std::string name_;
};

}  // namespace kvq::cuda::detail
