#pragma once
// The local products and row operations of the layers, on a rank's blocks viewed as
// row-major [rows, cols] matrices (the leading dims of an activation are its rows).
// The host runs Eigen maps (a transposed operand is a transposed map, no copy); a
// device runs the backend's kernels.
#include <cstdint>
#include <utility>
#include <vector>

#include "dtensor/compute/local.hpp"

namespace dtensor::nn::detail {

// A block's sum of squares, in double (a gradient's for clip_grad_norm, a loss's
// difference): Eigen on the host; a device's kernel (float accumulating in double).
template <class T, int R>
double sum_of_squares(const Tensor<T, R>& g) {
  if (!g.device().is_host())
    return dtensor::detail::device_backend(g.device()).sum_squares(dtype_of<T>(), g.data(), g.numel());
  return as_eigen_array(g).template cast<double>().square().sum();
}

// c = op(a) op(b) (+ c when accumulate), op = transpose where asked; a is [m, k]
// after op, b [k, n], c [m, n]. One GEMM with transpose flags (Eigen maps on the
// host, cuBLAS on a GPU): a transposed operand is never copied.
template <class T>
void matmul(Device d, const T* a, bool trans_a, const T* b, bool trans_b, T* c, int64_t m, int64_t n, int64_t k,
            bool accumulate = false) {
  compute::gemm_ex(d, GemmDims{.trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k}, T(1), a, b,
                   accumulate ? T(1) : T(0), c);
}

// y[i, :] += v for every row i of y [rows, cols]. 16-bit on the host: each row through
// compute::map_float16 (widened, added in float, rounded once, by the CPU's widest
// conversions), where Eigen's bfloat16 sum converts each element by scalar code (the
// biases were 5% of a bfloat16 transformer block's step).
template <class T>
void add_row_vector(Device d, T* y, const T* v, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  if constexpr (is_float16_v<T>) {
    if (d.is_host()) {
      for (int64_t i = 0; i < rows; ++i)
        compute::map_float16(y + i * cols, v, y + i * cols, cols, [](float a, float b) { return a + b; });
      return;
    }
  }
  if (d.is_host()) {
    Eigen::Map<EigenRowMatrix<T>> ym(y, rows, cols);
    ym.rowwise() += Eigen::Map<const EigenVector<T>>(v, cols).transpose();
    return;
  }
  dtensor::detail::device_backend(d).add_bias(dtype_of<T>(), y, v, y, rows, cols, true);
}

// s[j] (+)= sum over i of y[i, j], for y [rows, cols].
template <class T>
void column_sums(Device d, const T* y, T* s, int64_t rows, int64_t cols, bool accumulate = false) {
  if (cols == 0) return;
  if constexpr (is_float16_v<T>) {
    if (d.is_host()) {  // a float sum per column, the accumulated value included, rounded once
      std::vector<float> acc(static_cast<std::size_t>(cols));
      for (int64_t j = 0; j < cols; ++j) acc[static_cast<std::size_t>(j)] = accumulate ? float(s[j]) : 0.f;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) acc[static_cast<std::size_t>(j)] += y[i * cols + j];
      for (int64_t j = 0; j < cols; ++j) s[j] = T(acc[static_cast<std::size_t>(j)]);
      return;
    }
    // On a device the same sums, s first: [s (or zeros); y] widened into one float block,
    // reduced over its rows in float (in order, or for many rows a GPU's tree), rounded
    // into s once.
    const StridedBlock head = StridedBlock::contiguous(0, cols), body = StridedBlock::contiguous(cols, rows * cols);
    auto wide = Tensor<float, 1>::uninitialized({(rows + 1) * cols}, d);
    if (accumulate) movement::convert_block(d, dtype_of<T>(), s, head, DType::Float32, wide.data(), head);
    else movement::fill(d, wide.data(), cols, 0.f);
    if (rows > 0)
      movement::convert_block(d, dtype_of<T>(), y, StridedBlock::contiguous(0, rows * cols), DType::Float32,
                              wide.data(), body);
    Tensor<float, 1> sums = Tensor<float, 1>::uninitialized({cols}, d);
    compute::reduce_dim<ReduceOp::Sum>(d, wide.data(), sums.data(), 1, rows + 1, cols);
    movement::convert_block(d, DType::Float32, sums.data(), head, dtype_of<T>(), s, head);
    return;
  }
  if (d.is_host()) {
    Eigen::Map<EigenVector<T>> sm(s, cols);
    if (rows == 0) {
      if (!accumulate) sm.setZero();
      return;
    }
    auto sums = Eigen::Map<const EigenRowMatrix<T>>(y, rows, cols).colwise().sum().transpose();
    if (accumulate) sm += sums;
    else sm = sums;
    return;
  }
  Tensor<T, 1> tmp = Tensor<T, 1>::uninitialized({cols}, d);
  compute::reduce_dim<ReduceOp::Sum>(d, y, tmp.data(), 1, rows, cols);
  if (accumulate) dtensor::detail::device_backend(d).binary(dtype_of<T>(), BinaryOp::Add, s, tmp.data(), s, cols);
  else
    movement::copy_block(d, tmp.data(), StridedBlock::contiguous(0, cols), s, StridedBlock::contiguous(0, cols),
                         sizeof(T));
}

// Rows of an activation block: the product of its leading extents.
template <int Rank>
int64_t rows_of(const Shape<Rank>& s) {
  int64_t r = 1;
  for (int d = 0; d + 1 < Rank; ++d) r *= s[d];
  return r;
}

// A small block's values on the host (copied from a device): the per-row and
// per-channel values that layers work out on the host (a loss's row maxima, a norm's
// weights), beside blocks that stay where they live.
template <class T, int R>
std::vector<T> host_values(const Tensor<T, R>& t) {
  if (t.device().is_host()) return std::vector<T>(t.data(), t.data() + t.numel());
  const Tensor<T, R> h = t.to(Device::host());
  return std::vector<T>(h.data(), h.data() + h.numel());
}
// The same, as doubles (a layer's per-channel or per-feature parameters, worked on the
// host in double).
template <class T, int R>
std::vector<double> host_doubles(const Tensor<T, R>& t) {
  const std::vector<T> v = host_values(t);
  return std::vector<double>(v.begin(), v.end());
}
// Host values as a 1-D tensor on device d.
template <class T>
Tensor<T, 1> values_on(Device d, std::vector<T> v) {
  const auto n = static_cast<int64_t>(v.size());  // before v is moved from
  Tensor<T, 1> h({n}, std::move(v));
  return d.is_host() ? h : h.to(d);
}

}  // namespace dtensor::nn::detail
