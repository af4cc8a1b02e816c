#pragma once
// Local compute: the math one rank does on its own block, on the host (Eigen) or on
// a GPU (the device backend), chosen by where the tensors live. Operators call
// these and never branch on the device themselves. Mixing a host and a device
// tensor in one call is an error naming both.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "dtensor/compute/blas.hpp"
#include "dtensor/compute/device_backend.hpp"
#include "dtensor/compute/gelu_host.hpp"
#include "dtensor/compute/gemm.hpp"
#include "dtensor/compute/onednn_matmul.hpp"
#include "dtensor/core/float16_arrays.hpp"
#include "dtensor/tensor/eigen.hpp"
#include "dtensor/tensor/movement.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor::compute {

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

// exp of a float or double array: Eigen's vectorised exp, exact down to the smallest
// normal result, but below (x < -87.3 in float) it returns ~2.9e-39 (float) or ~5.6e-309
// (double) for every x, -inf included, where exp is a denormal or 0: those elements are
// computed again by std::exp. A chunk at a time, copied first, so out may alias a.
template <class T>
void exp_array(const T* a, T* out, int64_t n) {
  constexpr int64_t kChunk = 256;
  static const T smallest_normal_result = std::log(std::numeric_limits<T>::min());
  T x[kChunk];
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t m = std::min(kChunk, n - at);
    std::copy_n(a + at, m, x);
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(out + at, m) = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(x, m).exp();
    for (int64_t i = 0; i < m; ++i)
      if (x[i] < smallest_normal_result) out[at + i] = std::exp(x[i]);
  }
}

// 16-bit elements: each loaded into float, computed in float, rounded once when stored.
// A chunk at a time, in three loops (widen, compute, round): each vectorises on its own,
// where one loop doing all three did not (the rounding's NaN test and a function's
// select are control flow; ReLU's backward on bfloat16 ran 7x its float time), and the
// widening and rounding take the CPU's widest path (core/float16_arrays.hpp). The chunks
// are copied first, so out may alias a or b.
inline constexpr int64_t kFloat16MapChunk = 256;
template <class T, class F>
void map_float16(const T* a, T* out, int64_t n, F&& f) {
  float fa[kFloat16MapChunk];
  for (int64_t at = 0; at < n; at += kFloat16MapChunk) {
    const int64_t m = std::min(kFloat16MapChunk, n - at);
    detail::convert_array(a + at, fa, m);
    for (int64_t i = 0; i < m; ++i) fa[i] = f(fa[i]);
    detail::convert_array(fa, out + at, m);
  }
}
template <class T, class F>
void map_float16(const T* a, const T* b, T* out, int64_t n, F&& f) {
  float fa[kFloat16MapChunk], fb[kFloat16MapChunk];
  for (int64_t at = 0; at < n; at += kFloat16MapChunk) {
    const int64_t m = std::min(kFloat16MapChunk, n - at);
    detail::convert_array(a + at, fa, m);
    detail::convert_array(b + at, fb, m);
    for (int64_t i = 0; i < m; ++i) fa[i] = f(fa[i], fb[i]);
    detail::convert_array(fa, out + at, m);
  }
}

template <class T, int R>
void binary(BinaryOp k, const Tensor<T, R>& a, const Tensor<T, R>& b, Tensor<T, R>& out) {
  movement::require_same_device(a, b, "elementwise operator");
  if (!a.device().is_host())
    return detail::device_backend(a.device()).binary(dtype_of<T>(), k, a.data(), b.data(), out.data(), a.numel());
  if constexpr (is_float16_v<T>)
    return map_float16(a.data(), b.data(), out.data(), a.numel(), [k](float x, float y) {
      float o = 0;
      assign_binary(k, o, x, y);
      return o;
    });
  else
    assign_binary(k, as_eigen_array(out), as_eigen_array(a), as_eigen_array(b));
}

// The scalar is in a's accumulator type (float for 16-bit tensors): a 16-bit tensor
// times 1/n is computed in float and rounded once, never with 1/n rounded to 16 bits.
template <class T, int R>
void binary_scalar(BinaryOp k, const Tensor<T, R>& a, std::type_identity_t<accumulator_t<T>> s, Tensor<T, R>& out) {
  if (!a.device().is_host())
    return detail::device_backend(a.device())
        .binary_scalar(dtype_of<T>(), k, a.data(), dtensor::detail::device_scalar(s), out.data(), a.numel());
  if constexpr (is_float16_v<T>)
    return map_float16(a.data(), out.data(), a.numel(), [k, y = float(s)](float x) {
      float o = 0;
      assign_binary(k, o, x, y);
      return o;
    });
  else
    assign_binary(k, as_eigen_array(out), as_eigen_array(a), s);
}

