#pragma once
// Upsampling by integer factors (compute/upsample.hpp) on a GPU: nearest and linear
// per dim (align_corners = false), with the block's global offsets, by the same
// formulas as the host (compute/upsample_dims.hpp). The forward is one thread per
// output; the backward gathers, one thread per input cell, over the outputs that read
// it (at most 3 x scale per dim), so it needs no atomics.
#include <cstdint>

#include "dtensor/compute/upsample_dims.hpp"
#include "grid.cuh"

namespace dtensor::cuda::kernels::detail {

// UpsampleDims with the spatial dims last, unused ones leading (extent, scale and
// image 1, offsets 0).
struct UpGeo {
  int64_t planes;
  int64_t in[3], out[3], scale[3], in_off[3], out_off[3], image[3];
  int64_t in_cells, out_cells;  // (fields, not functions: device code reads them)
  bool linear;
};

inline UpGeo up_geo(const UpsampleDims& u) {
  UpGeo g{};
  g.planes = u.batch * u.channels;
  const Trailing3 t(u.spatial);
  for (int i = 0; i < 3; ++i) {
    g.in[i] = t.pick(u.in, i, 1), g.out[i] = t.pick(u.out, i, 1), g.scale[i] = t.pick(u.scale, i, 1);
    g.in_off[i] = t.pick(u.in_offset, i, 0), g.out_off[i] = t.pick(u.out_offset, i, 0);
    g.image[i] = t.used(i) ? u.global_in_of(t.dim(i)) : 1;
  }
  g.in_cells = g.in[0] * g.in[1] * g.in[2], g.out_cells = g.out[0] * g.out[1] * g.out[2];
  g.linear = u.mode == UpsampleMode::Linear;
  return g;
}

// Global output J of dim i reads global inputs i0 and i1 with weights 1 - l and l.
template <class T>
DTENSOR_DEVICE inline void up_source(const UpGeo& g, int i, int64_t J, int64_t& i0, int64_t& i1, T& l) {
  const int64_t s = g.scale[i];
  if (!g.linear) {
    i0 = i1 = J / s;
    l = T(0);
    return;
  }
  const int64_t num = 2 * J + 1 - s;  // src = num / (2 s), clamped at 0
  i0 = num <= 0 ? 0 : num / (2 * s);
  i1 = i0 + 1 < g.image[i] ? i0 + 1 : g.image[i] - 1;
  l = num <= 0 ? T(0) : T(num - 2 * s * i0) / T(2 * s);
}

// A 16-bit T computes in float (A) and rounds each output once, as the host does.
template <class T>
DTENSOR_KERNEL void upsample_forward_kernel(const T* __restrict__ x, T* __restrict__ y, UpGeo g, int64_t n) {
  using A = ::dtensor::accumulator_t<T>;
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t j[3];
    const int64_t plane = split_cell(e, g.out, j);
    int64_t a0[3], a1[3];
    A l[3];
    for (int i = 0; i < 3; ++i) {
      up_source(g, i, g.out_off[i] + j[i], a0[i], a1[i], l[i]);
      a0[i] -= g.in_off[i], a1[i] -= g.in_off[i];
    }
    const T* xp = x + plane * g.in_cells;
    const T* r00 = xp + (a0[0] * g.in[1] + a0[1]) * g.in[2];
    if (!g.linear) {
      y[e] = r00[a0[2]];
      continue;
    }
    const T* r01 = xp + (a0[0] * g.in[1] + a1[1]) * g.in[2];
    const T* r10 = xp + (a1[0] * g.in[1] + a0[1]) * g.in[2];
    const T* r11 = xp + (a1[0] * g.in[1] + a1[1]) * g.in[2];
    // The host's expression, term for term.
    const A w00 = (1 - l[0]) * (1 - l[1]), w01 = (1 - l[0]) * l[1], w10 = l[0] * (1 - l[1]), w11 = l[0] * l[1];
    const A c0 = 1 - l[2], c1 = l[2];
    auto v = [](const T* r, int64_t k) { return static_cast<A>(r[k]); };
    y[e] = static_cast<T>(w00 * (c0 * v(r00, a0[2]) + c1 * v(r00, a1[2])) +
                          w01 * (c0 * v(r01, a0[2]) + c1 * v(r01, a1[2])) +
                          w10 * (c0 * v(r10, a0[2]) + c1 * v(r10, a1[2])) +
                          w11 * (c0 * v(r11, a0[2]) + c1 * v(r11, a1[2])));
  }
}

// The weight with which global output J reads global input I along dim i.
template <class T>
DTENSOR_DEVICE inline T up_weight(const UpGeo& g, int i, int64_t J, int64_t I) {
  int64_t i0, i1;
  T l;
  up_source(g, i, J, i0, i1, l);
  return (i0 == I ? 1 - l : T(0)) + (i1 == I ? l : T(0));
}

// The block's outputs [lo, hi) along dim i that may read global input I.
DTENSOR_DEVICE inline void up_readers(const UpGeo& g, int i, int64_t I, int64_t& lo, int64_t& hi) {
  const int64_t s = g.scale[i];
  lo = g.linear ? (I - 1) * s : I * s;
  hi = g.linear ? (I + 2) * s : (I + 1) * s;
  if (lo < g.out_off[i]) lo = g.out_off[i];
  if (hi > g.out_off[i] + g.out[i]) hi = g.out_off[i] + g.out[i];
}

template <class T>
DTENSOR_KERNEL void upsample_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, UpGeo g, int64_t n) {
  using A = ::dtensor::accumulator_t<T>;
  for (int64_t e = first(); e < n; e += stride()) {
    int64_t p[3];
    const int64_t plane = split_cell(e, g.in, p);
    int64_t lo[3], hi[3], I[3];
    for (int i = 0; i < 3; ++i) {
      I[i] = g.in_off[i] + p[i];
      up_readers(g, i, I[i], lo[i], hi[i]);
    }
    const T* dyp = dy + plane * g.out_cells;
    A sum = A(0);
    for (int64_t J0 = lo[0]; J0 < hi[0]; ++J0) {
      const A w0 = up_weight<A>(g, 0, J0, I[0]);
      if (w0 == A(0)) continue;
      for (int64_t J1 = lo[1]; J1 < hi[1]; ++J1) {
        const A w1 = up_weight<A>(g, 1, J1, I[1]);
        if (w1 == A(0)) continue;
        const int64_t row = ((J0 - g.out_off[0]) * g.out[1] + J1 - g.out_off[1]) * g.out[2] - g.out_off[2];
        for (int64_t J2 = lo[2]; J2 < hi[2]; ++J2) {
          const A w2 = up_weight<A>(g, 2, J2, I[2]);
          if (w2 != A(0)) sum = sum + w0 * w1 * w2 * static_cast<A>(dyp[row + J2]);
        }
      }
    }
    dx[e] = static_cast<T>(sum);
  }
}

}  // namespace dtensor::cuda::kernels::detail
