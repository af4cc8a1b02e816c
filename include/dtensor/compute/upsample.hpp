#pragma once
// Local upsampling by integer factors: one rank's block, no communication
// (compute/upsample_dims.hpp says what the dims and offsets mean). On the host, plain
// loops over per-dim tables of source indices and weights; on a device, the backend
// table. T is float, double, bfloat16 or float16, on either; the 16-bit ones compute in
// float (the weights, the interpolation and the adjoint's sums, into a float gradient:
// compute/conv.hpp, with_float_gradient) and round each output once.
//
//   upsample_forward   y = nearest or (bi/tri)linear upsampling of x
//   upsample_backward  dx = its adjoint applied to dy: every cell of dx is written,
//                      those no output reads with 0 (a block's ghosts get the terms
//                      their owners must add)
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "dtensor/compute/conv.hpp"
#include "dtensor/compute/upsample_dims.hpp"

namespace dtensor {

namespace detail::upsample {

// What output j (local) of a dim reads: stored inputs i0 and i1 (local to x's block)
// with weights 1 - l and l (nearest: i1 = i0, l = 0).
template <class T>
struct Source {
  int64_t i0, i1;
  T l;
};

// Per dim, the sources of every output of the block, normalised like conv::Geo
// (spatial dims last, unused ones leading with extent 1).
template <class T>
struct Tables {
  std::array<std::vector<Source<T>>, 3> of;
  std::array<int64_t, 3> in, out;
};
template <class T>
const Tables<T>& tables(const UpsampleDims& u) {
  thread_local Tables<T> t;
  const int shift = 3 - u.spatial;
  for (int i = 0; i < 3; ++i) {
    const int d = i - shift;
    auto& v = t.of[i];
    if (d < 0) {
      t.in[i] = t.out[i] = 1;
      v.assign(1, Source<T>{0, 0, T(0)});
      continue;
    }
    t.in[i] = u.in[d], t.out[i] = u.out[d];
    v.resize(static_cast<std::size_t>(u.out[d]));
    const int64_t s = u.scale[d], off = u.in_offset[d];
    for (int64_t j = 0; j < u.out[d]; ++j) {
      const int64_t J = u.out_offset[d] + j;
      const auto r = u.inputs_of(d, J);  // [i0, i1 + 1)
      if (u.mode == UpsampleMode::Nearest) {
        v[j] = {r[0] - off, r[0] - off, T(0)};
        continue;
      }
      // l = src - i0 with src = (2 J + 1 - s) / (2 s), exactly (0 where src is clamped).
      const int64_t num = 2 * J + 1 - s;
      const T l = num <= 0 ? T(0) : T(num - 2 * s * r[0]) / T(2 * s);
      v[j] = {r[0] - off, r[1] - 1 - off, l};
    }
  }
  return t;
}

template <class T>
void forward(const UpsampleDims& u, const T* x, T* y) {
  using A = accumulator_t<T>;
  const Tables<A>& t = tables<A>(u);
  const int64_t in_cells = u.in_cells(), out_cells = u.out_cells();
  const bool linear = u.mode == UpsampleMode::Linear;
  for (int64_t plane = 0; plane < u.batch * u.channels; ++plane) {
    const T* xp = x + plane * in_cells;
    T* yp = y + plane * out_cells;
    for (int64_t j0 = 0; j0 < t.out[0]; ++j0) {
      const Source<A> a = t.of[0][j0];
      for (int64_t j1 = 0; j1 < t.out[1]; ++j1) {
        const Source<A> b = t.of[1][j1];
        T* yr = yp + (j0 * t.out[1] + j1) * t.out[2];
        const T* r00 = xp + (a.i0 * t.in[1] + b.i0) * t.in[2];
        if (!linear) {
          for (int64_t j2 = 0; j2 < t.out[2]; ++j2) yr[j2] = r00[t.of[2][j2].i0];
          continue;
        }
        const T* r01 = xp + (a.i0 * t.in[1] + b.i1) * t.in[2];
        const T* r10 = xp + (a.i1 * t.in[1] + b.i0) * t.in[2];
        const T* r11 = xp + (a.i1 * t.in[1] + b.i1) * t.in[2];
        const A w00 = (1 - a.l) * (1 - b.l), w01 = (1 - a.l) * b.l, w10 = a.l * (1 - b.l), w11 = a.l * b.l;
        for (int64_t j2 = 0; j2 < t.out[2]; ++j2) {
          const Source<A> c = t.of[2][j2];
          const auto along = [&](const T* r) {
            return (1 - c.l) * static_cast<A>(r[c.i0]) + c.l * static_cast<A>(r[c.i1]);
          };
          yr[j2] = static_cast<T>(w00 * along(r00) + w01 * along(r01) + w10 * along(r10) + w11 * along(r11));
        }
      }
    }
  }
}

// dx in G: T, or float for a 16-bit T.
template <class T, class G>
void backward(const UpsampleDims& u, const T* dy, G* dx) {
  std::fill_n(dx, u.x_size(), G(0));
  const Tables<G>& t = tables<G>(u);
  const int64_t in_cells = u.in_cells(), out_cells = u.out_cells();
  const bool linear = u.mode == UpsampleMode::Linear;
  for (int64_t plane = 0; plane < u.batch * u.channels; ++plane) {
    G* xp = dx + plane * in_cells;
    const T* yp = dy + plane * out_cells;
    for (int64_t j0 = 0; j0 < t.out[0]; ++j0) {
      const Source<G> a = t.of[0][j0];
      for (int64_t j1 = 0; j1 < t.out[1]; ++j1) {
        const Source<G> b = t.of[1][j1];
        const T* yr = yp + (j0 * t.out[1] + j1) * t.out[2];
        G* r00 = xp + (a.i0 * t.in[1] + b.i0) * t.in[2];
        if (!linear) {
          for (int64_t j2 = 0; j2 < t.out[2]; ++j2) r00[t.of[2][j2].i0] += static_cast<G>(yr[j2]);
          continue;
        }
        G* r01 = xp + (a.i0 * t.in[1] + b.i1) * t.in[2];
        G* r10 = xp + (a.i1 * t.in[1] + b.i0) * t.in[2];
        G* r11 = xp + (a.i1 * t.in[1] + b.i1) * t.in[2];
        const G w00 = (1 - a.l) * (1 - b.l), w01 = (1 - a.l) * b.l, w10 = a.l * (1 - b.l), w11 = a.l * b.l;
        for (int64_t j2 = 0; j2 < t.out[2]; ++j2) {
          const Source<G> c = t.of[2][j2];
          const G g = static_cast<G>(yr[j2]);
          const auto spread = [&](G* r, G w) {
            r[c.i0] += w * (1 - c.l) * g;
            r[c.i1] += w * c.l * g;
          };
          spread(r00, w00), spread(r01, w01), spread(r10, w10), spread(r11, w11);
        }
      }
    }
  }
}

}  // namespace detail::upsample

namespace compute {

// y = the upsampling of x (nearest or linear per dim, align_corners = false).
template <class T>
void upsample_forward(Device d, const UpsampleDims& dims, const T* x, T* y) {
  detail::conv::check_type<T>();
  dims.validate("upsample_forward");
  if (!d.is_host()) return detail::device_backend(d).upsample_forward(dtype_of<T>(), dims, x, y);
  detail::upsample::forward(dims, x, y);
}

// dx = the adjoint of upsample_forward applied to dy; every cell of dx is written.
template <class T>
void upsample_backward(Device d, const UpsampleDims& dims, const T* dy, T* dx) {
  detail::conv::check_type<T>();
  dims.validate("upsample_backward");
  if (!d.is_host()) return detail::device_backend(d).upsample_backward(dtype_of<T>(), dims, dy, dx);
  detail::conv::with_float_gradient(dx, dims.x_size(), [&](auto* g) { detail::upsample::backward(dims, dy, g); });
}

}  // namespace compute
}  // namespace dtensor
