#pragma once
// StridedBlock: a strided region of a buffer, `count` runs of `len` contiguous elements,
// `stride` elements apart, starting at `offset`. Any range along one dimension of a
// row-major tensor is a StridedBlock, which lets every collective read its input and write
// its output in place, with no packing into staging buffers (MPI maps a StridedBlock to
// a vector datatype). Named StridedBlock, not Block: a user's own `using Block = ...`
// beside `using namespace dtensor;` must not collide with a type users never name.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dtensor/core/dtype.hpp"
#include "dtensor/core/float16_arrays.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/core/shape.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

struct StridedBlock {
  int64_t offset = 0;  // elements
  int64_t count = 1;   // runs
  int64_t stride = 0;  // elements between run starts
  int64_t len = 0;     // elements per run

  static constexpr StridedBlock contiguous(int64_t offset, int64_t n) { return {offset, 1, n, n}; }
  constexpr int64_t numel() const { return count * len; }
  constexpr bool is_contiguous() const { return count <= 1 || stride == len; }
  friend constexpr bool operator==(const StridedBlock&, const StridedBlock&) = default;
};

// The block of a row-major tensor of `shape` that holds indices [begin, begin+n) of dim d.
template <std::size_t Rank>
constexpr StridedBlock range_block(const std::array<int64_t, Rank>& shape, int d, int64_t begin, int64_t n) {
  const int64_t inner = inner_size(shape, d);
  return StridedBlock{begin * inner, outer_size(shape, d), shape[d] * inner, n * inner};
}

namespace detail {

// Walks two blocks of equal element count in lock-step, calling f(src_off, dst_off,
// n) for each stretch that is contiguous in both.
template <class F>
inline void zip_runs(const StridedBlock& s, const StridedBlock& d, F&& f) {
  if (s.numel() == 0) return;
  if (s.is_contiguous() && d.is_contiguous()) return f(s.offset, d.offset, s.numel());
  if (s.len == d.len) {
    for (int64_t r = 0; r < s.count; ++r) f(s.offset + r * s.stride, d.offset + r * d.stride, s.len);
    return;
  }
  int64_t sr = 0, si = 0, dr = 0, di = 0;  // run index and position within the run
  int64_t left = s.numel();
  while (left > 0) {
    const int64_t n = std::min(s.len - si, d.len - di);
    f(s.offset + sr * s.stride + si, d.offset + dr * d.stride + di, n);
    left -= n;
    if ((si += n) == s.len) si = 0, ++sr;
    if ((di += n) == d.len) di = 0, ++dr;
  }
}

inline void check_same_numel(const StridedBlock& s, const StridedBlock& d, const char* op) {
  DTENSOR_CHECK(s.numel() == d.numel(), CommError, op, ": a rank sends ", s.numel(),
                " elements where ", d.numel(), " are expected; the ranks disagree on the sizes");
}

// Copies the elements of block `sb` of `src` to block `db` of `dst`, in order.
inline void copy_block(const void* src, const StridedBlock& sb, void* dst, const StridedBlock& db, std::size_t elem) {
  auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  zip_runs(sb, db, [&](int64_t so, int64_t dof, int64_t n) {
    std::memcpy(d + dof * elem, s + so * elem, static_cast<std::size_t>(n) * elem);
  });
}

// Max and Min need an order: refused for complex elements before anything moves (a
// DTensor of them cannot be Partial<Max|Min>; this catches a direct Comm call).
inline void check_orderable(DType t, ReduceOp op, const char* who) {
  DTENSOR_CHECK(!is_complex(t) || op == ReduceOp::Sum || op == ReduceOp::Avg, InvalidArgument, who, ": a ",
                name(op), " of ", name(t), " elements: complex numbers have no order; reduce their magnitudes "
                "(a real tensor) or use a sum");
}

// dst[db] (op)= src[sb], element by element in order.
inline void reduce_block(DType t, ReduceOp op, const void* src, const StridedBlock& sb, void* dst,
                         const StridedBlock& db) {
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    auto* s = static_cast<const T*>(src);
    auto* d = static_cast<T*>(dst);
    zip_runs(sb, db, [&](int64_t so, int64_t dof, int64_t n) {
      reduce_into(op, d + dof, s + so, static_cast<std::size_t>(n));
    });
  });
}

