// Rows of ggml blocks built field by field from the published format descriptions (the encode side, written in the
// tests), with the values they must decode to: shared by the format tests and the integer kernel tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "core/half.hpp"
#include "kvq/detail/ggml_quants.hpp"
#include "kvq/detail/random.hpp"

namespace kvq::test {

using namespace ggml;

// A row of encoded blocks, the values it must decode to, and per element a bound on the parts that a kernel may
// compute apart before they cancel: |scale x code| + |offset| (e.g. Q4_1's d q and m).
struct EncodedRow {
  std::vector<uint8_t> bytes;
  std::vector<double> expected;
  std::vector<double> magnitude;
};

inline int uniform_int(Rng& rng, int lo, int hi) {  // inclusive
  return lo + static_cast<int>(rng.next_u64() % static_cast<uint64_t>(hi - lo + 1));
}

// An fp16 scale drawn from a realistic range, returned as stored bits and as the value they hold.
inline uint16_t random_half(Rng& rng, double lo, double hi, double* value) {
  const uint16_t h = f32_to_f16(static_cast<float>(lo + (hi - lo) * rng.uniform()));
  *value = f16_to_f32(h);
  return h;
}

inline void set_nibble(uint8_t* bytes, int byte, bool high, int v) {
  bytes[byte] = static_cast<uint8_t>(high ? (bytes[byte] & 0x0F) | (v << 4) : (bytes[byte] & 0xF0) | v);
}

template <class Block>
inline void append(EncodedRow& row, const Block& b) {
  const size_t at = row.bytes.size();
  row.bytes.resize(at + sizeof b);
  std::memcpy(row.bytes.data() + at, &b, sizeof b);
}

// Q4_0 / Q4_1 / Q5_0 / Q5_1: element i < 16 is the low nibble of qs[i], element i >= 16 the high nibble of
// qs[i-16]; the 5-bit formats keep bit 4 of element i in bit i of qh.
inline void encode_simple(Rng& rng, GgmlType type, EncodedRow& row) {
  const bool five = type == GgmlType::Q5_0 || type == GgmlType::Q5_1;
  const bool with_min = type == GgmlType::Q4_1 || type == GgmlType::Q5_1;
  double d, m = 0;
  const uint16_t dh = random_half(rng, -0.05, 0.05, &d);
  const uint16_t mh = with_min ? random_half(rng, -1.0, 1.0, &m) : 0;
  uint8_t qs[16] = {};
  uint32_t qh = 0;
  for (int i = 0; i < QK; ++i) {
    const int q = uniform_int(rng, 0, five ? 31 : 15);
    set_nibble(qs, i % 16, i >= 16, q & 15);
    if (five) qh |= static_cast<uint32_t>(q >> 4) << i;
    const int offset = with_min ? 0 : (five ? 16 : 8);
    row.expected.push_back((q - offset) * d + m);
    row.magnitude.push_back(std::abs(q * d) + std::abs(offset * d) + std::abs(m));
  }
  uint8_t qh_bytes[4];
  std::memcpy(qh_bytes, &qh, 4);  // little-endian host
  switch (type) {
    case GgmlType::Q4_0: { BlockQ4_0 b{dh, {}}; std::memcpy(b.qs, qs, 16); append(row, b); break; }
    case GgmlType::Q4_1: { BlockQ4_1 b{dh, mh, {}}; std::memcpy(b.qs, qs, 16); append(row, b); break; }
    case GgmlType::Q5_0: {
      BlockQ5_0 b{dh, {}, {}};
      std::memcpy(b.qh, qh_bytes, 4);
      std::memcpy(b.qs, qs, 16);
      append(row, b);
      break;
    }
    case GgmlType::Q5_1: {
      BlockQ5_1 b{dh, mh, {}, {}};
      std::memcpy(b.qh, qh_bytes, 4);
      std::memcpy(b.qs, qs, 16);
      append(row, b);
      break;
    }
    default: FAIL();
  }
}

inline void encode_q8_0(Rng& rng, EncodedRow& row) {
  BlockQ8_0 b{};
  double d;
  b.d = random_half(rng, -0.02, 0.02, &d);
  for (int i = 0; i < QK; ++i) {
    b.qs[i] = static_cast<int8_t>(uniform_int(rng, -128, 127));
    row.expected.push_back(b.qs[i] * d);
    row.magnitude.push_back(std::abs(b.qs[i] * d));
  }
  append(row, b);
}

// The 12 scale bytes of Q4_K / Q5_K: 6-bit scales sc[0..7] and mins m[0..7]. Bytes 0..3 hold sc[0..3] in their
// low 6 bits and the top 2 bits of sc[4..7] in bits 6..7; bytes 4..7 hold m[0..3] and the top 2 bits of m[4..7];
// bytes 8..11 hold the low 4 bits of sc[4..7] (low nibble) and of m[4..7] (high nibble).
inline void pack_k4_scales(const int* sc, const int* m, uint8_t* scales) {
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

// Q4_K / Q5_K: element i lies in sub-block s = i / 32; sub-blocks 2c and 2c+1 share bytes qs[32c..32c+31] (low
// and high nibbles); Q5_K's bit 4 of element i is bit s of qh[i % 32]. x = d sc[s] q - dmin m[s].
inline void encode_k4(Rng& rng, bool five, EncodedRow& row) {
  int sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = uniform_int(rng, 0, 63);
    m[s] = uniform_int(rng, 0, 63);
  }
  double d, dmin;
  const uint16_t dh = random_half(rng, 0.0, 0.003, &d), dminh = random_half(rng, 0.0, 0.003, &dmin);
  uint8_t scales[12], qs[128] = {}, qh[32] = {};
  pack_k4_scales(sc, m, scales);
  for (int i = 0; i < QK_K; ++i) {
    const int s = i / 32, q = uniform_int(rng, 0, five ? 31 : 15);
    set_nibble(qs, 32 * (s / 2) + i % 32, s % 2 == 1, q & 15);
    if (five) qh[i % 32] = static_cast<uint8_t>(qh[i % 32] | ((q >> 4) << s));
    row.expected.push_back(d * sc[s] * q - dmin * m[s]);
    row.magnitude.push_back(std::abs(d * sc[s] * q) + std::abs(dmin * m[s]));
  }
  if (five) {
    BlockQ5_K b{dh, dminh, {}, {}, {}};
    std::memcpy(b.scales, scales, 12);
    std::memcpy(b.qh, qh, 32);
    std::memcpy(b.qs, qs, 128);
    append(row, b);
  } else {
    BlockQ4_K b{dh, dminh, {}, {}};
    std::memcpy(b.scales, scales, 12);
    std::memcpy(b.qs, qs, 128);
    append(row, b);
  }
}

// Q6_K: element i has scale scales[i / 16]; in half h = i / 128, group g = (i % 128) / 32 and lane l = i % 32 its
// low 4 bits are the low (g < 2) or high (g >= 2) nibble of ql[64h + 32(g % 2) + l] and its top 2 bits are bits
// 2g..2g+1 of qh[32h + l]. x = d scales[i / 16] (q - 32).
inline void encode_q6_k(Rng& rng, EncodedRow& row) {
  BlockQ6_K b{};
  double d;
  b.d = random_half(rng, -0.002, 0.002, &d);
  for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(uniform_int(rng, -128, 127));
  for (int i = 0; i < QK_K; ++i) {
    const int q = uniform_int(rng, 0, 63);
    const int h = i / 128, g = (i % 128) / 32, l = i % 32;
    set_nibble(b.ql, 64 * h + 32 * (g % 2) + l, g >= 2, q & 15);
    b.qh[32 * h + l] = static_cast<uint8_t>(b.qh[32 * h + l] | ((q >> 4) << (2 * g)));
    row.expected.push_back(d * b.scales[i / 16] * (q - 32));
    row.magnitude.push_back(std::abs(d * b.scales[i / 16] * (q - 32)));
  }
  append(row, b);
}

inline void encode_scalar(Rng& rng, GgmlType type, EncodedRow& row) {
  const double x = 4.0 * rng.normal();
  if (type == GgmlType::F32) {
    const float f = static_cast<float>(x);
    row.expected.push_back(f);
    row.magnitude.push_back(std::abs(x));
    row.bytes.resize(row.bytes.size() + 4);
    std::memcpy(row.bytes.data() + row.bytes.size() - 4, &f, 4);
    return;
  }
  const uint16_t h = type == GgmlType::F16 ? f32_to_f16(static_cast<float>(x)) : f32_to_bf16(static_cast<float>(x));
  row.expected.push_back(type == GgmlType::F16 ? f16_to_f32(h) : bf16_to_f32(h));
  row.magnitude.push_back(std::abs(row.expected.back()));
  row.bytes.resize(row.bytes.size() + 2);
  std::memcpy(row.bytes.data() + row.bytes.size() - 2, &h, 2);
}

inline EncodedRow encode_row(Rng& rng, GgmlType type, int blocks) {
  EncodedRow row;
  row.bytes.push_back(0);  // the row starts at an odd address: blocks carry no alignment promise
  for (int b = 0; b < blocks; ++b) {
    switch (type) {
      case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
        encode_simple(rng, type, row);
        break;
      case GgmlType::Q8_0: encode_q8_0(rng, row); break;
      case GgmlType::Q4_K: encode_k4(rng, false, row); break;
      case GgmlType::Q5_K: encode_k4(rng, true, row); break;
      case GgmlType::Q6_K: encode_q6_k(rng, row); break;
      default: encode_scalar(rng, type, row); break;
    }
  }
  return row;
}

}  // namespace kvq::test
