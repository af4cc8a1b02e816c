#pragma once
// Element types as run-time values: what crosses the type-erased Comm interface.
#include <complex>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "dtensor/core/float16.hpp"

namespace dtensor {

// New entries go at the end: the numbers travel in agreement signatures and tags.
enum class DType : std::uint8_t {
  Int8, UInt8, Int32, UInt32, Int64, UInt64, Float32, Float64, BFloat16, Float16, Complex64, Complex128
};
// The last entry: readers of a DType number from a file or a peer check against it.
inline constexpr DType kLastDType = DType::Complex128;

template <class T>
inline constexpr bool is_complex_v = false;
template <class R>
inline constexpr bool is_complex_v<std::complex<R>> = true;

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::Float32;
  else if constexpr (std::is_same_v<T, double>) return DType::Float64;
  else if constexpr (std::is_same_v<T, bfloat16>) return DType::BFloat16;
  else if constexpr (std::is_same_v<T, float16>) return DType::Float16;
  else if constexpr (std::is_same_v<T, std::complex<float>>) return DType::Complex64;
  else if constexpr (std::is_same_v<T, std::complex<double>>) return DType::Complex128;
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 1)
    return std::is_signed_v<T> ? DType::Int8 : DType::UInt8;
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 4)
    return std::is_signed_v<T> ? DType::Int32 : DType::UInt32;
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 8)
    return std::is_signed_v<T> ? DType::Int64 : DType::UInt64;
  else
    static_assert(sizeof(T) == 0,
                  "dtensor: this element type cannot cross a communicator; use float, double, "
                  "bfloat16, float16, std::complex<float>, std::complex<double> or a 1, 4 or 8 byte integer");
}

template <class T>
concept Element = requires { dtype_of<T>(); };

constexpr std::size_t size_of(DType t) {
  switch (t) {
    case DType::Int8: case DType::UInt8: return 1;
    case DType::BFloat16: case DType::Float16: return 2;
    case DType::Int32: case DType::UInt32: case DType::Float32: return 4;
    case DType::Complex128: return 16;
    default: return 8;
  }
}

constexpr const char* name(DType t) {
  constexpr const char* names[] = {"int8",    "uint8",   "int32",    "uint32",    "int64",     "uint64",
                                   "float32", "float64", "bfloat16", "float16", "complex64", "complex128"};
  return names[static_cast<int>(t)];
}

// Calls f(T{}) with the C++ type of `t` for every type but the 16-bit floats and the
// complex types: the types device kernels compute in (the caller refuses the others
// first; here they would be taken for double).
template <class F>
decltype(auto) visit_dtype_except_float16(DType t, F&& f) {
  switch (t) {
    case DType::Int8: return f(std::int8_t{});
    case DType::UInt8: return f(std::uint8_t{});
    case DType::Int32: return f(std::int32_t{});
    case DType::UInt32: return f(std::uint32_t{});
    case DType::Int64: return f(std::int64_t{});
    case DType::UInt64: return f(std::uint64_t{});
    case DType::Float32: return f(float{});
    default: return f(double{});
  }
}

// Calls f(T{}) with the C++ type of `t`: one switch per collective, never per element.
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  if (t == DType::BFloat16) return f(bfloat16{});
  if (t == DType::Float16) return f(float16{});
  if (t == DType::Complex64) return f(std::complex<float>{});
  if (t == DType::Complex128) return f(std::complex<double>{});
  return visit_dtype_except_float16(t, f);
}

constexpr bool is_float16(DType t) { return t == DType::BFloat16 || t == DType::Float16; }
constexpr bool is_complex(DType t) { return t == DType::Complex64 || t == DType::Complex128; }
// Real floating types (a complex type is neither floating nor ordered).
constexpr bool is_floating(DType t) { return t == DType::Float32 || t == DType::Float64 || is_float16(t); }

// Calls f(T{}) with the C++ type of a floating `t` (float, double, bfloat16, float16),
// so that only those instantiations of f are compiled; the caller refuses the other
// types first (is_floating), and for one of those it does nothing.
template <class F>
void visit_floating_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::BFloat16: return f(bfloat16{});
    case DType::Float16: return f(float16{});
    default: return;
  }
}

// The type a reduction of `t` accumulates in (accumulator_t as a value): float for the
// 16-bit types, the type itself otherwise.
constexpr DType accumulator_dtype(DType t) { return is_float16(t) ? DType::Float32 : t; }

}  // namespace dtensor
