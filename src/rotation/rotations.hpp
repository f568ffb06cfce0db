// Constructors of the concrete rotations, one per file in src/rotation/.
#pragma once

#include <memory>

#include "kvq/rotation.hpp"

namespace kvq {

std::unique_ptr<Rotation> make_identity_rotation(int dim);
/// Randomized Hadamard H diag(s) / sqrt(d); d must be a power of two.
std::unique_ptr<Rotation> make_hadamard_rotation(int dim, uint64_t seed);
/// Sign-randomized real FFT, Hermitian half packed into d reals; d must be even.
std::unique_ptr<Rotation> make_srft_rotation(int dim, uint64_t seed);
/// Dense Haar-random orthogonal matrix (QR of a Gaussian with the sign fix).
std::unique_ptr<Rotation> make_haar_rotation(int dim, uint64_t seed);
/// k random Gaussian reflectors, 1 <= k <= d.
std::unique_ptr<Rotation> make_householder_rotation(int dim, int k, uint64_t seed);
/// R = then * first: `first` applied first (a learned rotation over a codec's base rotation).
std::unique_ptr<Rotation> make_composed_rotation(std::unique_ptr<Rotation> first, std::unique_ptr<Rotation> then);

}  // namespace kvq
