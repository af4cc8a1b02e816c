#pragma once
// Region: an N-D strided box of a buffer, the unit of point-to-point messages.
//
// A StridedBlock (block.hpp) is one level of strides: enough for a range along one tensor
// dim, which is all a collective moves. A ghost face is not: the W face of an
// [N, C, H, W] block restricted to its interior rows is runs of `w` elements, `H`
// of them per (n, c), with two different strides. A Region is offset + extents +
// strides (in elements, outermost first), like an mdspan's layout_stride mapping,
// so a face, an edge or a corner of any block is one Region and travels in place:
// MPI maps it to nested hvector datatypes, the in-process runtime copies it run by
// run, NCCL packs it on the device.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include "dtensor/core/block.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

inline constexpr int kMaxRegionDims = 8;

struct Region {
  int64_t offset = 0;  // elements from the buffer's start to the first element
  int ndim = 0;        // 0: a single element at `offset`
  std::array<int64_t, kMaxRegionDims> extent{};
  std::array<int64_t, kMaxRegionDims> stride{};  // elements; may be any non-negative values

  constexpr int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= extent[d];
    return n;
  }

  static constexpr Region contiguous(int64_t offset, int64_t n) {
    Region r;
    r.offset = offset, r.ndim = 1, r.extent[0] = n, r.stride[0] = 1;
    return r;
  }

  static constexpr Region of(const StridedBlock& b) {
    Region r;
    r.offset = b.offset, r.ndim = 2;
    r.extent[0] = b.count, r.stride[0] = b.stride;
    r.extent[1] = b.len, r.stride[1] = 1;
    return r;
  }

  // The box [start, start + size) of a row-major array of `shape`.
  template <std::size_t R>
  static constexpr Region box(const std::array<int64_t, R>& shape, const std::array<int64_t, R>& start,
                              const std::array<int64_t, R>& size) {
    static_assert(R <= kMaxRegionDims, "dtensor::Region: at most 8 dimensions");
    Region r;
    r.ndim = static_cast<int>(R);
    int64_t s = 1;
    for (std::size_t d = R; d-- > 0;) {
      r.extent[d] = size[d];
      r.stride[d] = s;
      r.offset += start[d] * s;
      s *= shape[d];
    }
    return r;
  }

  // The same elements in the same order, with as few dims as possible: dims of
  // extent 1 are dropped and a dim whose stride equals the next dim's whole span is
  // merged into it. A region of contiguous elements becomes one dim of stride 1; a
  // face of a row-major block becomes at most two or three dims. An empty region
  // becomes one dim of extent 0.
  constexpr Region simplified() const {
    Region r;
    r.offset = offset;
    if (numel() == 0) {
      r.ndim = 1;
      return r;
    }
    for (int d = 0; d < ndim; ++d) {
      if (extent[d] == 1) continue;
      if (r.ndim > 0 && r.stride[r.ndim - 1] == extent[d] * stride[d]) {
        r.extent[r.ndim - 1] *= extent[d];
        r.stride[r.ndim - 1] = stride[d];
      } else {
        r.extent[r.ndim] = extent[d];
        r.stride[r.ndim] = stride[d];
        ++r.ndim;
      }
    }
    if (r.ndim == 0) r.ndim = 1, r.extent[0] = 1, r.stride[0] = 1;
    return r;
  }

  // Whether the elements are one contiguous run.
  constexpr bool is_contiguous() const {
    const Region s = simplified();
    return s.ndim == 1 && (s.stride[0] == 1 || s.extent[0] <= 1);
  }

  // The same elements as Blocks (one level of strides each), in order: what the
  // device copy kernels take. f(StridedBlock) is called once per outer index.
  template <class F>
  void for_each_block(F&& f) const {
    const Region s = simplified();
    if (s.numel() == 0) return;
    // The last one or two dims form each StridedBlock: two when the innermost elements are
    // adjacent (runs of extent[last]), else one (runs of a single element).
    const bool adjacent = s.stride[s.ndim - 1] == 1;
    if (adjacent && s.ndim == 1) return f(StridedBlock{s.offset, 1, s.extent[0], s.extent[0]});
    const int outer = adjacent ? s.ndim - 2 : s.ndim - 1;  // dims iterated here
    std::array<int64_t, kMaxRegionDims> idx{};
    while (true) {
      int64_t off = s.offset;
      for (int d = 0; d < outer; ++d) off += idx[d] * s.stride[d];
      if (adjacent)
        f(StridedBlock{off, s.extent[outer], s.stride[outer], s.extent[outer + 1]});
      else
        f(StridedBlock{off, s.extent[outer], s.stride[outer], 1});
      int d = outer;
      while (d-- > 0) {
        if (++idx[d] < s.extent[d]) break;
        idx[d] = 0;
      }
      if (d < 0) return;
    }
  }

  friend constexpr bool operator==(const Region& a, const Region& b) {
    if (a.offset != b.offset || a.ndim != b.ndim) return false;
    for (int d = 0; d < a.ndim; ++d)
      if (a.extent[d] != b.extent[d] || a.stride[d] != b.stride[d]) return false;
    return true;
  }
};

inline std::string to_string(const Region& r) {
  std::string s = "Region(offset " + std::to_string(r.offset) + ", extents [";
  for (int d = 0; d < r.ndim; ++d) s += (d ? ", " : "") + std::to_string(r.extent[d]);
  s += "], strides [";
  for (int d = 0; d < r.ndim; ++d) s += (d ? ", " : "") + std::to_string(r.stride[d]);
  return s + "])";
}

