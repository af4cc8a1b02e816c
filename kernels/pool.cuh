#pragma once
// Pooling (compute/pool.hpp) on a GPU, with the host's rules exactly: only the valid
// taps count (inside the block and inside [valid_lo, valid_hi)), max takes the first
// largest tap in tap order (NaN counting as the largest) and gives it the gradient,
// average divides by the counted taps (count_pad: those before count_hi) or by the
// valid ones, a window without a valid tap gives 0. (cuDNN's pooling has no valid range other than its padding, no dilation,
// and leaves the tie rule of its backward unspecified: hence these kernels. Pooling
// reads each input a few times and computes nearly nothing, so one thread per output
// is as fast as the memory allows.)
//
// The backward gathers instead of scattering (no atomics, and the same sums in the
// same order as the host): one thread per input cell adds the dy of each output whose
// window holds it, outputs in ascending order; max first records each output's
// winning tap (pool_argmax_kernel).
#include <cstdint>

#include "dtensor/compute/conv_dims.hpp"
#include "grid.cuh"

namespace dtensor::cuda::kernels::detail {

// PoolDims (resolved) with the spatial dims last, unused ones leading with extent 1.
struct PoolGeo {
  int64_t planes;
  int64_t in[3], out[3], k[3], s[3], dl[3], st[3];
  int64_t vlo[3], vhi[3];                          // valid cells
  int64_t chi[3];                                  // counted cells end (-1: no limit)
  int64_t b[3], e[3];                              // the output box (forward)
  int64_t in_cells, out_cells, box_cells;  // (fields, not functions: device code reads them)
  bool max, count_pad;
};

inline PoolGeo pool_geo(const PoolDims& p, const OutBox& box) {
  const ConvDims& d = p.window;
  PoolGeo g{};
  g.planes = d.batch * d.in_channels;
  const Trailing3 t(d.spatial);
  for (int i = 0; i < 3; ++i) {
    g.in[i] = t.pick(d.in, i, 1), g.out[i] = t.pick(d.out, i, 1), g.k[i] = t.pick(d.kernel, i, 1);
    g.s[i] = t.pick(d.stride, i, 1), g.dl[i] = t.pick(d.dilation, i, 1), g.st[i] = t.pick(d.in_start, i, 0);
    g.vlo[i] = t.pick(p.valid_lo, i, 0), g.vhi[i] = t.pick(p.valid_hi, i, 1), g.chi[i] = t.pick(p.count_hi, i, -1);
    g.b[i] = t.pick(box.begin, i, 0), g.e[i] = t.pick(box.end, i, 1);
  }
  g.in_cells = g.in[0] * g.in[1] * g.in[2], g.out_cells = g.out[0] * g.out[1] * g.out[2];
  g.box_cells = (g.e[0] - g.b[0]) * (g.e[1] - g.b[1]) * (g.e[2] - g.b[2]);
  g.max = p.mode == PoolMode::Max, g.count_pad = p.count_pad;
  return g;
}

DTENSOR_DEVICE inline int64_t pool_floor_div(int64_t a, int64_t b) {  // b > 0
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}
DTENSOR_DEVICE inline int64_t pool_clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

// The taps [lo, hi) of output o along dim i that are valid.
DTENSOR_DEVICE inline void pool_taps(const PoolGeo& g, int i, int64_t o, int64_t& lo, int64_t& hi) {
  const int64_t base = g.st[i] + o * g.s[i];
  lo = pool_clamp(-pool_floor_div(base - g.vlo[i], g.dl[i]), 0, g.k[i]);  // ceil((vlo - base) / dl)
  hi = pool_clamp(-pool_floor_div(base - g.vhi[i], g.dl[i]), lo, g.k[i]);
}

// The cell (in the plane) of output o's tap k.
DTENSOR_DEVICE inline int64_t pool_cell(const PoolGeo& g, const int64_t* o, int64_t k0, int64_t k1, int64_t k2) {
  const int64_t p0 = g.st[0] + o[0] * g.s[0] + k0 * g.dl[0];
  const int64_t p1 = g.st[1] + o[1] * g.s[1] + k1 * g.dl[1];
  const int64_t p2 = g.st[2] + o[2] * g.s[2] + k2 * g.dl[2];
  return (p0 * g.in[1] + p1) * g.in[2] + p2;
}

// Max: the winning tap of output o (its index in the kernel, row-major), or -1.
// Average: the sum of the valid taps, and their count. A (the accumulator) is float
// for a 16-bit T: max compares exactly, average sums in float.
template <class T, class A>
DTENSOR_DEVICE inline int64_t pool_window(const PoolGeo& g, const T* xp, const int64_t* o, A& value, int64_t& count) {
  int64_t lo[3], hi[3];
  for (int i = 0; i < 3; ++i) pool_taps(g, i, o[i], lo[i], hi[i]);
  count = (hi[0] - lo[0]) * (hi[1] - lo[1]) * (hi[2] - lo[2]);
  int64_t arg = -1;
  A acc = A(0);
  for (int64_t k0 = lo[0]; k0 < hi[0]; ++k0)
    for (int64_t k1 = lo[1]; k1 < hi[1]; ++k1)
      for (int64_t k2 = lo[2]; k2 < hi[2]; ++k2) {
        const A v = static_cast<A>(xp[pool_cell(g, o, k0, k1, k2)]);
        if (!g.max) {
          acc = acc + v;
        } else if (arg < 0 || v > acc || (v != v && acc == acc)) {
          arg = (k0 * g.k[1] + k1) * g.k[2] + k2;
          acc = v;
        }
      }
  value = acc;
  return arg;
}

// Average's divisor for output o with `count` valid taps: with count_pad, the taps
// below the counted cells' end (all of them without one), else the valid taps.
template <class T>
DTENSOR_DEVICE inline T pool_divisor(const PoolGeo& g, const int64_t* o, int64_t count) {
  if (!g.count_pad) return T(count);
  int64_t cells = 1;
  for (int i = 0; i < 3; ++i) {
    if (g.chi[i] < 0) {
      cells *= g.k[i];
      continue;
    }
    const int64_t base = g.st[i] + o[i] * g.s[i];  // taps k with base + k dl < chi: ceil((chi - base) / dl)
    cells *= pool_clamp(-pool_floor_div(base - g.chi[i], g.dl[i]), 0, g.k[i]);
  }
  return T(cells);
}

// y[box] = the pooling of x; one thread per output of the box.
template <class T>
DTENSOR_KERNEL void pool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, PoolGeo g, int64_t n) {
  using A = ::dtensor::accumulator_t<T>;
  const int64_t box[3] = {g.e[0] - g.b[0], g.e[1] - g.b[1], g.e[2] - g.b[2]};
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t q[3];
    const int64_t plane = split_cell(e, box, q);
    const int64_t o[3] = {g.b[0] + q[0], g.b[1] + q[1], g.b[2] + q[2]};
    A value;
    int64_t count;
    const int64_t arg = pool_window(g, x + plane * g.in_cells, o, value, count);
    A r;
    if (g.max) {
      r = arg < 0 ? A(0) : value;
    } else {
      const A div = pool_divisor<A>(g, o, count);
      r = div == A(0) ? A(0) : value / div;
    }
    y[plane * g.out_cells + (o[0] * g.out[1] + o[1]) * g.out[2] + o[2]] = static_cast<T>(r);
  }
}

