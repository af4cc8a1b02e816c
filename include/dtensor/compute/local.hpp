#pragma once
// Local compute: the math one rank does on its own block, on the host (Eigen) or on
// a GPU (the device backend), chosen by where the tensors live. Operators call
// these and never branch on the device themselves. Mixing a host and a device
// tensor in one call is an error naming both.
#include <algorithm>
#include <cmath>
#include <limits>

#include "dtensor/compute/movement.hpp"
#include "dtensor/tensor/eigen.hpp"

namespace dtensor::local {

// --- elementwise ---

// o = x (k) y for Eigen arrays or scalars.
template <class O, class X, class Y>
void assign_binary(BinaryOp k, O&& o, const X& x, const Y& y) {
  switch (k) {
    case BinaryOp::Add: o = x + y; break;
    case BinaryOp::Sub: o = x - y; break;
    case BinaryOp::Mul: o = x * y; break;
    case BinaryOp::Div: o = x / y; break;
  }
}

template <class T, int R>
void binary(BinaryOp k, const Tensor<T, R>& a, const Tensor<T, R>& b, Tensor<T, R>& out) {
  require_same_device(a, b, "elementwise operator");
  if (!a.device().is_host())
    return detail::device_backend(a.device()).binary(dtype_of<T>(), k, a.data(), b.data(), out.data(), a.numel());
  assign_binary(k, as_eigen_array(out), as_eigen_array(a), as_eigen_array(b));
}

template <class T, int R>
void binary_scalar(BinaryOp k, const Tensor<T, R>& a, T s, Tensor<T, R>& out) {
  if (!a.device().is_host())
    return detail::device_backend(a.device())
        .binary_scalar(dtype_of<T>(), k, a.data(), Scalar::of(s), out.data(), a.numel());
  assign_binary(k, as_eigen_array(out), as_eigen_array(a), s);
}

template <class T, int R>
void unary(UnaryFn f, const Tensor<T, R>& a, Tensor<T, R>& out) {
  if (!a.device().is_host())
    return detail::device_backend(a.device()).unary(dtype_of<T>(), f, a.data(), out.data(), a.numel());
  auto x = as_eigen_array(a);
  auto o = as_eigen_array(out);
  if constexpr (std::is_floating_point_v<T>) {
    switch (f) {
      case UnaryFn::Neg: o = -x; return;
      case UnaryFn::Exp: o = x.exp(); return;
      case UnaryFn::Log: o = x.log(); return;
      case UnaryFn::Sqrt: o = x.sqrt(); return;
      case UnaryFn::Abs: o = x.abs(); return;
      case UnaryFn::Relu: o = x.max(T(0)); return;
      case UnaryFn::Tanh: o = x.tanh(); return;
      case UnaryFn::Sigmoid: o = (T(1) + (-x).exp()).inverse(); return;
    }
  } else {
    switch (f) {
      case UnaryFn::Neg: o = -x; return;
      case UnaryFn::Abs: o = x.abs(); return;
      case UnaryFn::Relu: o = x.max(T(0)); return;
      default:
        throw InvalidArgument(detail::cat("dtensor: this elementwise function needs a floating-point tensor, not ",
                                          name(dtype_of<T>())));
    }
  }
}

// out = m + v, v broadcast along the rows (v(j) added to row i) or the columns.
template <class T>
void add_bias(const Tensor<T, 2>& m, const Tensor<T, 1>& v, bool along_rows, Tensor<T, 2>& out) {
  require_same_device(m, v, "add_bias");
  if (!m.device().is_host())
    return detail::device_backend(m.device())
        .add_bias(dtype_of<T>(), m.data(), v.data(), out.data(), m.extent(0), m.extent(1), along_rows);
  if (along_rows)
    as_eigen(out) = as_eigen(m).rowwise() + as_eigen(v).transpose();
  else
    as_eigen(out) = as_eigen(m).colwise() + as_eigen(v);
}

template <class T>
void transpose(const Tensor<T, 2>& in, Tensor<T, 2>& out) {
  if (!in.device().is_host())
    return detail::device_backend(in.device()).transpose(dtype_of<T>(), in.data(), out.data(), in.extent(0),
                                                         in.extent(1));
  as_eigen(out) = as_eigen(in).transpose();
}

// --- reductions ---

template <LocalReduce R, class T>
T identity() {
  using L = std::numeric_limits<T>;
  if constexpr (R == LocalReduce::Max) return L::has_infinity ? -L::infinity() : L::lowest();
  else if constexpr (R == LocalReduce::Min) return L::has_infinity ? L::infinity() : L::max();
  else return T{0};
}

// out[o, i] = reduction over j of in[o, j, i] (outer, reduced, inner), in order.
template <LocalReduce R, class T>
void reduce_dim(Device d, const T* in, T* out, int64_t outer, int64_t len, int64_t inner) {
  if (!d.is_host()) return detail::device_backend(d).reduce_dim(dtype_of<T>(), R, in, out, outer, len, inner);
  for (int64_t o = 0; o < outer; ++o) {
    T* dst = out + o * inner;
    std::fill_n(dst, inner, identity<R, T>());
    for (int64_t j = 0; j < len; ++j) {
      const T* src = in + (o * len + j) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        if constexpr (R == LocalReduce::Max) dst[i] = std::max(dst[i], src[i]);
        else if constexpr (R == LocalReduce::Min) dst[i] = std::min(dst[i], src[i]);
        else dst[i] += src[i];
      }
    }
  }
}