inline void divide_block(DType t, void* dst, const StridedBlock& db, int terms) {
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    auto* d = static_cast<T*>(dst);
    for (int64_t r = 0; r < db.count; ++r) divide_by(d + db.offset + r * db.stride, db.len, terms);
  });
}

// dst[db] = src[sb], each element converted from `from` to `to` (both floating) by
// convert_element (core/float16.hpp): one rounding, to nearest even (each contiguous
// run by convert_array, core/float16_arrays.hpp).
inline void convert_block(DType from, const void* src, const StridedBlock& sb, DType to, void* dst,
                          const StridedBlock& db) {
  DTENSOR_CHECK(is_floating(from) && is_floating(to), InvalidArgument, "convert_block: converts between float32, "
                "float64, bfloat16 and float16, not ", name(from), " to ", name(to));
  visit_floating_dtype(from, [&](auto from_tag) {
    visit_floating_dtype(to, [&](auto to_tag) {
      using F = decltype(from_tag);
      using T = decltype(to_tag);
      auto* s = static_cast<const F*>(src);
      auto* d = static_cast<T*>(dst);
      zip_runs(sb, db, [&](int64_t so, int64_t dof, int64_t n) { convert_array(s + so, d + dof, n); });
    });
  });
}

// dst[db] = the reduction over k = 0..n-1, in that order, of block source(k).second of
// source(k).first: what an in-process collective computes from its ranks' inputs, an
// Avg divided once at the end. A 16-bit type accumulates in float and is rounded once
// (accumulator_t), so its result is the float reduction of the same terms; the other
// types accumulate in place, in their own type. `dst` may be one of the sources only
// if it is source(0) with the same block.
template <class SourceAt>
inline void reduce_sources(DType t, ReduceOp op, int n, SourceAt&& source, void* dst, const StridedBlock& db) {
  check_orderable(t, op, "reduction");
  if (n <= 0 || db.numel() == 0) return;
  if (!is_float16(t)) {
    const auto [src0, sb0] = source(0);
    if (src0 != dst || !(sb0 == db)) copy_block(src0, sb0, dst, db, size_of(t));
    for (int k = 1; k < n; ++k) {
      const auto [src, sb] = source(k);
      reduce_block(t, op, src, sb, dst, db);
    }
    if (op == ReduceOp::Avg) divide_block(t, dst, db, n);
    return;
  }
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_float16_v<T>) {
      const StridedBlock whole = StridedBlock::contiguous(0, db.numel());
      std::vector<float> acc(static_cast<std::size_t>(db.numel()));
      for (int k = 0; k < n; ++k) {
        const auto [src, sb] = source(k);
        const T* s = static_cast<const T*>(src);
        zip_runs(sb, whole, [&](int64_t so, int64_t ao, int64_t len) {
          float* a = acc.data() + ao;
          if (k == 0) {
            for (int64_t i = 0; i < len; ++i) a[i] = s[so + i];
            return;
          }
          switch (op) {
            case ReduceOp::Sum: case ReduceOp::Avg: for (int64_t i = 0; i < len; ++i) a[i] += s[so + i]; break;
            case ReduceOp::Max: for (int64_t i = 0; i < len; ++i) a[i] = std::max(a[i], float(s[so + i])); break;
            case ReduceOp::Min: for (int64_t i = 0; i < len; ++i) a[i] = std::min(a[i], float(s[so + i])); break;
          }
        });
      }
      if (op == ReduceOp::Avg) divide_by(acc.data(), acc.size(), n);
      T* d = static_cast<T*>(dst);
      zip_runs(whole, db, [&](int64_t ao, int64_t dof, int64_t len) {
        for (int64_t i = 0; i < len; ++i) d[dof + i] = T(acc[static_cast<std::size_t>(ao + i)]);
      });
    }
  });
}

}  // namespace detail
}  // namespace dtensor
