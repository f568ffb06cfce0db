// Where the append kernels write each code of a block: the index math of src/codec/block_layout.hpp, written once
// for host and device (block_layout.hpp's constexpr members are host functions), with shifts where the layouts'
// sizes are powers of two. tests/encode_layout_test.cpp checks these against block_layout.hpp on the host.
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

/// Division by a run-time divisor, a shift where it is a power of two (the usual case: d, groups, tiles per row).
struct FastDiv {
  int n = 1, shift = 0;  // shift < 0: not a power of two
  KVQ_ENCODE_HD static FastDiv of(int n) {
    FastDiv f{n, -1};
    if (n > 0 && (n & (n - 1)) == 0) {
      f.shift = 0;
      while ((1 << f.shift) < n) ++f.shift;
    }
    return f;
  }
  KVQ_ENCODE_HD int div(int x) const { return shift >= 0 ? x >> shift : x / n; }
  KVQ_ENCODE_HD int mod(int x) const { return shift >= 0 ? x & (n - 1) : x % n; }
};

/// layout::IntGroup / layout::Kivi codes (the same 64-byte lane tiles): token t, channel c of a code of 2^lb bits
/// (E = 32 >> lb codes a 32-bit lane).
KVQ_ENCODE_HD CodePlace lane_tile_place(bool key, int d, int lb, int t, int c) {
  const int le = 5 - lb, E = 1 << le, bits = 1 << lb;
  const int byte = key ? 64 * ((t >> 4) * (d >> le) + (c >> le)) + 4 * (t & 15) + ((c & (E - 1)) << lb) / 8
                       : 64 * ((t >> le) * (d >> 4) + (c >> 4)) + 4 * (c & 15) + ((t & (E - 1)) << lb) / 8;
  const int shift = (((key ? c : t) & (E - 1)) << lb) % 8;
  return {static_cast<uint32_t>(byte), static_cast<uint32_t>(shift), static_cast<uint32_t>(bits)};
}

/// layout::Kivi::plane_offset(1): the byte where kivi:3's second code plane (the high bits, 1-bit codes) starts,
/// after the first (the low two bits as kivi:2's codes), both covering T rounded up to 16 (keys) or 32 (values).
KVQ_ENCODE_HD uint32_t kivi_high_plane_offset(bool key, int d, int T) {
  const int tokens = key ? (T + 15) / 16 * 16 : (T + 31) / 32 * 32;
  return static_cast<uint32_t>(tokens * d / 4);
}

/// layout::Kivi's codes of `bits` bits (2, 3 or 4): where plane `plane` of the code of token t, channel c lies (b =
/// 2, 4: plane 0, the whole code; b = 3: plane 0 its low two bits, plane 1 its high bit).
KVQ_ENCODE_HD CodePlace kivi_code_place(bool key, int d, int T, int bits, int plane, int t, int c) {
  if (bits != 3) return lane_tile_place(key, d, bits == 2 ? 1 : 2, t, c);
  CodePlace p = lane_tile_place(key, d, plane == 0 ? 1 : 0, t, c);
  if (plane != 0) p.byte += kivi_high_plane_offset(key, d, T);
  return p;
}

/// layout::IntGroup::scale_byte relative to the scales section: token t, group g of `groups` per token.
KVQ_ENCODE_HD uint32_t int_scale_byte(int groups, int t, int g) {
  return static_cast<uint32_t>(2 * (((t >> 4) * groups + g) * 16 + (t & 15)));
}