namespace detail {

// Calls f(src_offset, dst_offset, n) for stretches of n elements contiguous in both
// regions, walking them in lock-step (equal element counts).
template <class F>
void zip_regions(const Region& src, const Region& dst, F&& f) {
  const int64_t total = src.numel();
  if (total == 0) return;
  // Pair the regions' Blocks up, then zip each pair as block.hpp does. Regions of a
  // halo are of the same box in two buffers, so their Blocks usually pair one to one.
  struct Cursor {
    Region r;
    std::array<int64_t, kMaxRegionDims> idx{};
    int64_t left_in_run = 0, pos = 0;
    int64_t run() const { return r.stride[r.ndim - 1] == 1 ? r.extent[r.ndim - 1] : 1; }
    int outer() const { return r.stride[r.ndim - 1] == 1 ? r.ndim - 1 : r.ndim; }
    int64_t start() const {
      int64_t off = r.offset;
      for (int d = 0; d < outer(); ++d) off += idx[d] * r.stride[d];
      return off;
    }
    void next_run() {
      int d = outer();
      while (d-- > 0) {
        if (++idx[d] < r.extent[d]) break;
        idx[d] = 0;
      }
    }
  };
  Cursor s{src.simplified()}, d{dst.simplified()};
  int64_t s_in = 0, d_in = 0, left = total;  // position within the current run
  int64_t s_base = s.start(), d_base = d.start();
  const int64_t s_run = s.run(), d_run = d.run();
  while (left > 0) {
    const int64_t n = std::min(s_run - s_in, d_run - d_in);
    f(s_base + s_in, d_base + d_in, n);
    left -= n;
    if ((s_in += n) == s_run && left > 0) s_in = 0, s.next_run(), s_base = s.start();
    if ((d_in += n) == d_run && left > 0) d_in = 0, d.next_run(), d_base = d.start();
  }
}

// Two regions of the same extents (the same box in two buffers) with the dims that
// neither needs dropped or merged in both at once, so that their Blocks pair up one
// to one: for_each_block_pair(a, b, f) calls f(block_of_a, block_of_b).
template <class F>
void for_each_block_pair(const Region& a, const Region& b, F&& f) {
  DTENSOR_CHECK(a.ndim == b.ndim, InvalidArgument, "for_each_block_pair: regions of ", a.ndim, " and ", b.ndim,
                " dims");
  Region x, y;
  x.offset = a.offset, y.offset = b.offset;
  for (int d = 0; d < a.ndim; ++d) {
    DTENSOR_CHECK(a.extent[d] == b.extent[d], InvalidArgument, "for_each_block_pair: extents differ: ",
                  to_string(a), " and ", to_string(b));
    if (a.extent[d] == 0) return;
    if (a.extent[d] == 1) continue;
    const int k = x.ndim;
    if (k > 0 && x.stride[k - 1] == a.extent[d] * a.stride[d] && y.stride[k - 1] == b.extent[d] * b.stride[d]) {
      x.extent[k - 1] *= a.extent[d], x.stride[k - 1] = a.stride[d];
      y.extent[k - 1] *= b.extent[d], y.stride[k - 1] = b.stride[d];
    } else {
      x.extent[k] = a.extent[d], x.stride[k] = a.stride[d];
      y.extent[k] = b.extent[d], y.stride[k] = b.stride[d];
      ++x.ndim, ++y.ndim;
    }
  }
  if (x.ndim == 0) return f(StridedBlock{x.offset, 1, 1, 1}, StridedBlock{y.offset, 1, 1, 1});
  // The last dim becomes each StridedBlock's runs when both are unit-stride there.
  const int last = x.ndim - 1;
  const bool adjacent = x.stride[last] == 1 && y.stride[last] == 1;
  const int outer = adjacent ? last - 1 : last;  // dims iterated here (the one below forms the StridedBlock's count)
  if (adjacent && x.ndim == 1)
    return f(StridedBlock::contiguous(x.offset, x.extent[0]), StridedBlock::contiguous(y.offset, y.extent[0]));
  std::array<int64_t, kMaxRegionDims> idx{};
  while (true) {
    int64_t xo = x.offset, yo = y.offset;
    for (int d = 0; d < outer; ++d) xo += idx[d] * x.stride[d], yo += idx[d] * y.stride[d];
    const int64_t len = adjacent ? x.extent[last] : 1;
    f(StridedBlock{xo, x.extent[outer], x.stride[outer], len}, StridedBlock{yo, y.extent[outer], y.stride[outer], len});
    int d = outer;
    while (d-- > 0) {
      if (++idx[d] < x.extent[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

inline bool same_extents(const Region& a, const Region& b) {
  if (a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d)
    if (a.extent[d] != b.extent[d]) return false;
  return true;
}

inline void check_same_numel(const Region& s, const Region& d, const char* op) {
  DTENSOR_CHECK(s.numel() == d.numel(), CommError, op, ": a message of ", s.numel(), " elements meets a region of ",
                d.numel(), "; the ranks disagree on the sizes");
}

// dst[dr] = src[sr], element by element in order (host memory).
inline void copy_region(const void* src, const Region& sr, void* dst, const Region& dr, std::size_t elem) {
  auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  zip_regions(sr, dr, [&](int64_t so, int64_t dof, int64_t n) {
    std::memcpy(d + dof * elem, s + so * elem, static_cast<std::size_t>(n) * elem);
  });
}

// dst[dr] (op)= src[sr] (host memory).
inline void reduce_region(DType t, ReduceOp op, const void* src, const Region& sr, void* dst, const Region& dr) {
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    auto* s = static_cast<const T*>(src);
    auto* d = static_cast<T*>(dst);
    zip_regions(sr, dr, [&](int64_t so, int64_t dof, int64_t n) {
      reduce_into(op, d + dof, s + so, static_cast<std::size_t>(n));
    });
  });
}

}  // namespace detail
}  // namespace dtensor
