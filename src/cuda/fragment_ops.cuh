// Register-level building blocks of the decode kernels: byte permutes, packed fp16/bf16 arithmetic on 32-bit words,
// fp32 -> (hi, lo) operand splits, and the warp-wide tensor-core products mma.m16n8k16 with fp32 accumulators and
// mma.m16n8k32 on signed bytes with int32 accumulators (the int keys' fast path).
//
// Everything but the mma and the asynchronous copies also compiles for the host, so that a host test can run the
// codec traits' fragment code (codec_traits.cuh) lane by lane and check it against the CPU codecs.
//
// Fragment layout of mma.m16n8k16 (PTX ISA), for lane = 4 n + i (n = lane / 4, i = lane % 4):
//   A (16 x 16, 4 words): {A[n][2i], A[n][2i+1]}, {A[n+8][2i], A[n+8][2i+1]}, {A[n][2i+8], A[n][2i+9]},
//                         {A[n+8][2i+8], A[n+8][2i+9]}   (the lower k in the low 16 bits)
//   B (16 x 8, 2 words):  {B[2i][n], B[2i+1][n]}, {B[2i+8][n], B[2i+9][n]}
//   C (16 x 8, 4 floats): C[n][2i], C[n][2i+1], C[n+8][2i], C[n+8][2i+1]
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "cuda/unroll.cuh"

#if defined(__CUDACC__)
#define KVQ_HD __host__ __device__ __forceinline__
#else
#define KVQ_HD inline
#endif

namespace kvq::cuda::detail {

/// The k of a B fragment's element e (e = 0..3: b0, b1, b2, b3): 2i, 2i+1, 2i+8, 2i+9.
KVQ_HD constexpr int frag_k(int i, int e) { return 2 * i + (e & 1) + 8 * (e >> 1); }

/// Byte permute (PTX prmt, default mode): byte j of the result is byte (s >> 4j) & 7 of {b:a}; the selector's bit 3
/// of each nibble must be 0.
KVQ_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, s);
#else
  const uint64_t ab = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int j = 0; j < 4; ++j) r |= static_cast<uint32_t>((ab >> (8 * ((s >> (4 * j)) & 7))) & 0xff) << (8 * j);
  return r;
#endif
}

/// (a & b) ^ c with constant b and c in one LOP3 (the compiler splits the C++ form into two instructions).
template <uint32_t b, uint32_t c>
KVQ_HD uint32_t and_xor(uint32_t a) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(d) : "r"(a), "n"(b), "n"(c));
  return d;
#else
  return (a & b) ^ c;
#endif
}
/// (a & b) | c with constant b and c in one LOP3.
template <uint32_t b, uint32_t c>
KVQ_HD uint32_t and_or(uint32_t a) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(a), "n"(b), "n"(c));
  return d;
#else
  return (a & b) | c;
#endif
}

/// 2^x, fast (MUFU.EX2; inputs below -126 flush to 0, as the softmax wants).
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

KVQ_HD uint32_t rotl(uint32_t x, int n) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_l(x, x, static_cast<unsigned>(n));
#else
  return n == 0 ? x : (x << n) | (x >> (32 - n));
#endif
}

KVQ_HD __half2 as_h2(uint32_t w) {
  __half2_raw r;
  r.x = static_cast<unsigned short>(w & 0xffff);
  r.y = static_cast<unsigned short>(w >> 16);
  return __half2(r);
}
KVQ_HD uint32_t h2_bits(__half2 h) {
  const __half2_raw r = h;
  return static_cast<uint32_t>(r.x) | static_cast<uint32_t>(r.y) << 16;
}
KVQ_HD uint32_t bf2_bits(__nv_bfloat162 h) {
  const __nv_bfloat162_raw r = h;
  return static_cast<uint32_t>(r.x) | static_cast<uint32_t>(r.y) << 16;
}
KVQ_HD __nv_bfloat162 as_bf2(uint32_t w) {
  __nv_bfloat162_raw r;
  r.x = static_cast<unsigned short>(w & 0xffff);
  r.y = static_cast<unsigned short>(w >> 16);
  return __nv_bfloat162(r);
}

// Packed fp16 pairs in 32-bit words; the device paths are single PTX instructions on the words.
KVQ_HD float2 h2_to_float2(uint32_t w) {
#if defined(__CUDA_ARCH__)
  float lo, hi;
  asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}"
      : "=f"(lo), "=f"(hi)
      : "r"(w));
  return make_float2(lo, hi);
#else
  return __half22float2(as_h2(w));
#endif
}
/// The fp16 in the low (hi = false) or high half of w as fp32.
KVQ_HD float half_to_float(uint32_t w, bool high) {
#if defined(__CUDA_ARCH__)
  float f;
  if (high)
    asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %1;\n cvt.f32.f16 %0, h;\n}" : "=f"(f) : "r"(w));
  else
    asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %1;\n cvt.f32.f16 %0, l;\n}" : "=f"(f) : "r"(w));
  return f;
#else
  const float2 f = __half22float2(as_h2(w));
  return high ? f.y : f.x;
#endif
}
KVQ_HD uint32_t float2_to_h2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t w;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  return w;
#else
  return h2_bits(__floats2half2_rn(lo, hi));
#endif
}

