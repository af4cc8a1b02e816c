#pragma once
// Row loops for the solvers: every kernel of include/dtensor/solvers/ walks a box of
// cells one contiguous row (the last, fastest dim) at a time, so that the innermost
// loop is a plain `for (j = 0; j < n; ++j)` over restrict-qualified pointers that the
// compiler vectorizes. This header holds what they share:
//
//   DTENSOR_RESTRICT            __restrict where the compiler has it
//   solver_view(x)              a TensorView of a DTensor's block, a Ghosted's interior,
//                               a Tensor or a view, checked for unit stride
//   for_each_row(shape, f, v...)  f(row pointer of each view..., n) over every row
//   for_each_row_start(shape, f)  f(index of the first cell of each row)
//   for_each_index(shape, f)    f(index) of every cell
//   dot_row(a, b, n)            Σ a[j] b[j] over a row, four partial sums wide
//
// The row kernels themselves are functions whose pointer parameters are
// DTENSOR_RESTRICT and whose loops index them directly: restrict on a pointer that a
// lambda captures by reference is lost, and with it the vectorization.
#include <array>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "dtensor/distributed/dtensor.hpp"
#include "dtensor/halo/ghosted.hpp"
#include "dtensor/tensor/view.hpp"
#include "dtensor/util/error.hpp"

#if defined(__GNUC__) || defined(__clang__) || defined(_MSC_VER)
#define DTENSOR_RESTRICT __restrict
#else
#define DTENSOR_RESTRICT
#endif

namespace dtensor {

namespace detail {

// (The view may live on a device: each kernel then runs through the device table,
// solvers/device_grid.hpp; the host's row loops run on host views only.)
template <class V>
void check_solver_view(const V& v, const char* what) {
  constexpr int R = V::rank;
  DTENSOR_CHECK(v.empty() || v.stride(R - 1) == 1, InvalidArgument, what,
                ": the last dim must be contiguous (stride 1), but its stride is ", v.stride(R - 1));
}

}  // namespace detail

// The cells a kernel writes or reads, as a view with a contiguous last dim.
template <class T, int Rank>
TensorView<T, Rank> solver_view(TensorView<T, Rank> v, const char* what = "solver") {
  detail::check_solver_view(v, what);
  return v;
}
template <class T, int Rank>
TensorView<T, Rank> solver_view(Tensor<T, Rank>& t, const char* what = "solver") {
  return solver_view(TensorView<T, Rank>(t), what);
}
template <class T, int Rank>
TensorView<const T, Rank> solver_view(const Tensor<T, Rank>& t, const char* what = "solver") {
  return solver_view(TensorView<const T, Rank>(t), what);
}
template <class T, int Rank, class... P>
TensorView<T, Rank> solver_view(DTensor<T, Rank, P...>& x, const char* what = "solver") {
  return solver_view(TensorView<T, Rank>(x.local()), what);
}
template <class T, int Rank, class... P>
TensorView<const T, Rank> solver_view(const DTensor<T, Rank, P...>& x, const char* what = "solver") {
  return solver_view(TensorView<const T, Rank>(x.local()), what);
}
template <class T, int Rank, class... P>
TensorView<T, Rank> solver_view(Ghosted<T, Rank, P...>& g, const char* what = "solver") {
  return solver_view(g.interior(), what);
}
template <class T, int Rank, class... P>
TensorView<const T, Rank> solver_view(const Ghosted<T, Rank, P...>& g, const char* what = "solver") {
  return solver_view(g.interior(), what);
}

namespace detail {

// Offset of cell `idx` in a view with strides `s`.
template <int Rank>
inline int64_t offset_of(const Shape<Rank>& idx, const Shape<Rank>& s) {
  int64_t off = 0;
  for (int d = 0; d < Rank; ++d) off += idx[d] * s[d];
  return off;
}

}  // namespace detail

// Calls f(idx) with the first cell of every row of `shape` (its last index 0), in
// row-major order.
template <class S, class F>
void for_each_row_start(const S& shape, F&& f) {
  constexpr int Rank = static_cast<int>(std::tuple_size_v<S>);
  if (numel(shape) == 0) return;
  Shape<Rank> idx{};
  while (true) {
    f(static_cast<const Shape<Rank>&>(idx));
    int d = Rank - 1;
    while (d-- > 0) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// Calls f(idx) for every index of `shape`, in row-major order (a cell at a time: for
// setup and small grids; the kernels go a row at a time).
template <class S, class F>
void for_each_index(const S& shape, F&& f) {
  constexpr int Rank = static_cast<int>(std::tuple_size_v<S>);
  for_each_row_start(shape, [&](const Shape<Rank>& start) {
    Shape<Rank> idx = start;
    for (idx[Rank - 1] = 0; idx[Rank - 1] < shape[Rank - 1]; ++idx[Rank - 1]) f(static_cast<const Shape<Rank>&>(idx));
  });
}

// Calls f(row of v0, row of v1, ..., n) for every row of `shape` (n = shape[Rank-1]).
// Every view must cover `shape` and have a contiguous last dim.
template <class S, class F, class... V>
void for_each_row(const S& shape, F&& f, const V&... views) {
  constexpr int Rank = static_cast<int>(std::tuple_size_v<S>);
  const int64_t n = shape[Rank - 1];
  for_each_row_start(
      shape, [&](const Shape<Rank>& idx) { f((views.data() + detail::offset_of<Rank>(idx, views.strides()))..., n); });
}

// Σ a[j] b[j] for j in [0, n), in double, with four partial sums so that the
// additions of neighbouring j do not wait on each other. The order of the additions
// depends on n only: the same row gives the same sum on any rank.
template <class T>
inline double dot_row(const T* DTENSOR_RESTRICT a, const T* DTENSOR_RESTRICT b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    s0 += static_cast<double>(a[j]) * b[j];
    s1 += static_cast<double>(a[j + 1]) * b[j + 1];
    s2 += static_cast<double>(a[j + 2]) * b[j + 2];
    s3 += static_cast<double>(a[j + 3]) * b[j + 3];
  }
  for (; j < n; ++j) s0 += static_cast<double>(a[j]) * b[j];
  return (s0 + s1) + (s2 + s3);
}

}  // namespace dtensor
