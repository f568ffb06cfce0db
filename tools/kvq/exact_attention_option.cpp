#include "exact_attention_option.hpp"

#include <cstdlib>

namespace kvq::cli {

void add_exact_attention_option(CLI::App& cmd) {
  // The attention calls read KVQ_ATTENTION at each call, as they read KVQ_ISA: set it before the command runs.
  cmd.add_flag_callback(
      "--exact", [] { setenv("KVQ_ATTENTION", "exact", 1); },
      "the exact attention kernels (fp32-level accuracy) instead of the fast ones; the same as KVQ_ATTENTION=exact");
}

}  // namespace kvq::cli
