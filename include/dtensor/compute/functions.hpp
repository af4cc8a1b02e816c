#pragma once
// The elementwise functions and reductions that the local compute layer knows by
// name: the same names select an Eigen expression on the host and a kernel on a GPU.
#include <cstdint>
#include <cstring>

namespace dtensor {

enum class BinaryOp : std::uint8_t { Add, Sub, Mul, Div };
enum class UnaryFn : std::uint8_t { Neg, Exp, Log, Sqrt, Abs, Relu, Tanh, Sigmoid };
// How one dim is reduced locally (a mean is a sum divided by the global extent).
enum class LocalReduce : std::uint8_t { Sum, Max, Min };

// One element of any element type, carried bit for bit across the type-erased
// device interface (a double would round 64-bit integers above 2^53).
struct Scalar {
  std::uint64_t bits = 0;
  template <class T>
  static Scalar of(T v) {
    static_assert(sizeof(T) <= sizeof(bits));
    Scalar s;
    std::memcpy(&s.bits, &v, sizeof v);
    return s;
  }
  template <class T>
  T as() const {
    T v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
};

}  // namespace dtensor
