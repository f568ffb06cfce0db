// The instruction sets the attention kernels are compiled for, detected at run time, and the KVQ_ISA override.
#pragma once

#include <string_view>

namespace kvq::detail {

/// Kernel instruction sets. x86: avx2 (AVX2 + FMA + F16C), avx512 (AVX-512 F, BW, VL and DQ as well), avx512vnni
/// (and AVX512-VNNI), avx512bf16 (and AVX512_BF16), each a superset of the one before. AArch64: neon (baseline
/// armv8-a Advanced SIMD).
enum class Isa { scalar, avx2, avx512, avx512vnni, avx512bf16, neon };

/// Every instruction set, in the order of the enum.
inline constexpr Isa kAllIsas[] = {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512vnni, Isa::avx512bf16, Isa::neon};

/// "scalar", "avx2", "avx512", "avx512vnni", "avx512bf16" or "neon".
const char* isa_name(Isa isa);
/// Whether this CPU runs kernels of `isa` (scalar always; the x86 ones only on x86, neon only on AArch64).
bool cpu_supports(Isa isa);
/// The widest instruction set this CPU supports, but avx512bf16 only on AMD (isa.cpp: its bf16 value sums are slower
/// on Intel's Xeons than avx512vnni's fp32 ones; KVQ_ISA=avx512bf16 still takes it).
Isa best_isa();
/// The instruction set a kernel of `isa` falls back to where it has none for a pair: the next narrower one that this
/// `isa` implies (scalar for avx2 and neon; scalar itself for scalar).
Isa narrower_isa(Isa isa);
/// The instruction set named by a KVQ_ISA value: empty means best_isa(); an unknown name, or one this CPU lacks,
/// throws kvq::Error (naming the instruction sets this CPU has).
Isa resolve_isa(std::string_view request);
/// resolve_isa(KVQ_ISA from the environment), read at every call so that the variable can change between calls.
Isa active_isa();

}  // namespace kvq::detail
