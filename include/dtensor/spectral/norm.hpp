#pragma once
// Normalization of Fourier transforms, as numpy and PyTorch name it:
//   Norm::Backward  forward unscaled, inverse 1/n (the default, FFTW's convention plus 1/n)
//   Norm::Ortho     1/sqrt(n) both ways (the transform is unitary)
//   Norm::Forward   forward 1/n, inverse unscaled
// n is the length of the transformed dim in real space (for rfft/irfft the real length).
#include <cmath>
#include <cstdint>

namespace dtensor::spectral {

enum class Norm { Backward, Ortho, Forward };

constexpr const char* name(Norm n) { return n == Norm::Backward ? "backward" : n == Norm::Ortho ? "ortho" : "forward"; }

// The factor of a forward transform (exponent e^{-2 pi i jk/n}) of length n.
inline double forward_scale(Norm norm, int64_t n) {
  if (norm == Norm::Backward) return 1.0;
  if (norm == Norm::Ortho) return 1.0 / std::sqrt(static_cast<double>(n));
  return 1.0 / static_cast<double>(n);
}

// The factor of an inverse transform (e^{+2 pi i jk/n}) of length n.
inline double inverse_scale(Norm norm, int64_t n) {
  if (norm == Norm::Forward) return 1.0;
  if (norm == Norm::Ortho) return 1.0 / std::sqrt(static_cast<double>(n));
  return 1.0 / static_cast<double>(n);
}

// The adjoint of a forward transform normalized `norm` is the unnormalized-sign
// inverse sum with the same factor: forward_scale(norm, n) = inverse_scale(dual(norm), n).
constexpr Norm dual(Norm norm) {
  return norm == Norm::Backward ? Norm::Forward : norm == Norm::Forward ? Norm::Backward : Norm::Ortho;
}

}  // namespace dtensor::spectral