// Sum of squares and largest magnitude of all elements, as a host value.
template <class T, int R>
T sum_squares(const Tensor<T, R>& a) {
  if (!a.device().is_host())
    return static_cast<T>(detail::device_backend(a.device()).sum_squares(dtype_of<T>(), a.data(), a.numel()));
  return as_eigen_array(a).square().sum();
}
template <class T, int R>
T max_abs(const Tensor<T, R>& a) {
  if (!a.device().is_host())
    return static_cast<T>(detail::device_backend(a.device()).max_abs(dtype_of<T>(), a.data(), a.numel()));
  return a.numel() ? as_eigen_array(a).abs().maxCoeff() : T{0};
}

// Softmax in two passes around the all-reduces of a sharded dim, x as [outer, len, inner]:
// shift: x = x - max (Log) or exp(x - max), sums = sum over j of exp(x - max);
// finish: x = x - log(sums) (Log) or x / sums.
template <bool Log, class T>
void softmax_shift(Device d, T* x, const T* max, T* sums, int64_t outer, int64_t len, int64_t inner) {
  if (!d.is_host()) return detail::device_backend(d).softmax_shift(dtype_of<T>(), x, max, sums, outer, len, inner, Log);
  std::fill_n(sums, outer * inner, T{0});
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < len; ++j)
      for (int64_t i = 0; i < inner; ++i) {
        T& v = x[(o * len + j) * inner + i];
        // Log keeps the shifted value: exp of it could underflow to 0 and its log to -inf.
        const T shifted = v - max[o * inner + i];
        const T e = std::exp(shifted);
        sums[o * inner + i] += e;
        v = Log ? shifted : e;
      }
}
template <bool Log, class T>
void softmax_finish(Device d, T* x, const T* sums, int64_t outer, int64_t len, int64_t inner) {
  if (!d.is_host()) return detail::device_backend(d).softmax_finish(dtype_of<T>(), x, sums, outer, len, inner, Log);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < len; ++j)
      for (int64_t i = 0; i < inner; ++i) {
        T& v = x[(o * len + j) * inner + i];
        const T sum = sums[o * inner + i];
        if constexpr (Log) v -= std::log(sum);
        else v /= sum;
      }
}

// --- products ---

// c[i] = a[i] b[i] for `batch` row-major matrices a [m, k], b [k, n] (e: batch, m, k, n).
template <class T>
void gemm(Device d, const T* a, const T* b, T* c, const std::array<int64_t, 4>& e) {
  if (!d.is_host()) {
    if constexpr (std::is_floating_point_v<T>)
      return detail::device_backend(d).gemm(dtype_of<T>(), e[0], e[1], e[3], e[2], a, b, c);
    else
      throw InvalidArgument(detail::cat("dtensor: matrix products on a GPU take float or double, not ",
                                        name(dtype_of<T>())));
  }
  using Map = Eigen::Map<const EigenRowMatrix<T>>;
  if (e[3] == 1 && e[0] == 1) {  // matrix-vector (and dot): Eigen's GEMV, not a one-column GEMM
    Eigen::Map<EigenVector<T>>(c, e[1]).noalias() = Map(a, e[1], e[2]) * Eigen::Map<const EigenVector<T>>(b, e[2]);
    return;
  }
  for (int64_t i = 0; i < e[0]; ++i) {
    Map am(a + i * e[1] * e[2], e[1], e[2]);
    Map bm(b + i * e[2] * e[3], e[2], e[3]);
    Eigen::Map<EigenRowMatrix<T>> cm(c + i * e[1] * e[3], e[1], e[3]);
    cm.noalias() = am * bm;
  }
}

}  // namespace dtensor::local
