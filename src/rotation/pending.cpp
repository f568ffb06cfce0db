// Placeholder until the SRFT, Haar and Householder rotations land (replaced by srft.cpp, haar.cpp, householder.cpp).
#include "kvq/error.hpp"
#include "rotation/rotations.hpp"

namespace kvq {
std::unique_ptr<Rotation> make_srft_rotation(int, uint64_t) { throw Error("srft rotation not built yet"); }
std::unique_ptr<Rotation> make_haar_rotation(int, uint64_t) { throw Error("haar rotation not built yet"); }
std::unique_ptr<Rotation> make_householder_rotation(int, int, uint64_t) {
  throw Error("householder rotation not built yet");
}
std::unique_ptr<Rotation> make_householder(int, std::span<const std::vector<float>>) {
  throw Error("householder rotation not built yet");
}
}  // namespace kvq