/// layout::Kivi::param: the (min, scale) pair of token t, channel c, value groups of 2^lg channels.
KVQ_ENCODE_HD int kivi_param(bool key, int d, int lg, int t, int c) {
  return key ? c : ((t >> 4) * (d >> lg) + (c >> lg)) * 16 + (t & 15);
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

/// The inverse of lane_codes_place for whole groups: a group of layout::LaneCodes is `bits` tiles of 16 lanes (word
/// w = 16 (bits g + sub) + lane), and lane `lane` of group g holds, in its `bits` words, the indices of 32 consecutive
/// channels c0 + e of token t0 (keys) or of 32 consecutive tokens t0 + e of channel c0 (values), e = 0..31.
struct LaneCodesGroup {
  int t0, c0;
};
/// Groups per row of groups: of 16 tokens x 32 code channels (keys: d rounded up to 32), of 32 tokens x 16 channels
/// (values).
KVQ_ENCODE_HD int lane_codes_groups_per_row(bool key, int d) { return key ? (d + 31) / 32 : d / 16; }
/// `per_row`: division by lane_codes_groups_per_row.
KVQ_ENCODE_HD LaneCodesGroup lane_codes_group(bool key, const FastDiv& per_row, int g, int lane) {
  const int row = per_row.div(g), column = per_row.mod(g);
  return key ? LaneCodesGroup{16 * row + lane, 32 * column} : LaneCodesGroup{32 * row, 16 * column + lane};
}

/// Where element e of a lane's group lies in its words: the index's low `width` bits in word `sub` at bit `shift`
/// (b = 4: nibble j of word v; b = 2 and b = 3's low bits: field 2 j + v % 2 of word v / 2; b = 1: bit 4 j + (v + 2)
/// % 4, with v = e / 8, j = e % 8), and b = 3's high bit in word 2 at bit `high_shift` (b = 1's place).
struct LaneCodesSlot {
  int sub, shift, width, high_shift;
};
KVQ_ENCODE_HD LaneCodesSlot lane_codes_slot(int bits, int e) {
  const int v = e >> 3, j = e & 7, one_bit = 4 * j + ((v + 2) & 3);
  if (bits == 4) return {v, 4 * j, 4, 0};
  if (bits == 1) return {0, one_bit, 1, 0};
  return {v >> 1, 2 * (2 * j + (v & 1)), 2, one_bit};
}

/// ORs the Bits-bit index of element e into its lane's group of words.
template <int Bits>
KVQ_ENCODE_HD void lane_codes_put(uint32_t (&words)[Bits], int e, uint32_t idx) {
  const LaneCodesSlot s = lane_codes_slot(Bits, e);
  words[s.sub] |= (idx & ((1u << s.width) - 1)) << s.shift;
  if constexpr (Bits == 3) words[2] |= (idx >> 2) << s.high_shift;
}

/// layout::SignTiles: the sign bit of sketch row r of token t, m rows per token (keys: "tokens in lanes", a lane's
/// 32 bits are 32 rows of one token; values: "rows in lanes", a lane's 32 bits are 32 tokens of one row).
KVQ_ENCODE_HD CodePlace sign_tiles_place(bool key, int m, int t, int r) {
  if (key) {
    const int tiles_per_row = (m + 31) / 32;
    return {static_cast<uint32_t>(64 * ((t >> 4) * tiles_per_row + (r >> 5)) + 4 * (t & 15) + ((r & 31) >> 3)),
            static_cast<uint32_t>(r & 7), 1u};
  }
  const int tiles_per_row = (m + 15) / 16;
  return {static_cast<uint32_t>(64 * ((t >> 5) * tiles_per_row + (r >> 4)) + 4 * (r & 15) + ((t & 31) >> 3)),
          static_cast<uint32_t>(t & 7), 1u};
}

/// A bitpack.hpp stream of `width`-bit codes, n per row of `row_bytes` bytes, starting at byte `start`: the block
/// bit (LSB first, bit k of byte k / 8) where code j of row t begins.
KVQ_ENCODE_HD uint32_t stream_code_bit(uint32_t start, uint32_t row_bytes, int t, int j, int width) {
  return 8 * (start + static_cast<uint32_t>(t) * row_bytes) + static_cast<uint32_t>(j * width);
}

/// The stream position of an encoding error (atomicMin keeps the first): token, kv head, channel.
KVQ_ENCODE_HD unsigned long long error_position(size_t token, int head, int channel) {
  return static_cast<unsigned long long>(token) << 32 | static_cast<unsigned long long>(head) << 16 |
         static_cast<unsigned long long>(channel);
}
constexpr unsigned long long kNoError = ~0ull;

}  // namespace kvq::cuda::detail
