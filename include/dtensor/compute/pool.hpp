#pragma once
// Local pooling: one rank's block, no communication (compute/conv_dims.hpp: PoolDims
// says what the window, the padding and the valid cells mean). On the host, plain
// loops; on a device, the backend table. T is float, double, bfloat16 or float16, on
// either (16-bit ones compute in float, the kernels as the loops).
//
//   pool_forward   y[box] = max or average of each window's valid taps (the rest of
//                  y is left alone; average's divisor as PoolDims says)
//   pool_backward  dx = the gradient, recomputed from x (max: the first largest tap
//                  of each window takes its dy); every cell of dx is written
//
// Validity is separable (a tap is valid when it is valid along every dim), so each
// output's valid taps are a box of taps whose bounds along each dim are computed once
// per call: the loops over taps test nothing.
//
// 16-bit tensors compute in float: max pooling compares (exact), average pooling sums
// and divides in float and rounds each output once, and the backward adds the windows'
// shares into a float gradient rounded once per cell (compute/conv.hpp,
// with_float_gradient).
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "dtensor/compute/conv.hpp"

namespace dtensor {

namespace detail::pool {

using conv::Box;
using conv::Geo;
using conv::Range;

// For each dim and each output o of the box: the taps k whose cell st + o s + k dl
// lies in the valid cells [lo, hi) (lo, hi normalised like Geo).
struct Taps {
  std::array<std::vector<Range>, 3> of;  // of[i][o - b[i]]
  const Range& at(int i, int64_t o, const Box& b) const { return of[i][o - b.b[i]]; }
};
inline const Taps& valid_taps(const Geo& g, const Box& b, const std::array<int64_t, 3>& lo,
                              const std::array<int64_t, 3>& hi) {
  thread_local Taps t;
  for (int i = 0; i < 3; ++i) {
    t.of[i].resize(static_cast<std::size_t>(b.extent(i)));
    for (int64_t o = b.b[i]; o < b.e[i]; ++o) {
      const int64_t base = g.st[i] + o * g.s[i];
      // the taps k in [0, kernel) with lo <= base + k dl < hi
      t.of[i][o - b.b[i]] = conv::inside(base, g.dl[i], lo[i], hi[i], 0, g.k[i]);
    }
  }
  return t;
}

// The valid cells of p (resolved), normalised like Geo.
inline std::array<std::array<int64_t, 3>, 2> valid_cells(const PoolDims& p) {
  std::array<std::array<int64_t, 3>, 2> v{};
  const Trailing3 t(p.window.spatial);
  for (int i = 0; i < 3; ++i) v[0][i] = t.pick(p.valid_lo, i, 0), v[1][i] = t.pick(p.valid_hi, i, 1);
  return v;
}

// Average pooling's divisor when the padding counts: per dim, the taps below
// count_hi (all of the kernel where there is no limit), for each output of the box.
struct Counted {
  std::array<std::vector<int64_t>, 3> of;  // of[i][o - b[i]]
  int64_t at(int i, int64_t o, const Box& b) const { return of[i][o - b.b[i]]; }
};
inline const Counted& counted_taps(const PoolDims& p, const Geo& g, const Box& b) {
  thread_local Counted c;
  const Trailing3 t(p.window.spatial);
  for (int i = 0; i < 3; ++i) {
    const int64_t hi = t.pick(p.count_hi, i, -1);
    c.of[i].resize(static_cast<std::size_t>(b.extent(i)));
    for (int64_t o = b.b[i]; o < b.e[i]; ++o) {
      const int64_t base = g.st[i] + o * g.s[i];
      c.of[i][o - b.b[i]] = hi < 0 ? g.k[i] : conv::inside(base, g.dl[i], base, hi, 0, g.k[i]).size();
    }
  }
  return c;
}

// Calls f(cell index in the plane) for each valid tap of output (o0, o1, o2), in tap order.
template <class F>
void for_taps(const Geo& g, const Taps& t, const Box& b, int64_t o0, int64_t o1, int64_t o2, F&& f) {
  const Range r0 = t.at(0, o0, b), r1 = t.at(1, o1, b), r2 = t.at(2, o2, b);
  const int64_t p0 = g.st[0] + o0 * g.s[0], p1 = g.st[1] + o1 * g.s[1], p2 = g.st[2] + o2 * g.s[2];
  for (int64_t k0 = r0.lo; k0 < r0.hi; ++k0)
    for (int64_t k1 = r1.lo; k1 < r1.hi; ++k1) {
      const int64_t row = ((p0 + k0 * g.dl[0]) * g.in[1] + p1 + k1 * g.dl[1]) * g.in[2] + p2;
      for (int64_t k2 = r2.lo; k2 < r2.hi; ++k2) f(row + k2 * g.dl[2]);
    }
}

// The first largest valid tap (NaN counting as the largest), or -1 for none.
template <class T>
int64_t arg_max(const Geo& g, const Taps& t, const Box& b, int64_t o0, int64_t o1, int64_t o2, const T* xp) {
  int64_t arg = -1;
  T best = T(0);
  for_taps(g, t, b, o0, o1, o2, [&](int64_t c) {
    const T v = xp[c];
    if (arg < 0 || v > best || (v != v && best == best)) arg = c, best = v;
  });
  return arg;
}

// Windows whose every tap is valid (all but the border's, usually) take a shorter
// path: the taps' offsets from the window's first cell, computed once per call, and
// the same first-largest rule in the same tap order as arg_max (so the same result).
inline bool full(const Range& r, int64_t k) { return r.lo == 0 && r.hi == k; }
inline const std::vector<int64_t>& tap_offsets(const Geo& g) {
  thread_local std::vector<int64_t> offs;
  offs.clear();
  for (int64_t k0 = 0; k0 < g.k[0]; ++k0)
    for (int64_t k1 = 0; k1 < g.k[1]; ++k1)
      for (int64_t k2 = 0; k2 < g.k[2]; ++k2)
        offs.push_back((k0 * g.dl[0] * g.in[1] + k1 * g.dl[1]) * g.in[2] + k2 * g.dl[2]);
  return offs;
}
inline int64_t window_origin(const Geo& g, int64_t o0, int64_t o1, int64_t o2) {
  return ((g.st[0] + o0 * g.s[0]) * g.in[1] + g.st[1] + o1 * g.s[1]) * g.in[2] + g.st[2] + o2 * g.s[2];
}
// N > 0: a window of N taps, unrolled by the compiler (2x2 windows are most pooling);
// N == 0: any number.
template <int N, class T>
int64_t arg_max_full(const T* xp, int64_t origin, const std::vector<int64_t>& offs) {
  const std::size_t n = N > 0 ? std::size_t{N} : offs.size();
  int64_t arg = origin + offs[0];
  T best = xp[arg];
  for (std::size_t i = 1; i < n; ++i) {
    const int64_t c = origin + offs[i];
    const T v = xp[c];
    if (v > best || (v != v && best == best)) arg = c, best = v;
  }
  return arg;
}
// The outputs [lo, hi) of dim 2 in the box whose windows are fully valid along dim 2:
// one run (validity is monotone in o2 from either end), empty where there is none.
inline std::array<int64_t, 2> full_run(const Geo& g, const Taps& t, const Box& b) {
  int64_t lo = b.b[2];
  while (lo < b.e[2] && !full(t.at(2, lo, b), g.k[2])) ++lo;
  int64_t hi = lo;
  while (hi < b.e[2] && full(t.at(2, hi, b), g.k[2])) ++hi;
  return {lo, hi};
}

// Calls f(o2, the first largest tap) for each output o2 of row (o0, o1) of the box:
// the run of fully valid windows through arg_max_full, the others through arg_max.
template <class T, class F>
void max_row(const Geo& g, const Taps& t, const Box& b, const std::vector<int64_t>& offs,
             const std::array<int64_t, 2>& run, int64_t o0, int64_t o1, const T* xp, F&& f) {
  const bool rows_full = full(t.at(0, o0, b), g.k[0]) && full(t.at(1, o1, b), g.k[1]);
  const int64_t lo = rows_full ? run[0] : b.e[2], hi = rows_full ? run[1] : b.e[2];
  for (int64_t o2 = b.b[2]; o2 < lo; ++o2) f(o2, arg_max(g, t, b, o0, o1, o2, xp));
  int64_t origin = window_origin(g, o0, o1, lo);
  if (offs.size() == 4)
    for (int64_t o2 = lo; o2 < hi; ++o2, origin += g.s[2]) f(o2, arg_max_full<4>(xp, origin, offs));
  else
    for (int64_t o2 = lo; o2 < hi; ++o2, origin += g.s[2]) f(o2, arg_max_full<0>(xp, origin, offs));
  for (int64_t o2 = hi; o2 < b.e[2]; ++o2) f(o2, arg_max(g, t, b, o0, o1, o2, xp));
}

template <class A>
A divisor(const PoolDims& p, const Taps& t, const Counted& c, const Box& b, int64_t o0, int64_t o1, int64_t o2) {
  if (p.count_pad) return A(c.at(0, o0, b) * c.at(1, o1, b) * c.at(2, o2, b));
  return A(t.at(0, o0, b).size() * t.at(1, o1, b).size() * t.at(2, o2, b).size());
}

template <class T>
void forward(const PoolDims& p, const T* x, T* y, const OutBox& box) {
  using A = accumulator_t<T>;
  const Geo g = conv::geo_of(p.window);
  const Box b = conv::box_of(p.window, box);
  if (b.cells() == 0) return;
  const auto v = valid_cells(p);
  const Taps& t = valid_taps(g, b, v[0], v[1]);
  const Counted& counted = counted_taps(p, g, b);
  const std::vector<int64_t>& offs = tap_offsets(g);
  const std::array<int64_t, 2> run = full_run(g, t, b);
  for (int64_t plane = 0; plane < g.batch * g.cin; ++plane) {
    const T* xp = x + plane * g.in_cells;
    T* yp = y + plane * g.out_cells;
    for (int64_t o0 = b.b[0]; o0 < b.e[0]; ++o0)
      for (int64_t o1 = b.b[1]; o1 < b.e[1]; ++o1) {
        T* yr = yp + conv::out_index(g, o0, o1, 0);
        if (p.mode == PoolMode::Max) {
          max_row(g, t, b, offs, run, o0, o1, xp, [&](int64_t o2, int64_t a) { yr[o2] = a < 0 ? T(0) : xp[a]; });
          continue;
        }
        for (int64_t o2 = b.b[2]; o2 < b.e[2]; ++o2) {
          A sum = 0;
          for_taps(g, t, b, o0, o1, o2, [&](int64_t c) { sum += static_cast<A>(xp[c]); });
          const A div = divisor<A>(p, t, counted, b, o0, o1, o2);
          yr[o2] = div == A(0) ? T(0) : static_cast<T>(sum / div);
        }
      }
  }
}

// dx in G: T, or float for a 16-bit T (see the header comment).
template <class T, class G>
void backward(const PoolDims& p, const T* x, const T* dy, G* dx) {
  const Geo g = conv::geo_of(p.window);
  std::fill_n(dx, p.window.x_size(), G(0));
  const Box b = conv::full_box(g);
  if (b.cells() == 0) return;
  const auto v = valid_cells(p);
  const Taps& t = valid_taps(g, b, v[0], v[1]);
  const Counted& counted = counted_taps(p, g, b);
  const std::vector<int64_t>& offs = tap_offsets(g);
  const std::array<int64_t, 2> run = full_run(g, t, b);
  for (int64_t plane = 0; plane < g.batch * g.cin; ++plane) {
    const T* xp = x + plane * g.in_cells;
    const T* dyp = dy + plane * g.out_cells;
    G* dxp = dx + plane * g.in_cells;
    for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < g.out[1]; ++o1) {
        const T* dyr = dyp + conv::out_index(g, o0, o1, 0);
        if (p.mode == PoolMode::Max) {
          max_row(g, t, b, offs, run, o0, o1, xp, [&](int64_t o2, int64_t a) {
            if (a >= 0) dxp[a] += static_cast<G>(dyr[o2]);
          });
          continue;
        }
        for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
          const G div = divisor<G>(p, t, counted, b, o0, o1, o2);
          if (div == G(0)) continue;
          const G share = static_cast<G>(dyr[o2]) / div;
          for_taps(g, t, b, o0, o1, o2, [&](int64_t c) { dxp[c] += share; });
        }
      }
  }
}

}  // namespace detail::pool