template <class T, int R>
void unary_real(UnaryFn f, const Tensor<T, R>& a, Tensor<T, R>& out);

// out = f(a) elementwise; out may alias a. Integer tensors take Neg, Abs and Relu only
// (takes_integers), which wrap like the kernels: -lowest is lowest.
template <class T, int R>
void unary(UnaryFn f, const Tensor<T, R>& a, Tensor<T, R>& out) {
  if constexpr (is_complex_v<T>) {  // neg and exp: the complex functions the operators offer
    DTENSOR_CHECK(a.device().is_host(), InvalidArgument, "the elementwise ", name(f), " of ", name(dtype_of<T>()),
                  " elements runs on host blocks (on a device they move, add in reductions and are Fourier transformed)");
    DTENSOR_CHECK(f == UnaryFn::Neg || f == UnaryFn::Exp, InvalidArgument, "the elementwise function ", name(f),
                  " is not defined for ", name(dtype_of<T>()), " tensors");
    const T* x = a.data();
    T* o = out.data();
    for (int64_t i = 0; i < a.numel(); ++i) o[i] = f == UnaryFn::Neg ? -x[i] : std::exp(x[i]);
  } else {
    unary_real(f, a, out);
  }
}

template <class T, int R>
void unary_real(UnaryFn f, const Tensor<T, R>& a, Tensor<T, R>& out) {
  if constexpr (!FloatingElement<T>)
    DTENSOR_CHECK(takes_integers(f), InvalidArgument, "the elementwise function ", name(f),
                  " needs a floating-point tensor, not ", name(dtype_of<T>()));
  if (!a.device().is_host())
    return detail::device_backend(a.device()).unary(dtype_of<T>(), f, a.data(), out.data(), a.numel());
  if constexpr (is_float16_v<T>) {
    if (f == UnaryFn::Gelu) return detail::gelu::forward_16bit(a.data(), out.data(), a.numel());
    return visit_unary(f, [&](auto k) {
      using M = UnaryMath<decltype(k)::value>;
      map_float16(a.data(), out.data(), a.numel(), [](float v) { return M::value(v); });
    });
  }
  auto x = as_eigen_array(a);
  auto o = as_eigen_array(out);
  if constexpr (std::is_floating_point_v<T>) {
    switch (f) {  // Eigen's vectorised forms where it has them; the table's formula otherwise
      case UnaryFn::Neg: o = -x; return;
      case UnaryFn::Exp: return exp_array(a.data(), out.data(), a.numel());
      case UnaryFn::Log: o = x.log(); return;
      case UnaryFn::Sqrt: o = x.sqrt(); return;
      case UnaryFn::Abs: o = x.abs(); return;
      case UnaryFn::Relu: o = x.max(T(0)); return;
      case UnaryFn::Tanh: o = x.tanh(); return;
      case UnaryFn::Sigmoid: o = (T(1) + (-x).exp()).inverse(); return;
      case UnaryFn::Gelu:
        if constexpr (std::is_same_v<T, float>) return detail::gelu::forward(a.data(), out.data(), a.numel());
        break;
      default: break;
    }
  }
  visit_unary(f, [&](auto k) {
    using M = UnaryMath<decltype(k)::value>;
    if constexpr (std::is_floating_point_v<T> || M::integers) o = x.unaryExpr([](T v) { return M::value(v); });
  });
}

