#pragma once
// Local data movement on whichever device holds the data: the copies, reductions
// and fills that collectives and redistributions do within one rank, on the host or
// through the device's movement table (tensor/device_movement.hpp). On the tensor
// floor, below comm/, so that the runtimes move data without the math of compute/.
#include <algorithm>
#include <cstring>
#include <vector>

#include "dtensor/core/region.hpp"
#include "dtensor/tensor/device_movement.hpp"
#include "dtensor/tensor/tensor.hpp"

namespace dtensor::detail {
// One element as the device tables take it (a Scalar, 8 bytes). A complex128 element,
// 16 bytes, is never read from one: fills of complex blocks go through device_fill
// below, and every kernel that takes a Scalar refuses complex elements by name.
template <class T>
Scalar device_scalar(T value) {
  if constexpr (sizeof(T) <= sizeof(Scalar)) return Scalar::of(value);
  else return Scalar{};
}

// dst[0, n) = value on device d. The table's fill computes in the element type, which
// complex elements are not (the kernels refuse them): a complex block is cleared as
// bytes when the value is all zero bits, else the value is copied over once and
// repeated (a source block of stride 0).
template <class T>
void device_fill(Device d, T* dst, int64_t n, T value) {
  if (n <= 0) return;
  const auto& be = device_movement(d);
  if constexpr (is_complex_v<T>) {
    const T zero{};
    if (std::memcmp(&value, &zero, sizeof(T)) == 0)
      return memory_space(d).zero(dst, static_cast<std::size_t>(n) * sizeof(T), d.index);
    const Tensor<T, 1> one = Tensor<T, 1>(Shape<1>{1}, std::vector<T>{value}).to(d);
    be.copy_block(one.data(), StridedBlock{0, n, 0, 1}, dst, StridedBlock::contiguous(0, n), sizeof(T));
  } else {
    be.fill(dtype_of<T>(), dst, n, device_scalar(value));
  }
}
}  // namespace dtensor::detail

