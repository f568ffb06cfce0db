#include "model/q8_dot.hpp"

namespace kvq::detail {
namespace {

const Q8DotTable& table(Isa isa) {
  switch (isa) {
    case Isa::avx2:
    case Isa::avx512:  // AVX-512 without VNNI: the AVX2 kernels
      return kQ8DotAvx2;
    case Isa::avx512vnni:
    case Isa::avx512bf16:  // BF16 adds nothing to the weights path: the VNNI kernels
      return kQ8DotAvx512Vnni;
    case Isa::scalar:
    case Isa::neon:
      break;
  }
  return kQ8DotScalar;
}

Q8Kernels entry(const Q8DotTable& t, GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0:
      return t.q4_0;
    case GgmlType::Q4_1:
      return t.q4_1;
    case GgmlType::Q8_0:
      return t.q8_0;
    case GgmlType::Q4_K:
      return t.q4_k;
    case GgmlType::Q6_K:
      return t.q6_k;
    default:
      return {};
  }
}

}  // namespace

bool q8_vectorized(Isa isa) {
  return isa == Isa::avx2 || isa == Isa::avx512 || isa == Isa::avx512vnni || isa == Isa::avx512bf16;
}

Q8Kernels q8_kernels(GgmlType type, Isa isa) { return entry(table(isa), type); }

}  // namespace kvq::detail