// The backward of out = f(x): dx = f'(x) dy, elementwise (floating types, 16-bit ones
// in float); dx may alias x or dy.
template <class T, int R>
void unary_backward(UnaryFn f, const Tensor<T, R>& x, const Tensor<T, R>& dy, Tensor<T, R>& dx) {
  static_assert(FloatingElement<T> || is_complex_v<T>,
                "compute::unary_backward: derivatives are defined for floating-point tensors only");
  movement::require_same_device(x, dy, "unary_backward");
  movement::require_same_device(x, dx, "unary_backward");
  DTENSOR_CHECK(x.numel() == dy.numel() && x.numel() == dx.numel(), InvalidArgument, "unary_backward of ", name(f),
                ": x, dy and dx hold ", x.numel(), ", ", dy.numel(), " and ", dx.numel(), " elements");
  if (!x.device().is_host())
    return detail::device_backend(x.device())
        .unary_backward(dtype_of<T>(), f, x.data(), dy.data(), dx.data(), x.numel());
  // A plain loop, which the compiler vectorises where the derivative is simple (ReLU's
  // select): Eigen's unaryExpr of a scalar lambda stays scalar. Element i is read
  // before it is written, so dx may alias x or dy.
  const T* xp = x.data();
  const T* gp = dy.data();
  T* op = dx.data();
  const int64_t n = x.numel();
  if constexpr (is_complex_v<T>) {
    // PyTorch's convention for a holomorphic f: dx = conj(f'(x)) dy.
    DTENSOR_CHECK(f == UnaryFn::Neg || f == UnaryFn::Exp, InvalidArgument, "the elementwise function ", name(f),
                  " is not defined for ", name(dtype_of<T>()), " tensors");
    for (int64_t i = 0; i < n; ++i) op[i] = f == UnaryFn::Neg ? -gp[i] : std::conj(std::exp(xp[i])) * gp[i];
    return;
  } else {
  if constexpr (std::is_same_v<T, float>)
    if (f == UnaryFn::Gelu) return detail::gelu::backward(xp, gp, op, n);
  if constexpr (is_float16_v<T>)
    if (f == UnaryFn::Gelu) return detail::gelu::backward_16bit(xp, gp, op, n);
  visit_unary(f, [&](auto k) {
    using M = UnaryMath<decltype(k)::value>;
    if constexpr (is_float16_v<T>)
      map_float16(xp, gp, op, n, [](float v, float g) { return M::derivative(v) * g; });
    else
      for (int64_t i = 0; i < n; ++i) op[i] = M::derivative(xp[i]) * gp[i];
  });
  }
}

// out = conj(a) elementwise (host; out may alias a): the factor complex gradients take.
template <class T, int R>
void conj(const Tensor<T, R>& a, Tensor<T, R>& out) {
  DTENSOR_CHECK(a.device().is_host(), InvalidArgument,
                "conj runs on host blocks (on a device complex elements move, add in reductions and are Fourier "
                "transformed)");
  if constexpr (is_complex_v<T>)
    for (int64_t i = 0; i < a.numel(); ++i) out.data()[i] = std::conj(a.data()[i]);
  else if (out.data() != a.data())
    std::copy_n(a.data(), a.numel(), out.data());
}

