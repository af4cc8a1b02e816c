#pragma once
// The elementwise functions and reductions that the local compute layer knows by
// name: the same names select an Eigen expression on the host and a kernel on a GPU.
#include <cstdint>

namespace dtensor {

enum class BinaryOp : std::uint8_t { Add, Sub, Mul, Div };
enum class UnaryFn : std::uint8_t { Neg, Exp, Log, Sqrt, Abs, Relu, Tanh, Sigmoid };
// How one dim is reduced locally (a mean is a sum divided by the global extent).
enum class LocalReduce : std::uint8_t { Sum, Max, Min };

}  // namespace dtensor
