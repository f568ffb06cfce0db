#include "attention/isa.hpp"

#include <cstdlib>
#include <string>

#include "core/cpu_f16c.hpp"
#include "kvq/error.hpp"

namespace kvq::detail {
namespace {

// The names of the instruction sets for which `keep` holds, comma-separated.
template <class Keep>
std::string isa_names(Keep keep) {
  std::string names;
  for (Isa isa : kAllIsas)
    if (keep(isa)) names += (names.empty() ? "" : ", ") + std::string(isa_name(isa));
  return names;
}

// avx512bf16's fast kernels sum values by vdpbf16ps, two tokens an instruction where an FMA takes one. Measured
// faster than avx512vnni's fp32 value sums on AMD Zen 4 (int4/int4 1.17-1.22x as fast) and slower on an Intel Xeon
// with AVX512-BF16 (int4/int4, kivi:2 and turbo_mse:3 in 1.14-1.30x avx512vnni's time; docs/perf/cpu.md): the
// default on AMD only.
bool bf16_values_pay() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
    case Isa::avx512vnni:
      return "avx512vnni";
    case Isa::avx512bf16:
      return "avx512bf16";
    case Isa::neon:
      return "neon";
  }
  return "?";
}

bool cpu_supports(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
  switch (isa) {
    case Isa::scalar:
      return true;
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case Isa::avx512:
      return cpu_supports(Isa::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    case Isa::avx512vnni:
      return cpu_supports(Isa::avx512) && __builtin_cpu_supports("avx512vnni");
    case Isa::avx512bf16:
      return cpu_supports(Isa::avx512vnni) && __builtin_cpu_supports("avx512bf16");
    case Isa::neon:
      return false;
  }
  return false;
#elif defined(__aarch64__)
  return isa == Isa::scalar || isa == Isa::neon;  // Advanced SIMD is part of every AArch64 CPU
#else
  return isa == Isa::scalar;
#endif
}

Isa best_isa() {
  for (Isa isa : {Isa::avx512bf16, Isa::avx512vnni, Isa::avx512, Isa::avx2, Isa::neon})
    if (cpu_supports(isa) && (isa != Isa::avx512bf16 || bf16_values_pay())) return isa;
  return Isa::scalar;
}

Isa narrower_isa(Isa isa) {
  switch (isa) {
    case Isa::avx512bf16:
      return Isa::avx512vnni;
    case Isa::avx512vnni:
      return Isa::avx512;
    case Isa::avx512:
      return Isa::avx2;
    case Isa::scalar:
    case Isa::avx2:
    case Isa::neon:
      break;
  }
  return Isa::scalar;
}

Isa resolve_isa(std::string_view request) {
  if (request.empty()) return best_isa();
  for (Isa isa : kAllIsas) {
    if (request != isa_name(isa)) continue;
    KVQ_CHECK(cpu_supports(isa), "KVQ_ISA=", request, ": this CPU lacks the instruction set (it has ",
              isa_names(cpu_supports), ")");
    return isa;
  }
  throw Error("KVQ_ISA=" + std::string(request) + ": unknown instruction set (use one of " +
              isa_names([](Isa) { return true; }) + "; this CPU has " + isa_names(cpu_supports) + ")");
}

Isa active_isa() {
  const char* env = std::getenv("KVQ_ISA");
  return resolve_isa(env ? std::string_view(env) : std::string_view());
}

}  // namespace kvq::detail