// out = m + v, v broadcast along the rows (v(j) added to row i) or the columns.
template <class T>
void add_bias(const Tensor<T, 2>& m, const Tensor<T, 1>& v, bool along_rows, Tensor<T, 2>& out) {
  movement::require_same_device(m, v, "add_bias");
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

// The value of a reduction over no elements (Avg: 0, like Sum).
template <ReduceOp R, class T>
T identity() {
  using L = std::numeric_limits<T>;
  if constexpr (R == ReduceOp::Max) return L::has_infinity ? T(-L::infinity()) : L::lowest();
  else if constexpr (R == ReduceOp::Min) return L::has_infinity ? L::infinity() : L::max();
  else return T{0};
}

// out[o, i] = reduction over j of in[o, j, i] (outer, reduced, inner), in order. An Avg
// sums: the caller divides by the global count (the local len is one shard of it).
// Reducing the last dim of a [rows, cols] block with keepdim is outer = rows, len =
// cols, inner = 1, the output read as [rows, 1]; several adjacent dims reduce at once
// as one len (their product).
// A 16-bit type accumulates in float and is rounded once per output element.
// scale (Sum only) multiplies each result before it is stored: a mean is then
// rounded once, where a 16-bit sum scaled afterwards would round the sum, the scale
// and the product (for float and double the same as scaling after).
template <ReduceOp R, class T>
void reduce_dim(Device d, const T* in, T* out, int64_t outer, int64_t len, int64_t inner,
                std::type_identity_t<accumulator_t<T>> scale = 1) {
  static_assert(R == ReduceOp::Sum || R == ReduceOp::Avg || R == ReduceOp::Max || R == ReduceOp::Min);
  if constexpr (is_complex_v<T>)
    DTENSOR_CHECK(R == ReduceOp::Sum || R == ReduceOp::Avg, InvalidArgument, "a ", name(R), " of ",
                  name(dtype_of<T>()), " elements: complex numbers have no order");
  if (!d.is_host()) {
    if constexpr (!is_complex_v<T>)  // complex blocks are refused by the device (no Scalar holds their scale)
      return detail::device_backend(d).reduce_dim(dtype_of<T>(), R, in, out, outer, len, inner, Scalar::of(scale));
    else
      return detail::device_backend(d).reduce_dim(dtype_of<T>(), R, in, out, outer, len, inner, Scalar{});
  }
  if constexpr (is_float16_v<T>) {
    std::vector<float> acc(static_cast<std::size_t>(inner));
    for (int64_t o = 0; o < outer; ++o) {
      std::fill(acc.begin(), acc.end(), float(identity<R, T>()));
      for (int64_t j = 0; j < len; ++j) {
        const T* src = in + (o * len + j) * inner;
        for (int64_t i = 0; i < inner; ++i) {
          if constexpr (R == ReduceOp::Max) acc[i] = std::max(acc[i], float(src[i]));
          else if constexpr (R == ReduceOp::Min) acc[i] = std::min(acc[i], float(src[i]));
          else acc[i] += src[i];
        }
      }
      for (int64_t i = 0; i < inner; ++i) out[o * inner + i] = T(acc[i] * scale);
    }
    return;
  }
  for (int64_t o = 0; o < outer; ++o) {
    T* dst = out + o * inner;
    std::fill_n(dst, inner, identity<R, T>());
    for (int64_t j = 0; j < len; ++j) {
      const T* src = in + (o * len + j) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        if constexpr (R == ReduceOp::Max && !is_complex_v<T>) dst[i] = std::max(dst[i], src[i]);
        else if constexpr (R == ReduceOp::Min && !is_complex_v<T>) dst[i] = std::min(dst[i], src[i]);
        else dst[i] += src[i];
      }
    }
    if (scale != decltype(scale)(1))
      for (int64_t i = 0; i < inner; ++i) dst[i] *= scale;
  }
}
// The same with the reduction chosen at run time.
template <class T>
void reduce_dim(Device d, ReduceOp r, const T* in, T* out, int64_t outer, int64_t len, int64_t inner) {
  switch (r) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return reduce_dim<ReduceOp::Sum>(d, in, out, outer, len, inner);
    case ReduceOp::Max: return reduce_dim<ReduceOp::Max>(d, in, out, outer, len, inner);
    case ReduceOp::Min: return reduce_dim<ReduceOp::Min>(d, in, out, outer, len, inner);
  }
}

// out[o, j, i] = x[o, j, i] == y[o, i] ? v[o, i] : 0, x and out [outer, len, inner],
// y and v [outer, inner]: the elements equal to their line's extremum take the line's
// value (the backward of max and min over a dim: 1 counts the ties, a gradient's share
// routes it).
template <class T>
void where_equal(Device d, const T* x, const T* y, const T* v, T* out, int64_t outer, int64_t len, int64_t inner) {
  if (!d.is_host()) return detail::device_backend(d).where_equal(dtype_of<T>(), x, y, v, out, outer, len, inner);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < len; ++j)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t e = (o * len + j) * inner + i, line = o * inner + i;
        out[e] = x[e] == y[line] ? v[line] : T(0);
      }
}

