// q8_dot_simd.hpp for AVX2 + FMA + F16C: four products summed per lane by vpmaddubsw (to int16 pairs) and vpmaddwd.
// This file alone is compiled with those flags.
#include "model/q8_dot.hpp"

#if defined(__x86_64__)
#include "model/q8_dot_simd.hpp"

namespace kvq::detail {
namespace {

struct Avx2Ops {
  static __m256i dot4(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
  }
};

}  // namespace

const Q8DotTable kQ8DotAvx2 = q8_simd::table<Avx2Ops>();

}  // namespace kvq::detail
#else
namespace kvq::detail {
const Q8DotTable kQ8DotAvx2 = {};
}  // namespace kvq::detail
#endif