/// a * b + c, a - b, a * b on packed fp16 pairs (one rounding; the host emulation rounds once from fp32).
KVQ_HD uint32_t h2_fma(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  const float2 x = h2_to_float2(a), y = h2_to_float2(b), z = h2_to_float2(c);
  return float2_to_h2(x.x * y.x + z.x, x.y * y.y + z.y);
#endif
}
KVQ_HD uint32_t h2_sub(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return h2_bits(__hsub2(as_h2(a), as_h2(b)));
#endif
}
KVQ_HD uint32_t h2_mul(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return h2_bits(__hmul2(as_h2(a), as_h2(b)));
#endif
}

/// Per 16-bit half, the larger of |a| and |b| as fp16 (sign bits cleared; not NaN): max.f16x2 on the device, the
/// bits' integer order (that of non-negative fp16) on the host.
KVQ_HD uint32_t h2_abs_max(uint32_t a, uint32_t b) {
  a &= 0x7FFF7FFFu;
  b &= 0x7FFF7FFFu;
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  const uint32_t lo = (a & 0xffffu) > (b & 0xffffu) ? a & 0xffffu : b & 0xffffu;
  return ((a >> 16) > (b >> 16) ? a & 0xffff0000u : b & 0xffff0000u) | lo;
#endif
}

/// The bits of an fp32.
KVQ_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

/// Two fp32 operands as (hi, lo) 16-bit pairs with hi + lo = x to about 2^-22 relative: the hi word holds
/// {hi(x0), hi(x1)}, the lo word {lo(x0), lo(x1)} (fp16 or bf16 by kBf16).
template <bool kBf16>
KVQ_HD void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  if constexpr (kBf16) {
#if defined(__CUDA_ARCH__)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(x1), "f"(x0));
    const float b0 = __uint_as_float(hi << 16), b1 = __uint_as_float(hi & 0xffff0000u);
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(x1 - b1), "f"(x0 - b0));
#else
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 back = __bfloat1622float2(h);
    hi = bf2_bits(h);
    lo = bf2_bits(__floats2bfloat162_rn(x0 - back.x, x1 - back.y));
#endif
  } else {
    hi = float2_to_h2(x0, x1);
    const float2 back = h2_to_float2(hi);
    lo = float2_to_h2(x0 - back.x, x1 - back.y);
  }
}

/// The A fragment word quadruple of one lane from the four fp32 values at k = 2i, 2i+1, 2i+8, 2i+9 of its row n:
/// rows n (hi parts) and n + 8 (lo parts), so that C rows n and n + 8 sum to the fp32-accurate product.
template <bool kBf16>
KVQ_HD uint4 split_fragment(float x0, float x1, float x2, float x3) {
  uint4 a;
  split_pair<kBf16>(x0, x1, a.x, a.y);
  split_pair<kBf16>(x2, x3, a.z, a.w);
  return a;
}

#if defined(__CUDACC__)
/// C = A B (no accumulator input), mma.m16n8k16 with fp32 results, fp16 or bf16 operands.
template <bool kBf16>
__device__ __forceinline__ void mma_first(float (&c)[4], const uint4& a, uint32_t b0, uint32_t b1) {
  const float z = 0;
  if constexpr (kBf16)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "f"(z));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "f"(z));
}

/// C += A B, mma.m16n8k16 with fp32 accumulators, fp16 or bf16 operands.
template <bool kBf16>
__device__ __forceinline__ void mma(float (&c)[4], const uint4& a, uint32_t b0, uint32_t b1) {
  if constexpr (kBf16)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

/// C = A B (no accumulator input), mma.m16n8k32 with signed 8-bit operands and int32 results (exact). Fragments
/// for lane = 4 n + i, each word 4 bytes with the lower k in the low byte:
///   A (16 x 32): A[n][4i..4i+3], A[n+8][4i..4i+3], A[n][4i+16..4i+19], A[n+8][4i+16..4i+19]
///   B (32 x 8):  B[4i..4i+3][n], B[4i+16..4i+19][n]
///   C (16 x 8):  as mma.m16n8k16's: C[n][2i], C[n][2i+1], C[n+8][2i], C[n+8][2i+1]
__device__ __forceinline__ void imma_first(int (&c)[4], const uint4& a, uint32_t b0, uint32_t b1) {
  const int z = 0;
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "r"(z));
}

/// C += A B, mma.m16n8k32 with signed 8-bit operands and int32 accumulators.
__device__ __forceinline__ void imma(int (&c)[4], const uint4& a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

/// ldmatrix.x4.trans: lane l gives the shared address of row l % 8 of 8 x 8 matrix l / 8 (16 bytes of 16-bit
/// elements); lane (n, i) receives {M[2i][n], M[2i+1][n]} of each matrix: B fragments of row-major [k][n] tiles.
__device__ __forceinline__ void ldmatrix_x4_trans(const void* row, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(s));
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Bulk copies (the copy engine) completing on an mbarrier: one lane arms the barrier with the bytes to expect and
// issues the copies; every lane waits on the barrier's phase.
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n .reg .pred done;\n wait%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra wait%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(phase)
      : "memory");
}
/// Orders this thread's earlier shared-memory reads before later bulk copies into the same bytes.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/// ldmatrix.x2.trans: lanes 0..15 give the rows of two matrices, as ldmatrix_x4_trans.
__device__ __forceinline__ void ldmatrix_x2_trans(const void* row, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(smem_addr(row)));
}

/// 16-byte asynchronous copy global -> shared through L1 (.ca), where the lanes' 16-byte requests of one sector
/// merge (bypassing L1, each went to L2 on its own: twice the L2 requests of the bytes).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
/// The same around L1 (.cg), for data read once (the append kernels' tokens).
__device__ __forceinline__ void cp_async16_cg(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

}  // namespace kvq::cuda::detail