// Sum of squares and largest magnitude of all elements, as a host value.
// The sum of squares: in double for the 16-bit types (Eigen's sum would add in 16 bits
// and stall), as the device computes it, rounded once to T.
template <class T, int R>
T sum_squares(const Tensor<T, R>& a) {
  if (!a.device().is_host())
    return detail::convert_element<T>(detail::device_backend(a.device()).sum_squares(dtype_of<T>(), a.data(),
                                                                                       a.numel()));
  if constexpr (is_float16_v<T>) {
    double s = 0;
    for (int64_t i = 0; i < a.numel(); ++i) s += double(float(a.data()[i])) * double(float(a.data()[i]));
    return T::from_double(s);
  } else {
    return as_eigen_array(a).square().sum();
  }
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
  static_assert(!is_float16_v<T>, "compute::softmax_shift: its sums accumulate in T; a 16-bit softmax runs on "
                                  "float values (ops/reduce.hpp's softmax, nn::CrossEntropy widen first)");
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

// --- rows picked by index (embeddings, and the target logit of a loss) ---
//
// A block holds rows [lo, lo + table_rows) of a table sharded over ranks (a vocabulary,
// or the classes of a loss parallel over them): an index outside that range belongs to
// another rank (or is an ignored target, such as -100) and contributes nothing here.
// Indices are int64 on the same device as the data. Negative sizes are errors.

inline void check_row_sizes(int64_t a, int64_t b, int64_t c, const char* fn) {
  DTENSOR_CHECK(a >= 0 && b >= 0 && c >= 0, InvalidArgument, fn, ": negative sizes (", a, ", ", b, ", ", c, ")");
}

// out[i, :] = table[index[i] - lo, :] for index[i] in [lo, lo + table_rows), else
// zeros; table [table_rows, cols], out [rows, cols] (an embedding's masked lookup).
template <class T>
void gather_rows(Device d, const T* table, int64_t table_rows, int64_t cols, const int64_t* index, int64_t rows,
                 int64_t lo, T* out) {
  check_row_sizes(table_rows, cols, rows, "gather_rows");
  if (!d.is_host())
    return detail::device_backend(d).gather_rows(dtype_of<T>(), table, table_rows, cols, index, rows, lo, out);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = index[i] - lo;
    if (r >= 0 && r < table_rows) std::copy_n(table + r * cols, cols, out + i * cols);
    else std::fill_n(out + i * cols, cols, T(0));
  }
}

// table[index[i] - lo, :] += dy[i, :] for the i with index[i] in [lo, lo +
// table_rows); dy [rows, cols], table [table_rows, cols]. The adjoint of gather_rows:
// it accumulates (zero the table first for a fresh gradient), rows in order of i.
template <class T>
void scatter_add_rows(Device d, const T* dy, const int64_t* index, int64_t rows, int64_t cols, int64_t lo, T* table,
                      int64_t table_rows) {
  check_row_sizes(table_rows, cols, rows, "scatter_add_rows");
  if (!d.is_host())
    return detail::device_backend(d).scatter_add_rows(dtype_of<T>(), dy, index, rows, cols, lo, table, table_rows);
  if constexpr (is_float16_v<T>) {
    // A token seen many times adds many rows into one: in float, each table row
    // touched rounded once (a bfloat16 running sum stalls).
    std::vector<float> acc;
    std::vector<int64_t> slot(static_cast<std::size_t>(table_rows), -1);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = index[i] - lo;
      if (r < 0 || r >= table_rows) continue;
      int64_t& at = slot[static_cast<std::size_t>(r)];
      if (at < 0) {
        at = static_cast<int64_t>(acc.size());
        for (int64_t j = 0; j < cols; ++j) acc.push_back(float(table[r * cols + j]));
      }
      for (int64_t j = 0; j < cols; ++j) acc[static_cast<std::size_t>(at + j)] += float(dy[i * cols + j]);
    }
    for (int64_t r = 0; r < table_rows; ++r)
      if (const int64_t at = slot[static_cast<std::size_t>(r)]; at >= 0)
        for (int64_t j = 0; j < cols; ++j) table[r * cols + j] = T(acc[static_cast<std::size_t>(at + j)]);
    return;
  }
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = index[i] - lo;
    if (r < 0 || r >= table_rows) continue;
    T* dst = table + r * cols;
    const T* src = dy + i * cols;
    for (int64_t j = 0; j < cols; ++j) dst[j] += src[j];
  }
}

// out[i] = x[i, target[i] - lo] for target[i] in [lo, lo + cols), else 0; x [rows,
// cols] (a class-sharded block of logits), out [rows] (its share of the target logit).
template <class T>
void take_along_last(Device d, const T* x, int64_t rows, int64_t cols, const int64_t* target, int64_t lo, T* out) {
  check_row_sizes(rows, cols, 0, "take_along_last");
  if (!d.is_host()) return detail::device_backend(d).take_along_last(dtype_of<T>(), x, rows, cols, target, lo, out);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t c = target[i] - lo;
    out[i] = c >= 0 && c < cols ? x[i * cols + c] : T(0);
  }
}

// x[i, target[i] - lo] += g[i] for target[i] in [lo, lo + cols): the adjoint of
// take_along_last (a loss's backward subtracting the one-hot target).
template <class T>
void add_along_last(Device d, const T* g, const int64_t* target, int64_t lo, T* x, int64_t rows, int64_t cols) {
  check_row_sizes(rows, cols, 0, "add_along_last");
  if (!d.is_host()) return detail::device_backend(d).add_along_last(dtype_of<T>(), g, target, lo, x, rows, cols);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t c = target[i] - lo;
    if (c >= 0 && c < cols) x[i * cols + c] += g[i];
  }
}

