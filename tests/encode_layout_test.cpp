// The append kernels' index math (src/cuda/encode_layout.cuh, shared by host and device) against the block layouts
// of src/codec/block_layout.hpp and the bitpack.hpp streams, on the host: every token and channel of several
// shapes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "codec/block_layout.hpp"
#include "core/bitpack.hpp"
#include "cuda/encode_layout.cuh"

namespace kvq::cuda::detail {
namespace {

int log2_of(size_t x) { return FastDiv::of(static_cast<int>(x)).shift; }

TEST(EncodeLayout, FastDivDividesLikeDivision) {
  for (int n : {1, 2, 3, 6, 16, 48, 64, 96, 128}) {
    const FastDiv f = FastDiv::of(n);
    for (int x = 0; x < 1000; ++x) {
      ASSERT_EQ(f.div(x), x / n);
      ASSERT_EQ(f.mod(x), x % n);
    }
  }
}

TEST(EncodeLayout, LaneTilesMatchIntGroupAndKivi) {
  for (size_t d : {16u, 64u, 96u, 128u, 256u})
    for (size_t T : {1u, 17u, 64u, 128u})
      for (size_t bits : {2u, 4u, 8u})
        for (const bool key : {true, false}) {
          const layout::IntGroup l{d, T, bits, 16, key};
          const int lb = log2_of(bits), id = static_cast<int>(d);
          for (size_t t = 0; t < l.code_tokens(); ++t)
            for (size_t c = 0; c < d; ++c) {
              const int it = static_cast<int>(t), ic = static_cast<int>(c);
              const CodePlace p = lane_tile_place(key, id, lb, it, ic);
              ASSERT_EQ(p.byte, l.code_byte(t, c));
              ASSERT_EQ(p.shift, l.code_shift(t, c));
              ASSERT_EQ(p.width, bits);
              if (c % 16 == 0 && t < T) {
                ASSERT_EQ(l.scales_offset() + int_scale_byte(static_cast<int>(d / 16), it, ic / 16),
                          l.scale_byte(t, c / 16));
              }
              if (bits != 8 && t < T) {
                for (size_t G : {16u, 32u}) {
                  if (d % G != 0) continue;
                  const layout::Kivi k{d, T, bits, G, key};
                  ASSERT_EQ(static_cast<size_t>(kivi_param(key, id, log2_of(G), it, ic)), k.param(t, c));
                  ASSERT_EQ(p.byte, k.code_byte(t, c));
                }
              }
            }
        }
}

// layout::Kivi's code planes (kivi:3: the low two bits in kivi:2's tiles, then the high bit in 1-bit tiles) where
// the kivi encoder writes them (kivi_code_place, kivi_high_plane_offset), over every token of the code tiles.
TEST(EncodeLayout, KiviPlanesMatchKivi) {
  for (size_t d : {16u, 32u, 48u, 64u, 96u, 128u, 256u})
    for (size_t T : {1u, 16u, 17u, 48u, 64u, 128u})
      for (size_t bits : {2u, 3u, 4u})
        for (const bool key : {true, false}) {
          if (bits == 3 && key && d % 32 != 0) continue;  // the codec refuses it
          SCOPED_TRACE("d=" + std::to_string(d) + " T=" + std::to_string(T) + " b=" + std::to_string(bits) +
                       (key ? " keys" : " values"));
          const layout::Kivi k{d, T, bits, 16, key};
          const int id = static_cast<int>(d), iT = static_cast<int>(T), ib = static_cast<int>(bits);
          if (bits == 3) {
            ASSERT_EQ(kivi_high_plane_offset(key, id, iT), k.plane_offset(1));
            ASSERT_EQ(k.plane_offset(1) % 64, 0u);
            ASSERT_LE(k.plane_offset(1) + k.code_tokens() * d / 8, k.mins_offset());
          }
          std::vector<unsigned char> block(k.block_bytes(), 0), mine(k.block_bytes(), 0);
          for (size_t t = 0; t < k.code_tokens(); ++t)
            for (size_t c = 0; c < d; ++c) {
              const int it = static_cast<int>(t), ic = static_cast<int>(c);
              for (size_t p = 0; p < k.planes(); ++p) {
                const layout::IntGroup l = k.plane(p);
                const CodePlace got = kivi_code_place(key, id, iT, ib, static_cast<int>(p), it, ic);
                ASSERT_EQ(got.byte, k.plane_offset(p) + l.code_byte(t, c));
                ASSERT_EQ(got.shift, l.code_shift(t, c));
                ASSERT_EQ(got.width, k.plane_bits(p));
              }
              // a code whose bits differ per place: written through the places, it reads back through the layout
              const unsigned q = static_cast<unsigned>(t * 7 + c * 3) & ((1u << bits) - 1);
              k.write_code(block.data(), t, c, q);
              for (int p = 0, low = 0; p < static_cast<int>(k.planes()); ++p) {
                const CodePlace at = kivi_code_place(key, id, iT, ib, p, it, ic);
                mine[at.byte] |= static_cast<unsigned char>(((q >> low) & ((1u << at.width) - 1)) << at.shift);
                low += static_cast<int>(at.width);
              }
            }
          ASSERT_EQ(block, mine);
          for (size_t t = 0; t < k.code_tokens(); ++t)
            for (size_t c = 0; c < d; ++c)
              ASSERT_EQ(k.read_code(mine.data(), t, c), static_cast<unsigned>(t * 7 + c * 3) & ((1u << bits) - 1));
        }
}

TEST(EncodeLayout, LaneCodesMatchTurboMse) {
  for (size_t d : {32u, 48u, 128u, 256u})
    for (size_t T : {1u, 33u, 64u})
      for (size_t bits = 1; bits <= 4; ++bits)
        for (const bool key : {true, false}) {
          const layout::LaneCodes l{d, T, bits, key};
          for (size_t t = 0; t < T; ++t)
            for (size_t c = 0; c < d; ++c)
              for (size_t p = 0; p < l.parts(); ++p) {
                const auto want = l.place(t, c, p);
                const CodePlace got = lane_codes_place(key, static_cast<int>(d), static_cast<int>(bits),
                                                       static_cast<int>(t), static_cast<int>(c), static_cast<int>(p));
                ASSERT_EQ(got.byte, want.byte);
                ASSERT_EQ(got.shift, want.shift);
                ASSERT_EQ(got.width, want.width);
              }
        }
}

// The int and kivi encoders' code words (lane_tile_items.cuh): a key word holds the 32 >> lb consecutive channels
// of one token from a channel that is a multiple of 32 >> lb, a value word the 32 >> lb consecutive tokens of one
// channel from such a token, element e at bit e 2^lb (lb = 0, kivi:3's high bits: the encoder fills a value word's
// 16-bit halves, tokens 16 apart, so that tokens t0 .. t0 + 15 of a half start at an even byte, shift 0).
TEST(EncodeLayout, LaneTileWordsHoldConsecutiveChannelsOrTokens) {
  for (const int d : {16, 48, 64, 128, 256})
    for (const int lb : {0, 1, 2, 3})  // lb = 0: kivi:3's high bits
      for (const bool key : {true, false}) {
        if (lb == 0 && key && d % 32 != 0) continue;  // kivi:3 keys: d a multiple of 32
        const int W = 32 >> lb;
        for (int t = 0; t < 128; t += key ? 1 : W)
          for (int c = 0; c < d; c += key ? W : 1) {
            const CodePlace first = lane_tile_place(key, d, lb, t, c);
            ASSERT_EQ(first.byte % 4, 0u);
            if (lb == 0 && !key) {
              const CodePlace half = lane_tile_place(key, d, lb, t + 16, c);
              ASSERT_EQ(half.byte, first.byte + 2);
              ASSERT_EQ(half.shift, 0u);
            }
            for (int e = 0; e < W; ++e) {
              const CodePlace p = lane_tile_place(key, d, lb, key ? t : t + e, key ? c + e : c);
              ASSERT_EQ(p.byte / 4, first.byte / 4);
              ASSERT_EQ(8 * (p.byte % 4) + p.shift, static_cast<uint32_t>(e << lb));
            }
          }
      }
}

// Every slot of every group (lane_codes_group / lane_codes_slot, what the turbo_mse encoder builds its words from)
// lies where layout::LaneCodes places that part of that index, and covers every (token, channel, part) once.
TEST(EncodeLayout, LaneCodeGroupsInvertThePlaces) {
  for (size_t d : {32u, 48u, 128u, 256u})
    for (size_t T : {1u, 33u, 64u})
      for (size_t bits = 1; bits <= 4; ++bits)
        for (const bool key : {true, false}) {
          SCOPED_TRACE("d=" + std::to_string(d) + " T=" + std::to_string(T) + " b=" + std::to_string(bits) +
                       (key ? " keys" : " values"));
          const layout::LaneCodes l{d, T, bits, key};
          std::vector<int> hits(T * d * l.parts(), 0);
          const int bi = static_cast<int>(bits), groups = static_cast<int>(l.bytes() / 4) / (16 * bi);
          ASSERT_EQ(static_cast<size_t>(groups) * 16 * bits * 4, l.bytes());
          const FastDiv per_row = FastDiv::of(lane_codes_groups_per_row(key, static_cast<int>(d)));
          for (int g = 0; g < groups; ++g)
            for (int lane = 0; lane < 16; ++lane) {
              const LaneCodesGroup at = lane_codes_group(key, per_row, g, lane);
              for (int e = 0; e < 32; ++e) {
                const size_t t = static_cast<size_t>(key ? at.t0 : at.t0 + e);
                const size_t c = static_cast<size_t>(key ? at.c0 + e : at.c0);
                if (t >= T || c >= d) continue;  // padding
                const LaneCodesSlot slot = lane_codes_slot(bi, e);
                for (size_t part = 0; part < l.parts(); ++part) {
                  const int sub = part == 0 ? slot.sub : 2, shift = part == 0 ? slot.shift : slot.high_shift;
                  const int width = part == 0 ? slot.width : 1;
                  const size_t word = static_cast<size_t>(16 * (bi * g + sub) + lane);
                  const auto want = l.place(t, c, part);
                  ASSERT_EQ(8 * want.byte + want.shift, 32 * word + static_cast<size_t>(shift))
                      << "group " << g << " lane " << lane << " e " << e << " part " << part;
                  ASSERT_EQ(want.width, static_cast<unsigned>(width));
                  ++hits[(t * d + c) * l.parts() + part];
                }
              }
            }
          for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "element " << i;
        }
}

// Words packed by lane_codes_put (as the turbo_mse encoder's values do) hold the bytes that packing every index at
// layout::LaneCodes::place gives, padding zero.
TEST(EncodeLayout, LaneCodeGroupsPackLikeTheLayout) {
  uint32_t state = 12345;
  for (size_t d : {32u, 48u, 128u})
    for (size_t T : {33u, 64u})
      for (size_t bits = 1; bits <= 4; ++bits)
        for (const bool key : {true, false}) {
          const layout::LaneCodes l{d, T, bits, key};
          std::vector<uint32_t> idx(T * d);
          for (uint32_t& x : idx) x = (state = state * 1664525u + 1013904223u) >> (32 - bits);
          std::vector<uint8_t> want(l.bytes(), 0);
          for (size_t t = 0; t < T; ++t)
            for (size_t c = 0; c < d; ++c) {
              uint32_t v = idx[t * d + c];
              for (size_t p = 0; p < l.parts(); ++p) {
                const auto at = l.place(t, c, p);
                want[at.byte] = static_cast<uint8_t>(want[at.byte] | (v & ((1u << at.width) - 1)) << at.shift);
                v >>= at.width;
              }
            }
          const int bi = static_cast<int>(bits), groups = static_cast<int>(l.bytes() / 4) / (16 * bi);
          const FastDiv per_row = FastDiv::of(lane_codes_groups_per_row(key, static_cast<int>(d)));
          std::vector<uint8_t> got(l.bytes());
          for (int g = 0; g < groups; ++g)
            for (int lane = 0; lane < 16; ++lane) {
              const LaneCodesGroup at = lane_codes_group(key, per_row, g, lane);
              uint32_t words[4] = {};
              for (int e = 0; e < 32; ++e) {
                const size_t t = static_cast<size_t>(key ? at.t0 : at.t0 + e);
                const size_t c = static_cast<size_t>(key ? at.c0 + e : at.c0);
                if (t >= T || c >= d) continue;
                switch (bi) {
                  case 1: lane_codes_put<1>(reinterpret_cast<uint32_t(&)[1]>(words), e, idx[t * d + c]); break;
                  case 2: lane_codes_put<2>(reinterpret_cast<uint32_t(&)[2]>(words), e, idx[t * d + c]); break;
                  case 3: lane_codes_put<3>(reinterpret_cast<uint32_t(&)[3]>(words), e, idx[t * d + c]); break;
                  default: lane_codes_put<4>(words, e, idx[t * d + c]); break;
                }
              }
              for (int sub = 0; sub < bi; ++sub)  // little-endian, as the device stores it
                std::memcpy(&got[4 * static_cast<size_t>(16 * (bi * g + sub) + lane)], &words[sub], 4);
            }
          ASSERT_EQ(got, want) << "d=" << d << " T=" << T << " b=" << bits << (key ? " keys" : " values");
        }
}

TEST(EncodeLayout, SignTilesMatchQjlAndTurboProd) {
  for (size_t m : {8u, 24u, 64u, 128u, 136u, 256u})
    for (size_t T : {1u, 17u, 33u, 64u, 128u})
      for (const bool key : {true, false}) {
        const layout::SignTiles l{m, T, key};
        for (size_t t = 0; t < T; ++t)
          for (size_t r = 0; r < m; ++r) {
            const CodePlace got = sign_tiles_place(key, static_cast<int>(m), static_cast<int>(t), static_cast<int>(r));
            ASSERT_EQ(got.byte, l.byte(t, r)) << "m=" << m << " T=" << T << " key=" << key << " t=" << t << " r=" << r;
            ASSERT_EQ(got.shift, l.shift(t, r)) << "m=" << m << " T=" << T << " key=" << key << " t=" << t
                                                << " r=" << r;
            ASSERT_EQ(got.width, 1u);
            ASSERT_LT(got.byte, l.bytes());
          }
      }
}

// Codes OR-ed at stream_code_bit into 32-bit little-endian words, a straddling code split over two words as
// put_stream_bits (stream_bits.cuh) does, give the bytes of pack_bits16 (turbo_rvq's stages, vecinfer's rows).
TEST(EncodeLayout, StreamCodesMatchBitpack) {
  uint32_t state = 12345;
  for (int width = 1; width <= 12; ++width)
    for (size_t n : {8u, 16u, 20u, 32u, 64u})
      for (uint32_t start : {0u, 16u, 48u}) {
        const size_t row_bytes = packed_bytes(n, width), rows = 5;
        std::vector<uint16_t> codes(rows * n);
        for (uint16_t& c : codes) {
          state = state * 1664525u + 1013904223u;
          c = static_cast<uint16_t>((state >> 8) & ((1u << width) - 1));
        }
        std::vector<uint8_t> want(start + rows * row_bytes + 8, 0);
        for (size_t t = 0; t < rows; ++t)
          pack_bits16(codes.data() + t * n, n, width, want.data() + start + t * row_bytes);
        std::vector<uint32_t> words((want.size() + 3) / 4, 0);
        for (size_t t = 0; t < rows; ++t)
          for (size_t j = 0; j < n; ++j) {
            const uint32_t bit = stream_code_bit(start, static_cast<uint32_t>(row_bytes), static_cast<int>(t),
                                                 static_cast<int>(j), width);
            const uint32_t value = codes[t * n + j], w = bit / 32, shift = bit % 32;
            words[w] |= value << shift;
            if (shift + static_cast<uint32_t>(width) > 32) words[w + 1] |= value >> (32 - shift);
          }
        std::vector<uint8_t> got(want.size());
        for (size_t i = 0; i < got.size(); ++i) got[i] = static_cast<uint8_t>(words[i / 4] >> (8 * (i % 4)));
        ASSERT_EQ(got, want) << "width " << width << ", " << n << " codes a row, stream at byte " << start;
      }
}

TEST(EncodeLayout, ErrorPositionsOrderByToken) {
  EXPECT_LT(error_position(3, 7, 100), error_position(4, 0, 0));
  EXPECT_LT(error_position(3, 1, 100), error_position(3, 2, 0));
  EXPECT_EQ(error_position(5, 1, 7) >> 32, 5u);
  EXPECT_LT(error_position(size_t{1} << 30, 65535, 65535), kNoError);
}

}  // namespace
}  // namespace kvq::cuda::detail
