#include "attention/isa.hpp"

#include <cstdlib>
#include <string>

#include "kvq/error.hpp"

namespace kvq::detail {

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
  }
  return "?";
}

bool cpu_supports(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
  switch (isa) {
    case Isa::scalar:
      return true;
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case Isa::avx512:
      return cpu_supports(Isa::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    case Isa::avx512vnni:
      return cpu_supports(Isa::avx512) && __builtin_cpu_supports("avx512vnni");
  }
  return false;
#else
  return isa == Isa::scalar;
#endif
}

Isa best_isa() {
  for (Isa isa : {Isa::avx512vnni, Isa::avx512, Isa::avx2})
    if (cpu_supports(isa)) return isa;
  return Isa::scalar;
}

Isa resolve_isa(std::string_view request) {
  if (request.empty()) return best_isa();
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512vnni}) {
    if (request != isa_name(isa)) continue;
    KVQ_CHECK(cpu_supports(isa), "KVQ_ISA=", request, ": this CPU lacks the instruction set (best here: ",
              isa_name(best_isa()), ")");
    return isa;
  }
  throw Error("KVQ_ISA=" + std::string(request) + ": unknown instruction set (use scalar, avx2, avx512 or avx512vnni)");
}

Isa active_isa() {
  const char* env = std::getenv("KVQ_ISA");
  return resolve_isa(env ? std::string_view(env) : std::string_view());
}

}  // namespace kvq::detail
