#pragma once
// Local data movement on whichever device holds the data: the copies, reductions
// and fills that collectives and redistributions do within one rank. Apart from
// local.hpp so that code which only moves data does not parse Eigen.
#include <algorithm>

#include "dtensor/compute/device_backend.hpp"
#include "dtensor/tensor/tensor.hpp"

namespace dtensor::local {

template <class T, int RA, int RB>
void require_same_device(const Tensor<T, RA>& a, const Tensor<T, RB>& b, const char* op) {
  DTENSOR_CHECK(a.device() == b.device(), InvalidArgument, op, ": one operand lives on ", to_string(a.device()),
                " and the other on ", to_string(b.device()), "; move one with to(Device) first");
}

inline void copy_block(Device d, const void* src, Block sb, void* dst, Block db, std::size_t elem) {
  if (d.is_host()) return detail::copy_block(src, sb, dst, db, elem);
  detail::device_backend(d).copy_block(src, sb, dst, db, elem);
}
inline void reduce_block(Device d, DType t, ReduceOp op, const void* src, Block sb, void* dst, Block db) {
  if (d.is_host()) return detail::reduce_block(t, op, src, sb, dst, db);
  detail::device_backend(d).reduce_block(t, op, src, sb, dst, db);
}
inline void divide_block(Device d, DType t, void* dst, Block db, int terms) {
  if (d.is_host()) return detail::divide_block(t, dst, db, terms);
  detail::device_backend(d).divide_block(t, dst, db, terms);
}
template <class T>
void fill(Device d, T* dst, int64_t n, T value) {
  if (n == 0) return;
  if (d.is_host()) return void(std::fill_n(dst, n, value));
  detail::device_backend(d).fill(dtype_of<T>(), dst, n, Scalar::of(value));
}
template <class T, int R>
void fill(Tensor<T, R>& t, T value) {
  fill(t.device(), t.data(), t.numel(), value);
}

}  // namespace dtensor::local
