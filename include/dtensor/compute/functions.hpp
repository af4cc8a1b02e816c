#pragma once
// The elementwise functions that the local compute layer knows by name: the same
// names select an Eigen expression on the host and a kernel on a GPU. Local
// reductions take the communicators' ReduceOp (core/reduce_op.hpp): one vocabulary
// for a reduction wherever it runs; locally an Avg accumulates like a Sum and the
// caller divides by the global count.
//
// Each unary function is one entry of the table below, UnaryMath<F>: its value, its
// derivative and whether integers take it. The host, the CUDA kernels (kernels/, built
// by nvcc from this same header) and the emulated test device all read that entry, so
// adding a function is: its name in DTENSOR_UNARY_FUNCTIONS, a UnaryMath specialization. (The host
// keeps a vectorised Eigen form of the older functions as an optional fast path in
// compute/local.hpp.)
#include <math.h>  // expf, erff, ... in the global namespace, as device code calls them

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dtensor/core/reduce_op.hpp"
#include "dtensor/core/scalar.hpp"
#include "dtensor/util/host_device.hpp"

namespace dtensor {

enum class BinaryOp : std::uint8_t { Add, Sub, Mul, Div };

// Gelu is the exact form, x * Phi(x) with the normal CDF (PyTorch's approximate="none");
// GeluTanh the tanh approximation (approximate="tanh").
//
// The list of the functions, in order: X(name) for each. It makes the enum and the
// visitor below, so that a visit names every function as an enumerator (nvcc's stub
// generator cannot name a kernel instantiated with static_cast<UnaryFn>(i)).
#define DTENSOR_UNARY_FUNCTIONS(X) \
  X(Neg) X(Exp) X(Log) X(Sqrt) X(Abs) X(Relu) X(Tanh) X(Sigmoid) X(Gelu) X(GeluTanh) X(Silu)

#define DTENSOR_UNARY_ENUMERATOR(f) f,
enum class UnaryFn : std::uint8_t { DTENSOR_UNARY_FUNCTIONS(DTENSOR_UNARY_ENUMERATOR) };
#undef DTENSOR_UNARY_ENUMERATOR
#define DTENSOR_UNARY_COUNT(f) +1
inline constexpr int kUnaryFunctions = 0 DTENSOR_UNARY_FUNCTIONS(DTENSOR_UNARY_COUNT);
#undef DTENSOR_UNARY_COUNT

// The float or double function by overload, on the host and in device code alike (a
// kernel templated on the element type must call expf for float, not exp on a double).
namespace math {
DTENSOR_HOST_DEVICE inline float exp(float x) { return ::expf(x); }
DTENSOR_HOST_DEVICE inline double exp(double x) { return ::exp(x); }
DTENSOR_HOST_DEVICE inline float log(float x) { return ::logf(x); }
DTENSOR_HOST_DEVICE inline double log(double x) { return ::log(x); }
DTENSOR_HOST_DEVICE inline float sqrt(float x) { return ::sqrtf(x); }
DTENSOR_HOST_DEVICE inline double sqrt(double x) { return ::sqrt(x); }
DTENSOR_HOST_DEVICE inline float tanh(float x) { return ::tanhf(x); }
DTENSOR_HOST_DEVICE inline double tanh(double x) { return ::tanh(x); }
DTENSOR_HOST_DEVICE inline float erf(float x) { return ::erff(x); }
DTENSOR_HOST_DEVICE inline double erf(double x) { return ::erf(x); }
DTENSOR_HOST_DEVICE inline float fabs(float x) { return ::fabsf(x); }
DTENSOR_HOST_DEVICE inline double fabs(double x) { return ::fabs(x); }

// -x and |x| for integers wrap modulo 2^bits (-lowest is lowest) instead of
// overflowing, which is undefined for signed types.
template <class T>
DTENSOR_HOST_DEVICE inline T wrapping_neg(T x) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(U(0) - static_cast<U>(x)));
}
}  // namespace math

// The table: UnaryMath<F>::value(x), ::derivative(x) = d value / dx at x, ::name, and
// ::integers (whether integer tensors take F; derivatives are for float and double).
template <UnaryFn F>
struct UnaryMath;

