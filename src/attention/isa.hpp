// The instruction sets the attention kernels are compiled for, detected at run time, and the KVQ_ISA override.
#pragma once

#include <string_view>

namespace kvq::detail {

/// Kernel instruction sets, each a superset of the one before (on x86).
/// avx2: AVX2 + FMA + F16C. avx512: AVX-512 F, BW, VL and DQ as well. avx512vnni: and AVX512-VNNI.
enum class Isa { scalar, avx2, avx512, avx512vnni };

/// "scalar", "avx2", "avx512" or "avx512vnni".
const char* isa_name(Isa isa);
/// Whether this CPU runs kernels of `isa` (scalar always; never avx2/avx512 off x86).
bool cpu_supports(Isa isa);
/// The widest instruction set this CPU supports.
Isa best_isa();
/// The instruction set named by a KVQ_ISA value: empty means best_isa(); an unknown name, or one this CPU lacks,
/// throws kvq::Error.
Isa resolve_isa(std::string_view request);
/// resolve_isa(KVQ_ISA from the environment), read at every call so that the variable can change between calls.
Isa active_isa();

}  // namespace kvq::detail
