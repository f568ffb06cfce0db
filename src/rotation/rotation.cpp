#include "kvq/rotation.hpp"

#include <charconv>

#include "kvq/error.hpp"
#include "rotation/rotations.hpp"

namespace kvq {

std::vector<float> Rotation::matrix() const {
  // Row i of R is R^T e_i, so rotating the identity with the inverse gives R row by row.
  const size_t d = static_cast<size_t>(dim());
  std::vector<float> m(d * d, 0.0f);
  for (size_t i = 0; i < d; ++i) m[i * d + i] = 1.0f;
  apply_inverse(m.data(), m.data(), d);
  return m;
}

std::unique_ptr<Rotation> make_rotation(std::string_view spec, int dim, uint64_t seed) {
  KVQ_CHECK(dim >= 1 && dim <= 4096, "rotation: dimension ", dim, " out of range [1, 4096]");
  const auto colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  const std::string_view arg = colon == std::string_view::npos ? std::string_view{} : spec.substr(colon + 1);
  if (name != "householder")
    KVQ_CHECK(arg.empty(), "rotation '", spec, "': '", name, "' takes no argument");
  if (name == "identity") return make_identity_rotation(dim);
  if (name == "hadamard") return make_hadamard_rotation(dim, seed);
  if (name == "srft") return make_srft_rotation(dim, seed);
  if (name == "haar") return make_haar_rotation(dim, seed);
  if (name == "householder") {
    int k = dim / 2 > 0 ? dim / 2 : 1;
    if (!arg.empty()) {
      const auto [ptr, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), k);
      KVQ_CHECK(ec == std::errc{} && ptr == arg.data() + arg.size(), "rotation '", spec,
                "': reflector count must be an integer");
    }
    return make_householder_rotation(dim, k, seed);
  }
  throw Error(detail::concat("unknown rotation '", spec,
                             "' (expected identity, hadamard, srft, haar, householder or householder:K)"));
}

}  // namespace kvq
