// The ggml tensor formats that GGUF files store, as block structs with their reconstruction formulas, and the
// two operations the model runner needs on them: a row to fp32, and the dot product of a row with fp32 values.
//
// Every quantized format stores consecutive runs of QK elements (a "block", 32 or 256) along a row. Multi-byte
// fields are little-endian; fp16 fields hold IEEE binary16 bits. Blocks are read with std::memcpy (rows in a
// file carry no alignment promise beyond the tensor's start).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvq {

/// ggml's tensor type ids (append-only numbers fixed by the GGUF format).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
};

namespace ggml {

constexpr int QK = 32;     ///< elements per block of the simple formats
constexpr int QK_K = 256;  ///< elements per super-block of the k-quants

/// 4.5 bits/element. x[j] = (lo(qs[j]) - 8) d, x[j+16] = (hi(qs[j]) - 8) d for j < 16.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[QK / 2];
};
/// 5 bits/element. x[j] = lo(qs[j]) d + m, x[j+16] = hi(qs[j]) d + m.
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[QK / 2];
};
/// 5.5 bits/element. The 5th bit of element i is bit i of qh (little-endian uint32):
/// x[j] = ((lo(qs[j]) | bit(j) << 4) - 16) d, x[j+16] = ((hi(qs[j]) | bit(j+16) << 4) - 16) d.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[QK / 2];
};
/// 6 bits/element. As Q5_0 without the -16, plus m: x = q d + m.
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[QK / 2];
};
/// 8.5 bits/element. x[j] = qs[j] d.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[QK];
};
/// 4.5 bits/element. Eight sub-blocks of 32 with 6-bit scale sc_s and min m_s packed in `scales` (see
/// scale_min_k4). Sub-block pairs (2c, 2c+1) share the 32 bytes qs[32c .. 32c+31]: low nibbles are sub-block 2c,
/// high nibbles 2c+1. x = d sc_s q - dmin m_s.
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[QK_K / 2];
};
/// 5.5 bits/element. Q4_K plus a 5th bit: bit s of qh[l] belongs to element l of sub-block s (l < 32).
/// x = d sc_s (q + 16 bit) - dmin m_s.
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};
/// 6.5625 bits/element. Sixteen sub-blocks of 16 with int8 scales; 6-bit q = low 4 bits from ql, high 2 bits
/// from qh; x = d scales[s] (q - 32). Within each half of 128 elements (ql += 64, qh += 32, scales += 8), for
/// l < 32: element l       = lo(ql[l])    | ((qh[l] >> 0) & 3) << 4
///         element l + 32  = lo(ql[l+32]) | ((qh[l] >> 2) & 3) << 4
///         element l + 64  = hi(ql[l])    | ((qh[l] >> 4) & 3) << 4
///         element l + 96  = hi(ql[l+32]) | ((qh[l] >> 6) & 3) << 4
struct BlockQ6_K {
  uint8_t ql[QK_K / 2];
  uint8_t qh[QK_K / 4];
  int8_t scales[QK_K / 16];
  uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

/// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block: sub-blocks 0..3 use the low 6 bits
/// of bytes j and j+4; sub-blocks 4..7 take their low 4 bits from byte j+4 (scale: low nibble, min: high nibble)
/// and their high 2 bits from the top bits of bytes j-4 (scale) and j (min).
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace ggml

/// What kvq knows of a ggml type: its block shape, and whether it can compute with it.
struct GgmlTypeTraits {
  std::string_view name;
  int block_size;      ///< elements per block
  size_t block_bytes;  ///< bytes per block
  bool computable;     ///< dequantize_row and dot_row accept it
};

/// The traits of `type`, or nullptr for an id kvq does not know.
const GgmlTypeTraits* ggml_type_traits(GgmlType type);
/// The traits of a known type (kvq::Error naming the id otherwise).
const GgmlTypeTraits& ggml_traits(GgmlType type);
/// Bytes of a row of n elements; kvq::Error when n is not a multiple of the block size.
size_t ggml_row_bytes(GgmlType type, int64_t n);

/// Converts a row of n elements (n a multiple of the block size) to fp32. row: ggml_row_bytes(type, n) bytes;
/// out: n floats.
void dequantize_row(GgmlType type, const void* row, float* out, int64_t n);

/// sum_i row[i] x[i] over a row of n elements stored as `type`. row: ggml_row_bytes(type, n) bytes; x: n floats.
float dot_row(GgmlType type, const void* row, const float* x, int64_t n);

}  // namespace kvq