namespace compute {

// y[box] = the pooling of x (max or average of each window's valid taps; a window
// without one gives 0); the outputs outside the box are left as they are.
template <class T>
void pool_forward(Device d, const PoolDims& dims, const T* x, T* y, OutBox box = {}) {
  detail::conv::check_type<T>();
  const PoolDims p = dims.resolved("pool_forward");
  const OutBox b = box.resolved(p.window);
  if (!d.is_host()) return detail::device_backend(d).pool_forward(dtype_of<T>(), p, x, y, b);
  detail::pool::forward(p, x, y, b);
}

// dx = the gradient of pool_forward (over all of y) in x, recomputed from x: max
// gives each window's dy to its first largest valid tap, average shares it among the
// valid taps (dy / divisor each). Every cell of dx is written. Only max pooling reads
// x (average pooling may pass nullptr).
template <class T>
void pool_backward(Device d, const PoolDims& dims, const T* x, const T* dy, T* dx) {
  detail::conv::check_type<T>();
  const PoolDims p = dims.resolved("pool_backward");
  if (!d.is_host()) return detail::device_backend(d).pool_backward(dtype_of<T>(), p, x, dy, dx);
  detail::conv::with_float_gradient(dx, p.window.x_size(), [&](auto* g) { detail::pool::backward(p, x, dy, g); });
}

}  // namespace compute
}  // namespace dtensor