template <>
struct UnaryMath<UnaryFn::Neg> {
  static constexpr const char* name = "neg";
  static constexpr bool integers = true;
  template <class T>
  DTENSOR_HOST_DEVICE static T value(T x) {
    if constexpr (std::is_integral_v<T>) return math::wrapping_neg(x);
    else return -x;
  }
  template <class T>
  DTENSOR_HOST_DEVICE static T derivative(T) { return T(-1); }
};
template <>
struct UnaryMath<UnaryFn::Exp> {
  static constexpr const char* name = "exp";
  static constexpr bool integers = false;
  template <class T>
  DTENSOR_HOST_DEVICE static T value(T x) { return math::exp(x); }
  template <class T>
  DTENSOR_HOST_DEVICE static T derivative(T x) { return math::exp(x); }
};
template <>
struct UnaryMath<UnaryFn::Log> {
  static constexpr const char* name = "log";
  static constexpr bool integers = false;
  template <class T>
  DTENSOR_HOST_DEVICE static T value(T x) { return math::log(x); }
  template <class T>
  DTENSOR_HOST_DEVICE static T derivative(T x) { return T(1) / x; }
};
template <>
struct UnaryMath<UnaryFn::Sqrt> {
  static constexpr const char* name = "sqrt";
  static constexpr bool integers = false;
  template <class T>
  DTENSOR_HOST_DEVICE static T value(T x) { return math::sqrt(x); }
  template <class T>
  DTENSOR_HOST_DEVICE static T derivative(T x) { return T(0.5) / math::sqrt(x); }
};
template <>
struct UnaryMath<UnaryFn::Abs> {
  static constexpr const char* name = "abs";
  static constexpr bool integers = true;
  template <class T>
  DTENSOR_HOST_DEVICE static T value(T x) {
    if constexpr (std::is_floating_point_v<T>) return math::fabs(x);  // |-0.0| is +0.0
    else if constexpr (std::is_signed_v<T>) return x < T(0) ? math::wrapping_neg(x) : x;
    else return x;
  }
  // sign(x), 0 at 0 (PyTorch's subgradient); a NaN stays NaN.
  template <class T>
  DTENSOR_HOST_DEVICE static T derivative(T x) { return x > T(0) ? T(1) : x < T(0) ? T(-1) : x * T(0); }
};
template <>
struct UnaryMath<UnaryFn::Relu> {
  static constexpr const char* name = "relu";
  static constexpr bool integers = true;
  // x < 0 rather than max(x, 0): a NaN stays NaN, as in Eigen's max on the host.
  template <class T>
  DTENSOR_HOST_DEVICE static T value(T x) {
    if constexpr (std::is_unsigned_v<T>) return x;
    else return x < T(0) ? T(0) : x;
  }
  // 0 at x = 0, as PyTorch's threshold_backward; NaN for NaN. Two selects rather than
  // nested ones: loops over it vectorise (nested, they stayed branches, mispredicted on
  // activations of random sign).
  template <class T>
  DTENSOR_HOST_DEVICE static T derivative(T x) {
    const T step = x > T(0) ? T(1) : T(0);
    return x == x ? step : x;
  }
};
template <>
struct UnaryMath<UnaryFn::Tanh> {
  static constexpr const char* name = "tanh";
  static constexpr bool integers = false;
  template <class T>
  DTENSOR_HOST_DEVICE static T value(T x) { return math::tanh(x); }
  template <class T>
  DTENSOR_HOST_DEVICE static T derivative(T x) {
    const T t = math::tanh(x);
    return T(1) - t * t;
  }
};
template <>
struct UnaryMath<UnaryFn::Sigmoid> {
  static constexpr const char* name = "sigmoid";
  static constexpr bool integers = false;
  template <class T>
  DTENSOR_HOST_DEVICE static T value(T x) { return T(1) / (T(1) + math::exp(-x)); }
  template <class T>
  DTENSOR_HOST_DEVICE static T derivative(T x) {
    const T s = value(x);
    return s * (T(1) - s);
  }
};
template <>
struct UnaryMath<UnaryFn::Gelu> {
  static constexpr const char* name = "gelu";
  static constexpr bool integers = false;
  // x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2.
  template <class T>
  DTENSOR_HOST_DEVICE static T value(T x) { return T(0.5) * x * (T(1) + math::erf(x * T(0.70710678118654752440))); }
  // Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
  template <class T>
  DTENSOR_HOST_DEVICE static T derivative(T x) {
    const T cdf = T(0.5) * (T(1) + math::erf(x * T(0.70710678118654752440)));
    return cdf + x * T(0.39894228040143267794) * math::exp(T(-0.5) * x * x);
  }
};
template <>
struct UnaryMath<UnaryFn::GeluTanh> {
  static constexpr const char* name = "gelu_tanh";
  static constexpr bool integers = false;
  // x (1 + tanh(u)) / 2, u = sqrt(2 / pi) (x + 0.044715 x^3).
  template <class T>
  DTENSOR_HOST_DEVICE static T value(T x) {
    return T(0.5) * x * (T(1) + math::tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x)));
  }
  // (1 + t) / 2 + x (1 - t^2) u' / 2, t = tanh(u), u' = sqrt(2 / pi) (1 + 3 * 0.044715 x^2).
  template <class T>
  DTENSOR_HOST_DEVICE static T derivative(T x) {
    const T t = math::tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x));
    const T du = T(0.79788456080286535588) * (T(1) + T(3 * 0.044715) * x * x);
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
  }
};
template <>
struct UnaryMath<UnaryFn::Silu> {
  static constexpr const char* name = "silu";
  static constexpr bool integers = false;
  // x sigmoid(x).
  template <class T>
  DTENSOR_HOST_DEVICE static T value(T x) { return x / (T(1) + math::exp(-x)); }
  // s (1 + x (1 - s)), s = sigmoid(x).
  template <class T>
  DTENSOR_HOST_DEVICE static T derivative(T x) {
    const T s = T(1) / (T(1) + math::exp(-x));
    return s * (T(1) + x * (T(1) - s));
  }
};

// Calls fn(std::integral_constant<UnaryFn, f>{}): the function as a template argument,
// for every entry of the list.
template <class Fn>
constexpr decltype(auto) visit_unary(UnaryFn f, Fn&& fn) {
  switch (f) {
#define DTENSOR_UNARY_CASE(e) \
  case UnaryFn::e: return fn(std::integral_constant<UnaryFn, UnaryFn::e>{});
    DTENSOR_UNARY_FUNCTIONS(DTENSOR_UNARY_CASE)
#undef DTENSOR_UNARY_CASE
  }
  return fn(std::integral_constant<UnaryFn, UnaryFn::Neg>{});  // not reached: every value has its case
}

constexpr const char* name(UnaryFn f) {
  return visit_unary(f, [](auto k) { return UnaryMath<decltype(k)::value>::name; });
}
// Whether integer tensors take f (only float and double take the others, and every
// derivative).
constexpr bool takes_integers(UnaryFn f) {
  return visit_unary(f, [](auto k) { return UnaryMath<decltype(k)::value>::integers; });
}

}  // namespace dtensor