// --- products ---

// C = alpha op(A) op(B) + beta C for the row-major (batched) matrices that `dims`
// describes (compute/gemm.hpp): transposes are read in place, never copied. With beta
// == 0, C is only written (it may hold garbage or NaN), as in BLAS. Host: OpenBLAS for
// float and double where CMake found it (compute/blas.hpp), else Eigen, any arithmetic
// type; bfloat16 and float16 through oneDNN's matmul (compute/onednn_matmul.hpp), else by
// conversion to one float GEMM; device: cuBLAS (16-bit with float accumulation).
template <class T>
void gemm_float16_by_conversion(const GemmDims& g, T alpha, const T* a, const T* b, T beta, T* c);
template <class T>
void gemm_eigen(const GemmDims& g, T alpha, const T* a, const T* b, T beta, T* c);

template <class T>
void gemm_ex(Device d, const GemmDims& dims, T alpha, const T* a, const T* b, T beta, T* c) {
  const GemmDims g = dims.resolved();
  if (!d.is_host()) {
    if constexpr (FloatingElement<T>) {
      if (g.empty()) return;
      // alpha and beta in the accumulator type: a 16-bit product's are floats.
      using A = accumulator_t<T>;
      return detail::device_backend(d).gemm(dtype_of<T>(), g, Scalar::of(static_cast<A>(alpha)), a, b,
                                            Scalar::of(static_cast<A>(beta)), c);
    } else {
      throw InvalidArgument(detail::cat("dtensor: matrix products on a GPU take floating-point elements, not ",
                                        name(dtype_of<T>())));
    }
  }
  if (g.empty()) return;
  if constexpr (is_float16_v<T>) {
    if (detail::onednn::gemm(g, float(alpha), a, b, float(beta), c)) return;  // compute/onednn_matmul.hpp
    return gemm_float16_by_conversion(g, alpha, a, b, beta, c);
  } else {
    if (g.k > 0 && detail::blas::gemm(g, alpha, a, b, beta, c)) return;  // OpenBLAS where found (compute/blas.hpp)
    gemm_eigen(g, alpha, a, b, beta, c);
  }
}

// The host product of 16-bit matrices where no library multiplies them: A and B
// widened to float (exact), one float GEMM (float accumulation), C rounded once. Only
// the elements the product addresses are read, and only C's m x n written.
template <class T>
void gemm_float16_by_conversion(const GemmDims& g, T alpha, const T* a, const T* b, T beta, T* c) {
  auto span = [&](int64_t stride, int64_t rows, int64_t cols, int64_t ld) {
    return rows == 0 || cols == 0 ? int64_t{0} : (g.batch - 1) * stride + (rows - 1) * ld + cols;
  };
  auto widen = [](const T* p, int64_t n) {
    std::vector<float> w(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) w[static_cast<std::size_t>(i)] = float(p[i]);
    return w;
  };
  const auto af = widen(a, span(g.stride_a, g.a_rows(), g.a_cols(), g.lda));
  const auto bf = widen(b, span(g.stride_b, g.b_rows(), g.b_cols(), g.ldb));
  // C packed as [batch, m, n] in float: beta's term read from c where beta != 0.
  GemmDims fg = g;
  fg.ldc = std::max<int64_t>(1, g.n), fg.stride_c = g.m * fg.ldc;
  std::vector<float> cf(static_cast<std::size_t>(g.batch * g.m * fg.ldc));
  auto each_c = [&](auto&& f) {
    for (int64_t p = 0; p < g.batch; ++p)
      for (int64_t i = 0; i < g.m; ++i)
        for (int64_t j = 0; j < g.n; ++j)
          f(cf[static_cast<std::size_t>((p * g.m + i) * fg.ldc + j)], c[p * g.stride_c + i * g.ldc + j]);
  };
  const float fbeta = float(beta);
  if (fbeta != 0.f) each_c([](float& w, const T& v) { w = float(v); });
  gemm_ex<float>(Device::host(), fg, float(alpha), af.data(), bf.data(), fbeta, cf.data());
  each_c([](const float& w, T& v) { v = T(w); });
}

