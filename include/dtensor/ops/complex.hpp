#pragma once
// The parts of a complex DTensor and the complex tensor made of two real ones, with
// their gradients (compute/complex_parts.hpp has the element math and the gradient
// convention, PyTorch's):
//   real(z), imag(z)      real parts; Partial<Sum|Avg> stays Partial (linear over the reals)
//   conj(z)               complex; Partial<Sum|Avg> stays Partial
//   abs(z), angle(z)      magnitude and phase; a Partial is reduced first (they need the value)
//   make_complex(re, im)  re + i im (torch.complex); the operands placed as for re + im
// Shard and Replicate are kept: every one of them is local to each element.
//   auto power = mul(abs(X), abs(X));     // |X|^2 of a spectrum (X's placements, a Partial reduced)
//   auto dX = abs_backward(X, dpower_dabs);
#include <complex>
#include <type_traits>
#include <utility>

#include "dtensor/compute/complex_parts.hpp"
#include "dtensor/compute/local.hpp"
#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/ops/elementwise.hpp"
#include "dtensor/ops/elementwise_backward.hpp"
#include "dtensor/ops/operands.hpp"

namespace dtensor {

namespace detail {
template <compute::ComplexPart K>
struct complex_part_name {};  // names the operator in strict-mode diagnostics
struct conj_name {};
struct make_complex_name {};

template <class T>
inline constexpr bool is_float_or_double_complex_v =
    std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>>;

// The placements z is brought to before part K is taken (its output's too).
template <compute::ComplexPart K, class... P>
inline constexpr auto complex_part_targets = unary_targets<sizeof...(P)>(describe_all<P...>(), compute::is_linear(K));

template <compute::ComplexPart K, class Policy, class C, int Rank, class... P>
auto complex_part(const DTensor<C, Rank, P...>& z) {
  static_assert(is_float_or_double_complex_v<C>,
                "dtensor: real, imag, abs (of a complex tensor) and angle take complex<float> or complex<double> "
                "tensors");
  using R = typename C::value_type;
  static constexpr auto targets = complex_part_targets<K, P...>;
  const auto& [z2] = operands_at<Policy, complex_part_name<K>, kNoOwnCollective, placements_t<targets>>(z);
  auto out = Tensor<R, Rank>::uninitialized(z2.local().shape(), z2.local().device());
  compute::complex_part(K, z2.local(), out);
  return dtensor_t<R, Rank, placements_t<targets>>(z.mesh(), z2.layout(), std::move(out));
}

// dz for y = part K of z, from dy placed as a gradient of y.
template <compute::ComplexPart K, class C, int Rank, class... P, class R, class... G>
auto complex_part_backward(const DTensor<C, Rank, P...>& z, const DTensor<R, Rank, G...>& dy) {
  static_assert(is_float_or_double_complex_v<C> && std::is_same_v<R, typename C::value_type>,
                "dtensor: the gradient of a part of a complex<R> tensor is a tensor of R");
  static constexpr auto targets = complex_part_targets<K, P...>;
  static_assert(is_gradient_of(describe_all<G...>(), targets),
                "dtensor: dy is not placed as a gradient of the part's result; redistribute dy first");
  const auto& z2 = redistribute_as<placements_t<targets>>(z);
  check_same_blocks(z2.layout(), dy.layout(), "complex part backward");
  auto g = Tensor<C, Rank>::uninitialized(dy.local().shape(), dy.local().device());
  // The factor (1, i, z/|z|, iz/|z|^2) is a value (z is not Partial where it is
  // nonlinear), so the product keeps dy's placements.
  compute::complex_part_backward(K, z2.local(), dy.local(), g);
  return operand_gradient<targets, describe_all<G...>(), P...>(z.mesh(), z2.layout(), std::move(g),
                                                               z.layout().blocks);
}
}  // namespace detail

template <class Policy = Implicit, class C, int Rank, class... P>
auto real(const DTensor<C, Rank, P...>& z) {
  return detail::complex_part<compute::ComplexPart::Real, Policy>(z);
}
template <class Policy = Implicit, class C, int Rank, class... P>
auto imag(const DTensor<C, Rank, P...>& z) {
  return detail::complex_part<compute::ComplexPart::Imag, Policy>(z);
}
template <class Policy = Implicit, class C, int Rank, class... P>
auto angle(const DTensor<C, Rank, P...>& z) {
  return detail::complex_part<compute::ComplexPart::Angle, Policy>(z);
}
// |z| of a complex tensor (a real tensor); abs of a real tensor is elementwise.hpp's.
template <class Policy = Implicit, class C, int Rank, class... P>
  requires is_complex_v<C>
auto abs(const DTensor<C, Rank, P...>& z) {
  return detail::complex_part<compute::ComplexPart::Abs, Policy>(z);
}

template <class C, int Rank, class... P, class R, class... G>
auto real_backward(const DTensor<C, Rank, P...>& z, const DTensor<R, Rank, G...>& dy) {
  return detail::complex_part_backward<compute::ComplexPart::Real>(z, dy);
}
template <class C, int Rank, class... P, class R, class... G>
auto imag_backward(const DTensor<C, Rank, P...>& z, const DTensor<R, Rank, G...>& dy) {
  return detail::complex_part_backward<compute::ComplexPart::Imag>(z, dy);
}
template <class C, int Rank, class... P, class R, class... G>
auto angle_backward(const DTensor<C, Rank, P...>& z, const DTensor<R, Rank, G...>& dy) {
  return detail::complex_part_backward<compute::ComplexPart::Angle>(z, dy);
}
template <class C, int Rank, class... P, class R, class... G>
  requires is_complex_v<C>
auto abs_backward(const DTensor<C, Rank, P...>& z, const DTensor<R, Rank, G...>& dy) {
  return detail::complex_part_backward<compute::ComplexPart::Abs>(z, dy);
}

// The complex conjugate, on z's placements (Partial<Sum|Avg> kept: conj is linear over
// the reals).
template <class Policy = Implicit, class C, int Rank, class... P>
auto conj(const DTensor<C, Rank, P...>& z) {
  static_assert(detail::is_float_or_double_complex_v<C>,
                "dtensor: conj takes complex<float> or complex<double> tensors (a real tensor is its own conjugate)");
  static constexpr auto targets = detail::unary_targets<sizeof...(P)>(describe_all<P...>(), true);
  const auto& [z2] =
      detail::operands_at<Policy, detail::conj_name, detail::kNoOwnCollective, placements_t<targets>>(z);
  auto out = Tensor<C, Rank>::uninitialized(z2.local().shape(), z2.local().device());
  compute::conj(z2.local(), out);
  return dtensor_t<C, Rank, placements_t<targets>>(z.mesh(), z2.layout(), std::move(out));
}
// dz = conj(dy) (conj is its own adjoint over the reals).
template <class C, int Rank, class... P, class... G>
auto conj_backward(const DTensor<C, Rank, P...>& z, const DTensor<C, Rank, G...>& dy) {
  static constexpr auto targets = detail::unary_targets<sizeof...(P)>(describe_all<P...>(), true);
  static_assert(is_gradient_of(describe_all<G...>(), targets),
                "dtensor: dy is not placed as a gradient of conj's result; redistribute dy first");
  detail::check_same_blocks(redistribute_as<placements_t<targets>>(z).layout(), dy.layout(), "conj backward");
  auto g = Tensor<C, Rank>::uninitialized(dy.local().shape(), dy.local().device());
  compute::conj(dy.local(), g);
  return detail::operand_gradient<targets, describe_all<G...>(), P...>(z.mesh(), dy.layout(), std::move(g),
                                                                      z.layout().blocks);
}

// re + i im, elementwise: both operands brought to the placements re + im would take
// (a Partial<Sum> beside a Replicate stays Partial, the replicated part one term).
template <class Policy = Implicit, class R, int Rank, class... PA, class... PB>
auto make_complex(const DTensor<R, Rank, PA...>& re, const DTensor<R, Rank, PB...>& im) {
  static_assert(std::is_same_v<R, float> || std::is_same_v<R, double>,
                "dtensor::make_complex: float or double parts (a complex<float> or complex<double> tensor)");
  static_assert(sizeof...(PA) == sizeof...(PB), "dtensor::make_complex: both parts must live on the same mesh");
  static constexpr auto plan = detail::binary_plan<sizeof...(PA)>(BinaryOp::Add, describe_all<PA...>(),
                                                                   describe_all<PB...>());
  const auto& [re2, im2] = detail::operands_at<Policy, detail::make_complex_name, detail::kNoOwnCollective,
                                               placements_t<plan.a>, placements_t<plan.b>>(re, im);
  detail::check_same_blocks(re2.layout(), im2.layout(), "make_complex");
  auto out = Tensor<std::complex<R>, Rank>::uninitialized(re2.local().shape(), re2.local().device());
  compute::make_complex(re2.local(), im2.local(), out);
  return dtensor_t<std::complex<R>, Rank, placements_t<plan.out>>(re.mesh(), re2.layout(), std::move(out));
}

// {dre, dim} for z = make_complex(re, im): the real and imaginary parts of dz, each
// through the adjoint of its operand's redistribution.
template <class R, int Rank, class... PA, class... PB, class... G>
auto make_complex_backward(const DTensor<R, Rank, PA...>& re, const DTensor<R, Rank, PB...>& im,
                           const DTensor<std::complex<R>, Rank, G...>& dz) {
  constexpr std::size_t M = sizeof...(PA);
  static constexpr auto plan = detail::binary_plan<M>(BinaryOp::Add, describe_all<PA...>(), describe_all<PB...>());
  static_assert(is_gradient_of(describe_all<G...>(), plan.out),
                "dtensor::make_complex_backward: dz is not placed as a gradient of the complex tensor; redistribute "
                "dz first");
  const auto& re2 = redistribute_as<placements_t<plan.a>>(re);
  const auto& im2 = redistribute_as<placements_t<plan.b>>(im);
  detail::check_same_blocks(re2.layout(), dz.layout(), "make_complex backward");
  auto gre = Tensor<R, Rank>::uninitialized(dz.local().shape(), dz.local().device());
  auto gim = Tensor<R, Rank>::uninitialized(dz.local().shape(), dz.local().device());
  compute::complex_part(compute::ComplexPart::Real, dz.local(), gre);
  compute::complex_part(compute::ComplexPart::Imag, dz.local(), gim);
  constexpr auto g = describe_all<G...>();
  auto dre = detail::operand_gradient<plan.a, g, PA...>(re.mesh(), re2.layout(), std::move(gre), re.layout().blocks);
  auto dim = detail::operand_gradient<plan.b, g, PB...>(re.mesh(), im2.layout(), std::move(gim), im.layout().blocks);
  return std::pair{std::move(dre), std::move(dim)};
}

}  // namespace dtensor
