#pragma once
// The parts of complex elements, element by element on host blocks: the real and
// imaginary parts, the magnitude and the phase, a complex number made of two real ones,
// and the gradients of each. ops/complex.hpp places them on DTensors.
//
// Gradients follow PyTorch's convention for complex inputs: for a real loss L of
// z = x + iy the gradient is dL/dx + i dL/dy. So, for the output gradient dy (real):
//   real(z)   dz = dy
//   imag(z)   dz = i dy
//   abs(z)    dz = dy z / |z|         (0 at z = 0, as PyTorch's sgn)
//   angle(z)  dz = dy i z / |z|^2     (0 at z = 0)
// and for z = re + i im with the gradient dz: dre = Re dz, dim = Im dz.
//
// Device blocks are refused by name: on a device complex elements move, add in
// reductions and are Fourier transformed; no kernel reads their parts.
#include <cmath>
#include <complex>
#include <cstdint>

#include "dtensor/core/dtype.hpp"
#include "dtensor/tensor/tensor.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::compute {

enum class ComplexPart { Real, Imag, Abs, Angle };

constexpr const char* name(ComplexPart p) {
  switch (p) {
    case ComplexPart::Real: return "real";
    case ComplexPart::Imag: return "imag";
    case ComplexPart::Abs: return "abs";
    case ComplexPart::Angle: return "angle";
  }
  return "?";
}

// Real and imaginary parts are linear over the reals: a sum of terms keeps its parts
// term by term (Partial<Sum|Avg> stays Partial); magnitude and phase need the value.
constexpr bool is_linear(ComplexPart p) { return p == ComplexPart::Real || p == ComplexPart::Imag; }

// Refuses a device block by name (see the top of this file).
inline void require_host_complex(const Device& d, const char* op) {
  DTENSOR_CHECK(d.is_host(), InvalidArgument, op,
                " of complex elements runs on host blocks (on a device complex elements move, add in reductions and "
                "are Fourier transformed); move the tensor to the host first");
}

// out = part(z), elementwise.
template <class R, int Rank>
void complex_part(ComplexPart part, const Tensor<std::complex<R>, Rank>& z, Tensor<R, Rank>& out) {
  require_host_complex(z.device(), name(part));
  const std::complex<R>* zp = z.data();
  R* o = out.data();
  const int64_t n = z.numel();
  switch (part) {
    case ComplexPart::Real:
      for (int64_t i = 0; i < n; ++i) o[i] = zp[i].real();
      break;
    case ComplexPart::Imag:
      for (int64_t i = 0; i < n; ++i) o[i] = zp[i].imag();
      break;
    case ComplexPart::Abs:
      for (int64_t i = 0; i < n; ++i) o[i] = std::abs(zp[i]);  // hypot: no overflow for large parts
      break;
    case ComplexPart::Angle:
      for (int64_t i = 0; i < n; ++i) o[i] = std::arg(zp[i]);
      break;
  }
}

// dz for y = part(z), from dy (the header's table).
template <class R, int Rank>
void complex_part_backward(ComplexPart part, const Tensor<std::complex<R>, Rank>& z, const Tensor<R, Rank>& dy,
                           Tensor<std::complex<R>, Rank>& dz) {
  using C = std::complex<R>;
  require_host_complex(z.device(), name(part));
  const C* zp = z.data();
  const R* g = dy.data();
  C* o = dz.data();
  const int64_t n = z.numel();
  switch (part) {
    case ComplexPart::Real:
      for (int64_t i = 0; i < n; ++i) o[i] = C(g[i], 0);
      break;
    case ComplexPart::Imag:
      for (int64_t i = 0; i < n; ++i) o[i] = C(0, g[i]);
      break;
    case ComplexPart::Abs:
      for (int64_t i = 0; i < n; ++i) {
        const R a = std::abs(zp[i]);
        o[i] = a == R(0) ? C(0) : zp[i] / a * g[i];  // z / |z| first: g / |z| overflows for a tiny z
      }
      break;
    case ComplexPart::Angle:
      for (int64_t i = 0; i < n; ++i) {
        const R a = std::abs(zp[i]);
        // i z / |z|^2 = (-y + i x) / |z|^2, divided by |z| twice (|z|^2 underflows first)
        o[i] = a == R(0) ? C(0) : C(-zp[i].imag(), zp[i].real()) / a * (g[i] / a);
      }
      break;
  }
}

// out = re + i im, elementwise.
template <class R, int Rank>
void make_complex(const Tensor<R, Rank>& re, const Tensor<R, Rank>& im, Tensor<std::complex<R>, Rank>& out) {
  require_host_complex(re.device(), "make_complex");
  require_host_complex(im.device(), "make_complex");
  for (int64_t i = 0; i < out.numel(); ++i) out.data()[i] = std::complex<R>(re.data()[i], im.data()[i]);
}

}  // namespace dtensor::compute
