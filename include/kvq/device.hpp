// Where a cache's pages live, as torch names it: the CPU, or a CUDA device with its index. Parsed from and printed
// as "cpu", "cuda" (device 0) and "cuda:N".
#pragma once

#include <string>
#include <string_view>

namespace kvq {

struct Device {
  enum class Kind { cpu, cuda };

  Kind kind = Kind::cpu;
  int index = 0;  ///< the CUDA device's ordinal; 0 on the CPU

  static constexpr Device cpu() { return {}; }
  static constexpr Device cuda(int index = 0) { return {Kind::cuda, index}; }
  /// "cpu", "cuda" or "cuda:N"; throws kvq::Error for anything else.
  static Device parse(std::string_view text);

  bool is_cpu() const { return kind == Kind::cpu; }
  bool is_cuda() const { return kind == Kind::cuda; }
  /// "cpu" or "cuda:N".
  std::string str() const;
  friend bool operator==(const Device&, const Device&) = default;
};

}  // namespace kvq
