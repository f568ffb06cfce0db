// q8_dot_simd.hpp with AVX512-VNNI on 256-bit vectors (AVX512-VL): four products summed per lane by one vpdpbusd.
// This file alone is compiled with those flags.
#include "model/q8_dot.hpp"

#if defined(__x86_64__)
#include "model/q8_dot_simd.hpp"

namespace kvq::detail {
namespace {

struct VnniOps {
  static __m256i dot4(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
};

}  // namespace

const Q8DotTable kQ8DotAvx512Vnni = q8_simd::table<VnniOps>();

}  // namespace kvq::detail
#else
namespace kvq::detail {
const Q8DotTable kQ8DotAvx512Vnni = {};
}  // namespace kvq::detail
#endif
