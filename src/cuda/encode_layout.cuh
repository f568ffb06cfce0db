// Where the append kernels write each code of a block: the index math of include/kvq/block_layout.hpp, written once
// for host and device (block_layout.hpp's constexpr members are host functions). tests/encode_layout_test.cpp checks
// these against block_layout.hpp on the host.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define KVQ_ENCODE_HD __host__ __device__ __forceinline__
#else
#define KVQ_ENCODE_HD inline
#endif

namespace kvq::cuda::detail {

/// A field of a block: `width` bits at bit `shift` of byte `byte`.
struct CodePlace {
  uint32_t byte;
  uint32_t shift, width;
};

/// layout::IntGroup / layout::Kivi codes (the same 64-byte lane tiles): token t, channel c of a `bits`-bit code.
KVQ_ENCODE_HD CodePlace lane_tile_place(bool key, int d, int bits, int t, int c) {
  const int E = 32 / bits;
  const int byte = key ? 64 * (t / 16 * (d / E) + c / E) + 4 * (t % 16) + c % E * bits / 8
                       : 64 * (t / E * (d / 16) + c / 16) + 4 * (c % 16) + t % E * bits / 8;
  const int shift = (key ? c : t) % E * bits % 8;
  return {static_cast<uint32_t>(byte), static_cast<uint32_t>(shift), static_cast<uint32_t>(bits)};
}

/// layout::IntGroup::scale_byte relative to the scales section: token t, group g of `groups` per token.
KVQ_ENCODE_HD uint32_t int_scale_byte(int groups, int t, int g) {
  return static_cast<uint32_t>(2 * ((t / 16 * groups + g) * 16 + t % 16));
}

/// layout::Kivi::param: the (min, scale) pair of token t, channel c.
KVQ_ENCODE_HD int kivi_param(bool key, int d, int G, int t, int c) {
  return key ? c : (t / 16 * (d / G) + c / G) * 16 + t % 16;
}

/// layout::LaneCodes::place: part p of the b-bit index of token t, channel c.
KVQ_ENCODE_HD CodePlace lane_codes_place(bool key, int d, int bits, int t, int c, int part) {
  const int code_channels = key ? (d + 31) / 32 * 32 : d;
  const int lane = key ? t % 16 : c % 16, e = key ? c % 32 : t % 32, v = e / 8, j = e % 8;
  int tile = key ? bits * (t / 16 * (code_channels / 32) + c / 32) : bits * (t / 32 * (d / 16) + c / 16);
  int bit = 0, width = 0;
  if (bits == 4) {
    tile += v, bit = 4 * j, width = 4;
  } else if (bits != 1 && part == 0) {
    tile += v / 2, bit = 2 * (2 * j + v % 2), width = 2;
  } else {
    tile += bits - 1, bit = 4 * j + (v + 2) % 4, width = 1;
  }
  return {static_cast<uint32_t>(64 * tile + 4 * lane + bit / 8), static_cast<uint32_t>(bit % 8),
          static_cast<uint32_t>(width)};
}

/// The stream position of an encoding error (atomicMin keeps the first): token, kv head, channel.
KVQ_ENCODE_HD unsigned long long error_position(size_t token, int head, int channel) {
  return static_cast<unsigned long long>(token) << 32 | static_cast<unsigned long long>(head) << 16 |
         static_cast<unsigned long long>(channel);
}
constexpr unsigned long long kNoError = ~0ull;

}  // namespace kvq::cuda::detail
