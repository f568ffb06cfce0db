// Bit packing of small unsigned indices into a byte stream.
//
// Layout (one format for every width 1..16): index i occupies bits [i*b, (i+1)*b) of the stream, least significant
// bit first, where bit j of the stream is bit (j % 8) of byte j / 8. So for b = 4 index 2i is the low nibble of
// byte i and index 2i+1 the high nibble; for b = 3 eight indices fill exactly three bytes; for b = 1 index i is
// bit i % 8 of byte i / 8.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvq {

/// Bytes needed for n indices of `bits` bits.
constexpr size_t packed_bytes(size_t n, int bits) { return (n * static_cast<size_t>(bits) + 7) / 8; }

/// Packs n indices (each < 2^bits, 1 <= bits <= 8) into packed_bytes(n, bits) bytes of `out`.
void pack_bits(const uint8_t* idx, size_t n, int bits, uint8_t* out);
/// Unpacks n indices of `bits` bits (1 <= bits <= 8).
void unpack_bits(const uint8_t* in, size_t n, int bits, uint8_t* idx);
/// The same for wide indices (1 <= bits <= 16), used by vector-quantizer codes.
void pack_bits16(const uint16_t* idx, size_t n, int bits, uint8_t* out);
void unpack_bits16(const uint8_t* in, size_t n, int bits, uint16_t* idx);

}  // namespace kvq