// arg[output] = the winning tap of each output (all of y), for the max backward.
template <class T>
DTENSOR_KERNEL void pool_argmax_kernel(const T* __restrict__ x, int32_t* __restrict__ arg, PoolGeo g, int64_t n) {
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t o[3];
    const int64_t plane = split_cell(e, g.out, o);
    ::dtensor::accumulator_t<T> value;
    int64_t count;
    arg[e] = static_cast<int32_t>(pool_window(g, x + plane * g.in_cells, o, value, count));
  }
}

// dx[cell] = the sum over the outputs whose window holds the cell as a valid tap (max:
// as the winning tap) of their dy (average: over the divisor). One thread per cell of x.
template <class T>
DTENSOR_KERNEL void pool_backward_kernel(const int32_t* __restrict__ arg, const T* __restrict__ dy, T* __restrict__ dx,
                                         PoolGeo g, int64_t n) {
  using A = ::dtensor::accumulator_t<T>;
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t p[3];
    const int64_t plane = split_cell(e, g.in, p);
    A sum = A(0);
    const bool valid = p[0] >= g.vlo[0] && p[0] < g.vhi[0] && p[1] >= g.vlo[1] && p[1] < g.vhi[1] && p[2] >= g.vlo[2] &&
                       p[2] < g.vhi[2];
    if (valid) {
      const T* dyp = dy + plane * g.out_cells;
      const int32_t* ap = arg ? arg + plane * g.out_cells : nullptr;
      // Taps in descending order give the outputs in ascending order along each dim.
      for (int64_t k0 = g.k[0] - 1; k0 >= 0; --k0) {
        const int64_t q0 = p[0] - g.st[0] - k0 * g.dl[0];
        if (q0 < 0 || q0 % g.s[0] != 0 || q0 / g.s[0] >= g.out[0]) continue;
        for (int64_t k1 = g.k[1] - 1; k1 >= 0; --k1) {
          const int64_t q1 = p[1] - g.st[1] - k1 * g.dl[1];
          if (q1 < 0 || q1 % g.s[1] != 0 || q1 / g.s[1] >= g.out[1]) continue;
          for (int64_t k2 = g.k[2] - 1; k2 >= 0; --k2) {
            const int64_t q2 = p[2] - g.st[2] - k2 * g.dl[2];
            if (q2 < 0 || q2 % g.s[2] != 0 || q2 / g.s[2] >= g.out[2]) continue;
            const int64_t o[3] = {q0 / g.s[0], q1 / g.s[1], q2 / g.s[2]};
            const int64_t oi = (o[0] * g.out[1] + o[1]) * g.out[2] + o[2];
            if (g.max) {
              if (ap[oi] == (k0 * g.k[1] + k1) * g.k[2] + k2) sum = sum + static_cast<A>(dyp[oi]);
              continue;
            }
            int64_t count = 1;
            if (!g.count_pad)
              for (int i = 0; i < 3; ++i) {
                int64_t lo, hi;
                pool_taps(g, i, o[i], lo, hi);
                count *= hi - lo;
              }
            sum = sum + static_cast<A>(dyp[oi]) / pool_divisor<A>(g, o, count);
          }
        }
      }
    }
    dx[e] = static_cast<T>(sum);
  }
}

}  // namespace dtensor::cuda::kernels::detail
