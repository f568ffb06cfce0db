// The tables by which the vector traits turn narrow codes into floats with one permute (vpermps reads an index's low
// bits only): entry i holds the value of i's low Bits bits, signed (two's complement) or not. Plain constexpr data,
// shared by the AVX2 and AVX-512 traits; internal linkage as everything the per-ISA translation units include
// (kernel_args.hpp).
#pragma once

namespace kvq::detail {
namespace {

template <int N>
struct LowBitsTable {
  alignas(64) float value[N];
};

template <int Bits, bool Signed, int N>
constexpr LowBitsTable<N> low_bits_values() {
  LowBitsTable<N> table{};
  for (int i = 0; i < N; ++i) {
    const int c = i & ((1 << Bits) - 1);
    table.value[i] = static_cast<float>(Signed && c >= 1 << (Bits - 1) ? c - (1 << Bits) : c);
  }
  return table;
}

}  // namespace
}  // namespace kvq::detail
