#include "core/bitpack.hpp"

#include <cstring>

#include "kvq/error.hpp"

namespace kvq {
namespace {

template <class Index>
void pack_stream(const Index* idx, size_t n, int bits, uint8_t* out) {
  std::memset(out, 0, packed_bytes(n, bits));
  uint64_t acc = 0;
  int filled = 0;
  size_t o = 0;
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  for (size_t i = 0; i < n; ++i) {
    KVQ_CHECK((idx[i] & ~mask) == 0, "pack_bits: index ", idx[i], " at position ", i, " does not fit in ", bits,
              " bits");
    acc |= static_cast<uint64_t>(idx[i]) << filled;
    filled += bits;
    while (filled >= 8) {
      out[o++] = static_cast<uint8_t>(acc);
      acc >>= 8;
      filled -= 8;
    }
  }
  if (filled > 0) out[o] = static_cast<uint8_t>(acc);
}

template <class Index>
void unpack_stream(const uint8_t* in, size_t n, int bits, Index* idx) {
  uint64_t acc = 0;
  int filled = 0;
  size_t p = 0;
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  for (size_t i = 0; i < n; ++i) {
    while (filled < bits) {
      acc |= static_cast<uint64_t>(in[p++]) << filled;
      filled += 8;
    }
    idx[i] = static_cast<Index>(acc & mask);
    acc >>= bits;
    filled -= bits;
  }
}

}  // namespace

void pack_bits(const uint8_t* idx, size_t n, int bits, uint8_t* out) {
  KVQ_CHECK(bits >= 1 && bits <= 8, "pack_bits: bits must be in 1..8, got ", bits);
  pack_stream(idx, n, bits, out);
}
void unpack_bits(const uint8_t* in, size_t n, int bits, uint8_t* idx) {
  KVQ_CHECK(bits >= 1 && bits <= 8, "unpack_bits: bits must be in 1..8, got ", bits);
  unpack_stream(in, n, bits, idx);
}
void pack_bits16(const uint16_t* idx, size_t n, int bits, uint8_t* out) {
  KVQ_CHECK(bits >= 1 && bits <= 16, "pack_bits16: bits must be in 1..16, got ", bits);
  pack_stream(idx, n, bits, out);
}
void unpack_bits16(const uint8_t* in, size_t n, int bits, uint16_t* idx) {
  KVQ_CHECK(bits >= 1 && bits <= 16, "unpack_bits16: bits must be in 1..16, got ", bits);
  unpack_stream(in, n, bits, idx);
}

}  // namespace kvq
