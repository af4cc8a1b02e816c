#pragma once
// The arithmetic operators on DTensors: a + b, a - b, a * b, a / b, -a, with scalars
// on either side of + - * and on the right of /, and the compound forms +=, -=, *=,
// /= where the result keeps the left operand's placements. Each is the function of
// the same name in ops/elementwise.hpp (add, sub, mul, div, neg), so the placement
// rule, the collectives it plans and its backward (add_backward, ...;
// binary_scalar_backward, unary_backward) are that function's:
//
//   auto z = x * w - b / 2.0f;         // = sub(mul(x, w), div(b, 2.0f))
//   y += bias;                         // only if add(y, bias) is placed as y is
//
// The operators always take the implicit policy; write mul<Strict>(a, b) to forbid a
// collective.
#include <type_traits>

#include "dtensor/ops/elementwise.hpp"

namespace dtensor {

namespace detail {
template <class X>
concept DTensorOperand = is_dtensor_v<std::remove_cvref_t<X>>;
}  // namespace detail

template <detail::DTensorOperand X, detail::DTensorOperand Y>
auto operator+(const X& a, const Y& b) { return add(a, b); }
template <detail::DTensorOperand X, detail::DTensorOperand Y>
auto operator-(const X& a, const Y& b) { return sub(a, b); }
template <detail::DTensorOperand X, detail::DTensorOperand Y>
auto operator*(const X& a, const Y& b) { return mul(a, b); }
template <detail::DTensorOperand X, detail::DTensorOperand Y>
auto operator/(const X& a, const Y& b) { return div(a, b); }

// A scalar is a Replicate operand; it converts to the element type.
template <detail::DTensorOperand X>
auto operator+(const X& x, typename X::value_type s) { return add(x, s); }
template <detail::DTensorOperand X>
auto operator+(typename X::value_type s, const X& x) { return add(x, s); }
template <detail::DTensorOperand X>
auto operator-(const X& x, typename X::value_type s) { return sub(x, s); }
template <detail::DTensorOperand X>
auto operator-(typename X::value_type s, const X& x) { return add(neg(x), s); }  // -x keeps Partial<Sum>
template <detail::DTensorOperand X>
auto operator*(const X& x, typename X::value_type s) { return mul(x, s); }
template <detail::DTensorOperand X>
auto operator*(typename X::value_type s, const X& x) { return mul(x, s); }
template <detail::DTensorOperand X>
auto operator/(const X& x, typename X::value_type s) { return div(x, s); }

template <detail::DTensorOperand X>
auto operator-(const X& x) { return neg(x); }

namespace detail {
// x op= y assigns op(x, y) to x: its type (placements) must be x's.
template <class X, class R>
constexpr void check_compound() {
  static_assert(std::is_same_v<X, R>,
                "dtensor: x op= y would change x's placements (op(x, y) is placed otherwise, e.g. a Partial "
                "operand made it Partial, or a sharded one sharded it); write auto z = x op y, or redistribute "
                "y to x's placements first");
}
}  // namespace detail

template <detail::DTensorOperand X, class Y>
  requires(detail::DTensorOperand<Y> || std::is_convertible_v<Y, typename X::value_type>)
X& operator+=(X& x, const Y& y) {
  auto r = x + y;
  detail::check_compound<X, decltype(r)>();
  return x = std::move(r);
}
template <detail::DTensorOperand X, class Y>
  requires(detail::DTensorOperand<Y> || std::is_convertible_v<Y, typename X::value_type>)
X& operator-=(X& x, const Y& y) {
  auto r = x - y;
  detail::check_compound<X, decltype(r)>();
  return x = std::move(r);
}
template <detail::DTensorOperand X, class Y>
  requires(detail::DTensorOperand<Y> || std::is_convertible_v<Y, typename X::value_type>)
X& operator*=(X& x, const Y& y) {
  auto r = x * y;
  detail::check_compound<X, decltype(r)>();
  return x = std::move(r);
}
template <detail::DTensorOperand X, class Y>
  requires(detail::DTensorOperand<Y> || std::is_convertible_v<Y, typename X::value_type>)
X& operator/=(X& x, const Y& y) {
  auto r = x / y;
  detail::check_compound<X, decltype(r)>();
  return x = std::move(r);
}

}  // namespace dtensor
