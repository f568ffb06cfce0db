// Block decoders for the ggml formats (formulas in include/kvq/detail/ggml_quants.hpp) and row-level dispatch.
#include "kvq/detail/ggml_quants.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include "core/half.hpp"
#include "kvq/error.hpp"
#include "model/ggml_dot_kernels.hpp"

namespace kvq {
namespace {

using namespace ggml;

template <class Block>
Block load_block(const uint8_t* p) {
  Block b;
  std::memcpy(&b, p, sizeof b);  // rows carry no alignment promise
  return b;
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Decodes `count` consecutive elements (the scalar formats have blocks of one element).
void run_f32(const uint8_t* p, float* y, size_t count) { std::memcpy(y, p, count * sizeof(float)); }

void run_f16(const uint8_t* p, float* y, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    y[i] = f16_to_f32(h);
  }
}

void run_bf16(const uint8_t* p, float* y, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    y[i] = bf16_to_f32(h);
  }
}

void block_q4_0(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ4_0>(p);
  const float d = f16_to_f32(b.d);
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = static_cast<float>((b.qs[j] & 0xF) - 8) * d;
    y[j + QK / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
  }
}

void block_q4_1(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ4_1>(p);
  const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = static_cast<float>(b.qs[j] & 0xF) * d + m;
    y[j + QK / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
  }
}

void block_q5_0(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ5_0>(p);
  const float d = f16_to_f32(b.d);
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < QK / 2; ++j) {
    const int lo = static_cast<int>((b.qs[j] & 0xF) | (((qh >> j) & 1u) << 4));
    const int hi = static_cast<int>((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
    y[j] = static_cast<float>(lo - 16) * d;
    y[j + QK / 2] = static_cast<float>(hi - 16) * d;
  }
}

void block_q5_1(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ5_1>(p);
  const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < QK / 2; ++j) {
    const uint32_t lo = (b.qs[j] & 0xFu) | (((qh >> j) & 1u) << 4);
    const uint32_t hi = (b.qs[j] >> 4u) | (((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo) * d + m;
    y[j + QK / 2] = static_cast<float>(hi) * d + m;
  }
}

void block_q8_0(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ8_0>(p);
  const float d = f16_to_f32(b.d);
  for (int j = 0; j < QK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

void block_q4_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ4_K>(p);
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  const uint8_t* q = b.qs;
  for (int chunk = 0; chunk < 4; ++chunk, q += 32, y += 64) {  // 64 elements: sub-blocks 2c (low), 2c+1 (high)
    uint8_t sc, m;
    scale_min_k4(2 * chunk, b.scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(2 * chunk + 1, b.scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) {
      y[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
      y[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void block_q5_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ5_K>(p);
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  const uint8_t* q = b.qs;
  for (int chunk = 0; chunk < 4; ++chunk, q += 32, y += 64) {
    uint8_t sc, m;
    scale_min_k4(2 * chunk, b.scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(2 * chunk + 1, b.scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    const int bit1 = 2 * chunk, bit2 = 2 * chunk + 1;
    for (int l = 0; l < 32; ++l) {
      y[l] = d1 * static_cast<float>((q[l] & 0xF) + (((b.qh[l] >> bit1) & 1) << 4)) - m1;
      y[l + 32] = d2 * static_cast<float>((q[l] >> 4) + (((b.qh[l] >> bit2) & 1) << 4)) - m2;
    }
  }
}

void block_q6_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ6_K>(p);
  const float d = f16_to_f32(b.d);
  const uint8_t* ql = b.ql;
  const uint8_t* qh = b.qh;
  const int8_t* sc = b.scales;
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int s = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[s] * static_cast<float>(q1);
      y[l + 32] = d * sc[s + 2] * static_cast<float>(q2);
      y[l + 64] = d * sc[s + 4] * static_cast<float>(q3);
      y[l + 96] = d * sc[s + 6] * static_cast<float>(q4);
    }
  }
}

// Decodes `count` consecutive blocks of a quantized format.
template <class Block, void (*decode_one)(const uint8_t*, float*), int kElements>
void run_blocks(const uint8_t* p, float* y, size_t count) {
  for (size_t b = 0; b < count; ++b) decode_one(p + b * sizeof(Block), y + b * kElements);
}

using RunDecoder = void (*)(const uint8_t* blocks, float* y, size_t count);

using RowDot = float (*)(const uint8_t* row, const float* x, size_t blocks);

struct TypeEntry {
  GgmlType type;
  GgmlTypeTraits traits;
  RunDecoder decode;  // nullptr: the size is known, computing with it is not supported
  RowDot dot;         // a fused kernel, or nullptr: decode runs of blocks and dot them with x
};

constexpr std::array kTypes = {
    TypeEntry{GgmlType::F32, {"F32", 1, 4, true}, run_f32},
    TypeEntry{GgmlType::F16, {"F16", 1, 2, true}, run_f16},
    TypeEntry{GgmlType::Q4_0, {"Q4_0", QK, sizeof(BlockQ4_0), true}, run_blocks<BlockQ4_0, block_q4_0, QK>, dot_row_q4_0},
    TypeEntry{GgmlType::Q4_1, {"Q4_1", QK, sizeof(BlockQ4_1), true}, run_blocks<BlockQ4_1, block_q4_1, QK>, dot_row_q4_1},
    TypeEntry{GgmlType::Q5_0, {"Q5_0", QK, sizeof(BlockQ5_0), true}, run_blocks<BlockQ5_0, block_q5_0, QK>, dot_row_q5_0},
    TypeEntry{GgmlType::Q5_1, {"Q5_1", QK, sizeof(BlockQ5_1), true}, run_blocks<BlockQ5_1, block_q5_1, QK>, dot_row_q5_1},
    TypeEntry{GgmlType::Q8_0, {"Q8_0", QK, sizeof(BlockQ8_0), true}, run_blocks<BlockQ8_0, block_q8_0, QK>, dot_row_q8_0},
    TypeEntry{GgmlType::Q8_1, {"Q8_1", QK, 36, false}, nullptr},
    TypeEntry{GgmlType::Q2_K, {"Q2_K", QK_K, 84, false}, nullptr},
    TypeEntry{GgmlType::Q3_K, {"Q3_K", QK_K, 110, false}, nullptr},
    TypeEntry{GgmlType::Q4_K, {"Q4_K", QK_K, sizeof(BlockQ4_K), true}, run_blocks<BlockQ4_K, block_q4_k, QK_K>},
    TypeEntry{GgmlType::Q5_K, {"Q5_K", QK_K, sizeof(BlockQ5_K), true}, run_blocks<BlockQ5_K, block_q5_k, QK_K>},
    TypeEntry{GgmlType::Q6_K, {"Q6_K", QK_K, sizeof(BlockQ6_K), true}, run_blocks<BlockQ6_K, block_q6_k, QK_K>},
    TypeEntry{GgmlType::Q8_K, {"Q8_K", QK_K, 292, false}, nullptr},
    TypeEntry{GgmlType::I8, {"I8", 1, 1, false}, nullptr},
    TypeEntry{GgmlType::I16, {"I16", 1, 2, false}, nullptr},
    TypeEntry{GgmlType::I32, {"I32", 1, 4, false}, nullptr},
    TypeEntry{GgmlType::I64, {"I64", 1, 8, false}, nullptr},
    TypeEntry{GgmlType::F64, {"F64", 1, 8, false}, nullptr},
    TypeEntry{GgmlType::BF16, {"BF16", 1, 2, true}, run_bf16},
};

const TypeEntry* find_entry(GgmlType type) {
  for (const auto& e : kTypes)
    if (e.type == type) return &e;
  return nullptr;
}

const TypeEntry& computable_entry(GgmlType type) {
  const TypeEntry* e = find_entry(type);
  KVQ_CHECK(e != nullptr, "unknown ggml tensor type id ", static_cast<uint32_t>(type));
  KVQ_CHECK(e->decode != nullptr, "ggml tensor type ", e->traits.name, " is not supported for computation");
  return *e;
}

// Eight independent partial sums so that the compiler vectorizes without reassociating a single sum.
float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

}  // namespace

const GgmlTypeTraits* ggml_type_traits(GgmlType type) {
  const TypeEntry* e = find_entry(type);
  return e ? &e->traits : nullptr;
}

const GgmlTypeTraits& ggml_traits(GgmlType type) {
  const GgmlTypeTraits* t = ggml_type_traits(type);
  KVQ_CHECK(t != nullptr, "unknown ggml tensor type id ", static_cast<uint32_t>(type));
  return *t;
}

size_t ggml_row_bytes(GgmlType type, int64_t n) {
  const GgmlTypeTraits& t = ggml_traits(type);
  KVQ_CHECK(n >= 0 && n % t.block_size == 0, "a row of ", n, " elements is not a whole number of ", t.name,
            " blocks of ", t.block_size);
  return static_cast<size_t>(n / t.block_size) * t.block_bytes;
}

void dequantize_row(GgmlType type, const void* row, float* out, int64_t n) {
  const TypeEntry& e = computable_entry(type);
  e.decode(static_cast<const uint8_t*>(row), out, ggml_row_bytes(type, n) / e.traits.block_bytes);
}

float dot_row(GgmlType type, const void* row, const float* x, int64_t n) {
  const TypeEntry& e = computable_entry(type);
  const size_t blocks = ggml_row_bytes(type, n) / e.traits.block_bytes;
  if (e.dot) return e.dot(static_cast<const uint8_t*>(row), x, blocks);
  // Decode a run of blocks of at most kRun elements into a small buffer, then dot it with x.
  constexpr int kRun = 256;
  const size_t per_run = static_cast<size_t>(kRun / e.traits.block_size);
  const auto* p = static_cast<const uint8_t*>(row);
  float buf[kRun];
  float sum = 0;
  for (size_t b = 0; b < blocks; b += per_run) {
    const size_t count = std::min(per_run, blocks - b);
    e.decode(p + b * e.traits.block_bytes, buf, count);
    sum += dot_f32(buf, x + b * e.traits.block_size, static_cast<int64_t>(count) * e.traits.block_size);
  }
  return sum;
}

}  // namespace kvq
