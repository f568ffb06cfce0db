// Which accuracy contract the attention kernels are chosen under, and the KVQ_ATTENTION override.
#pragma once

#include <string_view>

namespace kvq::detail {

/// exact: every fused kernel matches fp32 attention over the decoded cache to about 1e-5. fast: a kernel may round
/// its queries or weights coarser where its error against the double-precision reference over the decoded cache
/// stays under a tenth of the codec's own error (docs/METHODS.md, "Fast attention kernels"); pairs without a fast
/// kernel run the exact one.
enum class Precision { exact, fast };

/// The precision named by a KVQ_ATTENTION value: empty means fast; an unknown name throws kvq::Error.
Precision resolve_precision(std::string_view request);
/// resolve_precision(KVQ_ATTENTION from the environment), read at every call.
Precision active_precision();

}  // namespace kvq::detail
