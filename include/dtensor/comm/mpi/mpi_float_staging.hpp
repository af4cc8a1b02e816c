#pragma once
// Float staging: how the MPI runtime reduces bfloat16 and float16.
//
// dtensor's rule for a reduction of a 16-bit type is to accumulate in float and round
// once (core/float16.hpp's accumulator_t; the in-process runtime's reduce_sources). MPI
// has no 16-bit float type to add (Open MPI 4.1 has none): mpi_types.hpp moves them as
// MPI_UINT16_T bits, right for every collective that only moves data, but MPI_SUM on
// them would add bit patterns as integers. So a reduction widens its input into a float
// buffer, MPI reduces that with MPI_FLOAT, and the result is rounded back once: a sum of
// n terms is the float sum of the same terms, in MPI's order, rounded once. An Avg is
// divided in float before that rounding, as in-process. Max and Min are exact either way.
//
// The cost: twice the bytes on the wire and a conversion each way. A user-defined
// MPI_Op on the 16-bit bits halves the bytes but rounds at every step of MPI's
// reduction tree, which is not this rule (bench/README.md, "16-bit all-reduce").
#include <cstddef>
#include <cstdint>
#include <span>

#include "dtensor/core/block.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/float16.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::detail {

// Calls f(T{}) with T = bfloat16 or float16, the C++ type of `t`.
template <class F>
void visit_float16(DType t, F&& f) {
  DTENSOR_CHECK(is_float16(t), InvalidArgument, "float staging of ", name(t),
                ": only bfloat16 and float16 are reduced through float");
  if (t == DType::BFloat16) f(bfloat16{});
  else f(float16{});
}

// dst[0, b.numel()) = the elements of block `b` of `src` (16-bit type `t`), as floats
// (exact: every 16-bit value is a float).
inline void widen_to_float(DType t, const void* src, const StridedBlock& b, float* dst) {
  visit_float16(t, [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(src);
    zip_runs(b, StridedBlock::contiguous(0, b.numel()), [&](int64_t so, int64_t dof, int64_t n) {
      for (int64_t i = 0; i < n; ++i) dst[dof + i] = float(s[so + i]);
    });
  });
}

// Block `b` of `dst` = src[0, b.numel()), each rounded once to `t` (nearest even).
inline void narrow_from_float(DType t, const float* src, void* dst, const StridedBlock& b) {
  visit_float16(t, [&](auto tag) {
    using T = decltype(tag);
    T* d = static_cast<T*>(dst);
    zip_runs(StridedBlock::contiguous(0, b.numel()), b, [&](int64_t so, int64_t dof, int64_t n) {
      for (int64_t i = 0; i < n; ++i) d[dof + i] = T(src[so + i]);
    });
  });
}

// What follows MPI's reduction of the staged floats of `terms` ranks, before the one
// rounding: an Avg's division, in float (as reduce_sources divides its accumulator).
inline void finish_in_float(ReduceOp op, std::span<float> acc, int terms) {
  if (op == ReduceOp::Avg) divide_by(acc.data(), acc.size(), terms);
}

}  // namespace dtensor::detail