namespace dtensor::movement {

template <class TA, int RA, class TB, int RB>
void require_same_device(const Tensor<TA, RA>& a, const Tensor<TB, RB>& b, const char* op) {
  DTENSOR_CHECK(a.device() == b.device(), InvalidArgument, op, ": one operand lives on ", to_string(a.device()),
                " and the other on ", to_string(b.device()), "; move one with to(Device) first");
}

inline void copy_block(Device d, const void* src, StridedBlock sb, void* dst, StridedBlock db, std::size_t elem) {
  if (d.is_host()) return detail::copy_block(src, sb, dst, db, elem);
  detail::device_movement(d).copy_block(src, sb, dst, db, elem);
}
inline void reduce_block(Device d, DType t, ReduceOp op, const void* src, StridedBlock sb, void* dst, StridedBlock db) {
  if (d.is_host()) return detail::reduce_block(t, op, src, sb, dst, db);
  detail::device_movement(d).reduce_block(t, op, src, sb, dst, db);
}
inline void divide_block(Device d, DType t, void* dst, StridedBlock db, int terms) {
  if (d.is_host()) return detail::divide_block(t, dst, db, terms);
  detail::device_movement(d).divide_block(t, dst, db, terms);
}
// dst[db] = src[sb] converted from `from` to `to` (floating types; core/block.hpp).
inline void convert_block(Device d, DType from, const void* src, StridedBlock sb, DType to, void* dst,
                          StridedBlock db) {
  detail::check_same_numel(sb, db, "convert_block");
  if (d.is_host()) return detail::convert_block(from, src, sb, to, dst, db);
  detail::device_movement(d).convert_block(from, src, sb, to, dst, db);
}

// dst[db] = the reduction of n sources in order (core/block.hpp's reduce_sources: a
// 16-bit type accumulates in float and is rounded once). On a GPU, pairwise through
// the device's kernels; a 16-bit type there too in a float accumulator, each source
// widened into a float term first (one more pass than a fused kernel would make: the
// in-process runtime's device reductions are its checks' path, NCCL the fast one).
template <class SourceAt>
void reduce_sources(Device d, DType t, ReduceOp op, int n, SourceAt&& source, void* dst, StridedBlock db) {
  if (d.is_host()) return detail::reduce_sources(t, op, n, source, dst, db);
  detail::check_orderable(t, op, "reduction");
  if (n <= 0 || db.numel() == 0) return;
  const auto& be = detail::device_movement(d);
  if (is_float16(t)) {
    const StridedBlock whole = StridedBlock::contiguous(0, db.numel());
    auto acc = Tensor<float, 1>::uninitialized({db.numel()}, d);
    auto term = n > 1 ? Tensor<float, 1>::uninitialized({db.numel()}, d) : Tensor<float, 1>();
    for (int k = 0; k < n; ++k) {
      const auto [src, sb] = source(k);
      be.convert_block(t, src, sb, DType::Float32, k == 0 ? acc.data() : term.data(), whole);
      if (k > 0) be.reduce_block(DType::Float32, op, term.data(), whole, acc.data(), whole);
    }
    if (op == ReduceOp::Avg) be.divide_block(DType::Float32, acc.data(), whole, n);
    be.convert_block(DType::Float32, acc.data(), whole, t, dst, db);
    return;
  }
  const auto [src0, sb0] = source(0);
  if (src0 != dst || !(sb0 == db)) be.copy_block(src0, sb0, dst, db, size_of(t));
  for (int k = 1; k < n; ++k) {
    const auto [src, sb] = source(k);
    be.reduce_block(t, op, src, sb, dst, db);
  }
  if (op == ReduceOp::Avg) be.divide_block(t, dst, db, n);
}
// Regions (core/region.hpp): equal element counts in two buffers of one device. On
// a GPU, regions of the same box go to the StridedBlock kernels a pair of Blocks at a time;
// regions of different shapes (a strided box into a contiguous run) one stretch at a
// time.
inline void copy_region(Device d, const void* src, const Region& sr, void* dst, const Region& dr, std::size_t elem) {
  detail::check_same_numel(sr, dr, "copy_region");
  if (d.is_host()) return detail::copy_region(src, sr, dst, dr, elem);
  const auto& be = detail::device_movement(d);
  if (detail::same_extents(sr, dr))
    return detail::for_each_block_pair(sr, dr,
                                       [&](StridedBlock s, StridedBlock t) { be.copy_block(src, s, dst, t, elem); });
  detail::zip_regions(sr, dr, [&](int64_t so, int64_t dof, int64_t n) {
    be.copy_block(src, StridedBlock::contiguous(so, n), dst, StridedBlock::contiguous(dof, n), elem);
  });
}
inline void reduce_region(Device d, DType t, ReduceOp op, const void* src, const Region& sr, void* dst,
                          const Region& dr) {
  detail::check_same_numel(sr, dr, "reduce_region");
  if (d.is_host()) return detail::reduce_region(t, op, src, sr, dst, dr);
  const auto& be = detail::device_movement(d);
  if (detail::same_extents(sr, dr))
    return detail::for_each_block_pair(sr, dr,
                                       [&](StridedBlock s, StridedBlock b) { be.reduce_block(t, op, src, s, dst, b); });
  detail::zip_regions(sr, dr, [&](int64_t so, int64_t dof, int64_t n) {
    be.reduce_block(t, op, src, StridedBlock::contiguous(so, n), dst, StridedBlock::contiguous(dof, n));
  });
}
// Sets every element of `region` of `dst` to `value`. On a GPU, one launch per StridedBlock:
// `len` copies of the value, then a copy whose source repeats them (stride 0).
template <class T>
void fill_region(Device d, T* dst, const Region& region, T value) {
  if (d.is_host()) {
    region.for_each_block([&](StridedBlock b) {
      for (int64_t r = 0; r < b.count; ++r) std::fill_n(dst + b.offset + r * b.stride, b.len, value);
    });
    return;
  }
  const auto& be = detail::device_movement(d);
  int64_t longest = 0;
  region.for_each_block([&](StridedBlock b) { longest = std::max(longest, b.len); });
  if (longest == 0) return;
  auto pattern = Tensor<T, 1>::uninitialized({longest}, d);
  detail::device_fill(d, pattern.data(), longest, value);
  region.for_each_block([&](StridedBlock b) {
    be.copy_block(pattern.data(), StridedBlock{0, b.count, 0, b.len}, dst, b, sizeof(T));
  });
}

template <class T>
void fill(Device d, T* dst, int64_t n, T value) {
  if (n == 0) return;
  if (d.is_host()) return void(std::fill_n(dst, n, value));
  detail::device_fill(d, dst, n, value);
}
template <class T, int R>
void fill(Tensor<T, R>& t, T value) {
  fill(t.device(), t.data(), t.numel(), value);
}

}  // namespace dtensor::movement