template <class T>
void gemm_eigen(const GemmDims& g, T alpha, const T* a, const T* b, T beta, T* c) {
  using Stride = Eigen::OuterStride<>;
  using In = Eigen::Map<const EigenRowMatrix<T>, 0, Stride>;
  using Out = Eigen::Map<EigenRowMatrix<T>, 0, Stride>;
  using VecIn = Eigen::Map<const EigenVector<T>, 0, Eigen::InnerStride<>>;
  using VecOut = Eigen::Map<EigenVector<T>, 0, Eigen::InnerStride<>>;
  // beta == 0 writes C without reading it; otherwise C = beta C, then += the product.
  auto store = [&](auto&& cm, const auto& product) {
    if (beta == T(0)) {
      cm.noalias() = alpha * product;
    } else {
      if (beta != T(1)) cm *= beta;
      cm.noalias() += alpha * product;
    }
  };
  for (int64_t p = 0; p < g.batch; ++p) {
    const T* ap = a + p * g.stride_a;
    const T* bp = b + p * g.stride_b;
    T* cp = c + p * g.stride_c;
    if (g.k == 0) {  // an empty sum: C = beta C
      Out cm(cp, g.m, g.n, Stride(g.ldc));
      if (beta == T(0)) cm.setZero();
      else cm *= beta;
      continue;
    }
    In am(ap, g.a_rows(), g.a_cols(), Stride(g.lda));
    if (g.n == 1) {  // matrix-vector (and dot): Eigen's GEMV, not a one-column GEMM
      VecIn bv(bp, g.k, Eigen::InnerStride<>(g.trans_b ? 1 : g.ldb));
      VecOut cv(cp, g.m, Eigen::InnerStride<>(g.ldc));
      if (g.trans_a) store(cv, am.transpose() * bv);
      else store(cv, am * bv);
      continue;
    }
    In bm(bp, g.b_rows(), g.b_cols(), Stride(g.ldb));
    Out cm(cp, g.m, g.n, Stride(g.ldc));
    if (!g.trans_a && !g.trans_b) store(cm, am * bm);
    else if (g.trans_a && !g.trans_b) store(cm, am.transpose() * bm);
    else if (!g.trans_a && g.trans_b) store(cm, am * bm.transpose());
    else store(cm, am.transpose() * bm.transpose());
  }
}

// c[i] = a[i] b[i] for `batch` packed row-major matrices a [m, k], b [k, n] (e: batch,
// m, k, n).
template <class T>
void gemm(Device d, const T* a, const T* b, T* c, const std::array<int64_t, 4>& e) {
  gemm_ex(d, GemmDims{.m = e[1], .n = e[3], .k = e[2], .batch = e[0]}, T(1), a, b, T(0), c);
}

#ifdef DTENSOR_KERNEL_INSTANCE  // compiled once in the compiled runtime (util/compiled_runtime.hpp)
#define DTENSOR_LOCAL_KERNELS(T) \
  DTENSOR_KERNEL_INSTANCE void gemm_ex<T>(Device, const GemmDims&, T, const T*, const T*, T, T*); \
  DTENSOR_KERNEL_INSTANCE void gather_rows<T>(Device, const T*, int64_t, int64_t, const int64_t*, int64_t, \
      int64_t, T*); \
  DTENSOR_KERNEL_INSTANCE void scatter_add_rows<T>(Device, const T*, const int64_t*, int64_t, int64_t, int64_t, \
      T*, int64_t); \
  DTENSOR_KERNEL_INSTANCE void take_along_last<T>(Device, const T*, int64_t, int64_t, const int64_t*, int64_t, T*); \
  DTENSOR_KERNEL_INSTANCE void add_along_last<T>(Device, const T*, const int64_t*, int64_t, T*, int64_t, int64_t);
DTENSOR_LOCAL_KERNELS(float)
DTENSOR_LOCAL_KERNELS(double)
#undef DTENSOR_LOCAL_KERNELS
#endif
}  // namespace dtensor::compute

// The namespace's old name: one `local` held the math and the data movement until both
// were named for their floors (compute::, movement::). Kept for one release; use the
// new names.
namespace dtensor::local {
using namespace ::dtensor::compute;   // NOLINT(google-build-using-namespace)
using namespace ::dtensor::movement;  // NOLINT(google-build-using-namespace)
}  // namespace dtensor::local
