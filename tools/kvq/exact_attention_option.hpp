// --exact: the commands that run attention measure the exact kernels instead of the fast ones.
#pragma once

#include <CLI/CLI.hpp>

namespace kvq::cli {

/// Adds --exact to `cmd`: when given, this process's attention runs the exact kernels (KVQ_ATTENTION=exact; by
/// default the fast kernels run where a pair has one, docs/METHODS.md).
void add_exact_attention_option(CLI::App& cmd);

}  // namespace kvq::cli
