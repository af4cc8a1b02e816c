#pragma once
// Local convolution: one rank's block, no communication (compute/conv_dims.hpp says
// what the dims mean). On the host, float through oneDNN where CMake found it
// (compute/onednn_conv.hpp; onednn::preferred() names the passes left to our own code)
// and everything else through the host algorithms below; on a device, the backend
// table (cuDNN in the CUDA backend). T is float, double, bfloat16 or float16, on either.
//
// 16-bit tensors never accumulate in 16 bits: oneDNN's 16-bit primitives where it has
// them (bfloat16 on CPUs with AVX-512; compute/onednn_conv.hpp), else the conversion
// path below: the operands widened to float (exact), the float convolution (oneDNN's
// or the host algorithms), each result rounded once (a weight gradient that
// accumulates: the old value added in float, then rounded). The bias gradient sums in
// double and rounds once.
//
//   conv_forward          y[box] = conv(x, w) + bias      (the rest of y is left alone)
//   conv_backward_data    dx = conv^T(dy, w)               (every cell of dx written)
//   conv_backward_weight  dw (+)= the weight gradient      (accumulate: add to dw)
//   conv_backward_bias    db (+)= dy summed over batch and space
//
// Host algorithms. Each product has two: im2col + GEMM (per sample, group and chunk
// of output cells: the columns [C/g * kernel_cells, chunk] gathered, then one GEMM
// through compute::gemm_ex) and a direct loop (rows of the last spatial dim, their
// bounds computed once per tap so the inner loop has no test and vectorises for stride
// 1). detail::conv::choose() picks one per pass from the channels per group;
// bench/bench_conv_local.cpp measures both in the same run, and the numbers behind
// the rule are in choose()'s comment.
//
// Scratch: the im2col columns, a GEMM output for boxes that are not contiguous in y,
// and the direct loops' row accumulators live in thread_local buffers kept between
// calls (grown, never shrunk): no allocation per call once warm, and each rank's
// thread (or a device stream's worker) has its own. The columns are cut into chunks of
// about kColBytes (256 KiB, half an L2 cache: the gather's output is still in cache
// when the GEMM packs it) but at least kMinChunk cells, so the buffers stay near
// 256 KiB per thread and element type whatever the image size (the direct backward
// weight's accumulators: C/g * kernel_cells rows of the last spatial extent).
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "dtensor/compute/conv_dims.hpp"
#include "dtensor/compute/convert.hpp"
#include "dtensor/compute/device_backend.hpp"
#include "dtensor/compute/local.hpp"
#include "dtensor/compute/onednn_conv.hpp"
#include "dtensor/compute/row_stats.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor {

namespace detail::conv {

inline int64_t floor_div(int64_t a, int64_t b) {  // b > 0
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}
inline int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

// The outputs o of [b, e) whose tap, at start + o * s, falls in [lo, hi).
struct Range {
  int64_t lo, hi;
  int64_t size() const { return hi - lo; }
};
// Empty ranges still lie inside [b, e], so that b <= lo <= hi <= e always.
inline Range inside(int64_t start, int64_t s, int64_t lo, int64_t hi, int64_t b, int64_t e) {
  const int64_t first = std::clamp(ceil_div(lo - start, s), b, e);
  return {first, std::clamp(ceil_div(hi - start, s), first, e)};
}

// A ConvDims with its spatial dims moved last (unused dims lead, extent 1): the
// memory layout is the same, and the innermost loops always run along the last used
// dim, which is contiguous.
struct Geo {
  int64_t batch, cin, cout, groups, cg, cog;
  std::array<int64_t, 3> in, out, k, s, dl, st;
  int64_t in_cells, out_cells, kcells;
  int64_t rows() const { return cg * kcells; }  // of the im2col columns
};
inline Geo geo_of(const ConvDims& d) {
  Geo g;
  g.batch = d.batch, g.cin = d.in_channels, g.cout = d.out_channels, g.groups = d.groups;
  g.cg = d.in_channels / d.groups, g.cog = d.out_channels / d.groups;
  const Trailing3 t(d.spatial);
  for (int i = 0; i < 3; ++i) {
    g.in[i] = t.pick(d.in, i, 1), g.out[i] = t.pick(d.out, i, 1), g.k[i] = t.pick(d.kernel, i, 1);
    g.s[i] = t.pick(d.stride, i, 1), g.dl[i] = t.pick(d.dilation, i, 1), g.st[i] = t.pick(d.in_start, i, 0);
  }
  g.in_cells = d.in_cells(), g.out_cells = d.out_cells(), g.kcells = d.kernel_cells();
  return g;
}

// The outputs computed, in the same order as Geo.
struct Box {
  std::array<int64_t, 3> b, e;
  int64_t extent(int i) const { return e[i] - b[i]; }
  int64_t cells() const { return extent(0) * extent(1) * extent(2); }
};
inline Box box_of(const ConvDims& d, const OutBox& resolved) {
  Box x;
  const Trailing3 t(d.spatial);
  for (int i = 0; i < 3; ++i) x.b[i] = t.pick(resolved.begin, i, 0), x.e[i] = t.pick(resolved.end, i, 1);
  return x;
}
inline Box full_box(const Geo& g) { return Box{{0, 0, 0}, g.out}; }
// Whether the box's cells, in order, are consecutive in y (then a GEMM writes y in place).
inline bool contiguous(const Geo& g, const Box& x) {
  int i = 0;
  while (i < 3 && x.extent(i) <= 1) ++i;
  for (int j = i + 1; j < 3; ++j)
    if (x.b[j] != 0 || x.e[j] != g.out[j]) return false;
  return true;
}
inline int64_t out_index(const Geo& g, int64_t o0, int64_t o1, int64_t o2) {
  return (o0 * g.out[1] + o1) * g.out[2] + o2;
}

// Per-thread buffers, kept between calls (see the header comment).
template <class T, int Slot>
T* scratch(std::size_t n) {
  thread_local std::vector<T> v;
  if (v.size() < n) v.resize(n);
  return v.data();
}

// A run of consecutive outputs along the last dim, inside one chunk of the box's cells,
// with the outputs of the run each last-dim tap k2 reads inside the block (taps[k2]).
struct Segment {
  int64_t o0, o1, b2, e2, pos;  // pos: its first column in the chunk
  const Range* taps;
};
// The segments of cells [c0, c0 + nc) of the box. Their tap ranges are computed here,
// once per chunk: the gathers below then divide nothing (a boundary strip one cell wide
// has a segment per cell, and per-cell divisions would cost more than its GEMM).
inline const std::vector<Segment>& segments(const Geo& g, const Box& x, int64_t c0, int64_t nc) {
  thread_local std::vector<Segment> segs;
  thread_local std::vector<Range> ranges;
  segs.clear();
  const int64_t E1 = x.extent(1), E2 = x.extent(2);
  for (int64_t pos = 0, c = c0; pos < nc;) {
    const int64_t r = c / E2, o2 = x.b[2] + c % E2;
    const int64_t len = std::min(x.e[2] - o2, nc - pos);
    segs.push_back({x.b[0] + r / E1, x.b[1] + r % E1, o2, o2 + len, pos, nullptr});
    pos += len, c += len;
  }
  ranges.resize(segs.size() * static_cast<std::size_t>(g.k[2]));
  for (std::size_t i = 0; i < segs.size(); ++i) {
    Range* t = ranges.data() + i * static_cast<std::size_t>(g.k[2]);
    for (int64_t k2 = 0; k2 < g.k[2]; ++k2)
      t[k2] = inside(g.st[2] + k2 * g.dl[2], g.s[2], 0, g.in[2], segs[i].b2, segs[i].e2);
    segs[i].taps = t;
  }
  return segs;
}

// The columns of a chunk: col[(ci, k0, k1, k2), j] = the input that tap reads for the
// chunk's j-th output, or 0 outside the block. x: the group's first channel of one sample.
template <class T>
void im2col(const Geo& g, const std::vector<Segment>& segs, int64_t nc, const T* x, T* col) {
  int64_t r = 0;
  for (int64_t ci = 0; ci < g.cg; ++ci) {
    const T* xc = x + ci * g.in_cells;
    for (int64_t k0 = 0; k0 < g.k[0]; ++k0)
      for (int64_t k1 = 0; k1 < g.k[1]; ++k1)
        for (int64_t k2 = 0; k2 < g.k[2]; ++k2, ++r) {
          T* row = col + r * nc;
          const int64_t t2 = g.st[2] + k2 * g.dl[2];
          for (const Segment& sg : segs) {
            T* dst = row + sg.pos;  // dst[o2 - b2]
            const int64_t len = sg.e2 - sg.b2;
            const int64_t p0 = g.st[0] + sg.o0 * g.s[0] + k0 * g.dl[0];
            const int64_t p1 = g.st[1] + sg.o1 * g.s[1] + k1 * g.dl[1];
            const Range v = sg.taps[k2];
            if (p0 < 0 || p0 >= g.in[0] || p1 < 0 || p1 >= g.in[1] || v.lo == v.hi) {
              for (int64_t j = 0; j < len; ++j) dst[j] = T(0);
              continue;
            }
            // The first input read, and the outputs [lead, lead + n) of the run that read inside.
            const T* xr = xc + (p0 * g.in[1] + p1) * g.in[2] + t2 + v.lo * g.s[2];
            const int64_t lead = v.lo - sg.b2, n = v.size();
            for (int64_t j = 0; j < lead; ++j) dst[j] = T(0);
            T* d = dst + lead;
            if (g.s[2] == 1)
              for (int64_t j = 0; j < n; ++j) d[j] = xr[j];
            else
              for (int64_t j = 0; j < n; ++j) d[j] = xr[j * g.s[2]];
            for (int64_t j = lead + n; j < len; ++j) dst[j] = T(0);
          }
        }
  }
}

// The adjoint of im2col: dx[the input each tap reads] += col (reads outside the block dropped).
template <class T>
void col2im(const Geo& g, const std::vector<Segment>& segs, int64_t nc, const T* col, T* dx) {
  int64_t r = 0;
  for (int64_t ci = 0; ci < g.cg; ++ci) {
    T* xc = dx + ci * g.in_cells;
    for (int64_t k0 = 0; k0 < g.k[0]; ++k0)
      for (int64_t k1 = 0; k1 < g.k[1]; ++k1)
        for (int64_t k2 = 0; k2 < g.k[2]; ++k2, ++r) {
          const T* row = col + r * nc;
          const int64_t t2 = g.st[2] + k2 * g.dl[2];
          for (const Segment& sg : segs) {
            const int64_t p0 = g.st[0] + sg.o0 * g.s[0] + k0 * g.dl[0];
            const int64_t p1 = g.st[1] + sg.o1 * g.s[1] + k1 * g.dl[1];
            const Range v = sg.taps[k2];
            if (p0 < 0 || p0 >= g.in[0] || p1 < 0 || p1 >= g.in[1] || v.lo == v.hi) continue;
            const T* src = row + sg.pos + (v.lo - sg.b2);
            T* xr = xc + (p0 * g.in[1] + p1) * g.in[2] + t2 + v.lo * g.s[2];
            const int64_t n = v.size();
            if (g.s[2] == 1)
              for (int64_t j = 0; j < n; ++j) xr[j] += src[j];
            else
              for (int64_t j = 0; j < n; ++j) xr[j * g.s[2]] += src[j];
          }
        }
  }
}

// Columns per chunk: about kColBytes of them, at least kMinChunk cells (a GEMM much
// narrower wastes its blocking), never more than the box. 128 KiB to 1 MiB measured
// within noise of each other (3x3, 16 -> 16, 64 x 64 and 256 x 256).
inline constexpr int64_t kColBytes = int64_t{1} << 18;
inline constexpr int64_t kMinChunk = 64;
template <class T>
int64_t chunk_cells(const Geo& g, int64_t cells) {
  const int64_t want = std::max<int64_t>(kMinChunk, kColBytes / (int64_t(sizeof(T)) * g.rows()));
  return std::max<int64_t>(1, std::min(want, cells));
}

// --- forward ---

template <class T>
void forward_gemm(const Geo& g, const Box& x, const T* in, const T* w, const T* bias, T* y) {
  const int64_t cells = x.cells(), chunk = chunk_cells<T>(g, cells);
  const bool in_place = contiguous(g, x);
  const int64_t first = out_index(g, x.b[0], x.b[1], x.b[2]);
  T* col = scratch<T, 0>(static_cast<std::size_t>(g.rows() * chunk));
  T* buf = in_place ? nullptr : scratch<T, 1>(static_cast<std::size_t>(g.cog * chunk));
  for (int64_t c0 = 0; c0 < cells; c0 += chunk) {
    const int64_t nc = std::min(chunk, cells - c0);
    const auto& segs = segments(g, x, c0, nc);
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        im2col(g, segs, nc, in + (n * g.cin + grp * g.cg) * g.in_cells, col);
        T* yg = y + (n * g.cout + grp * g.cog) * g.out_cells;
        const T* wg = w + grp * g.cog * g.rows();
        T* c = in_place ? yg + first + c0 : buf;
        const int64_t ldc = in_place ? g.out_cells : nc;
        compute::gemm_ex(Device::host(), GemmDims{.m = g.cog, .n = nc, .k = g.rows(), .ldb = nc, .ldc = ldc}, T(1), wg,
                         col, T(0), c);
        for (int64_t co = 0; co < g.cog; ++co) {
          const T b = bias ? bias[grp * g.cog + co] : T(0);
          if (in_place) {
            if (bias)
              for (int64_t j = 0; j < nc; ++j) c[co * ldc + j] += b;
            continue;
          }
          for (const Segment& sg : segs) {
            T* dst = yg + co * g.out_cells + out_index(g, sg.o0, sg.o1, sg.b2);
            const T* src = buf + co * nc + sg.pos;
            for (int64_t j = 0; j < sg.e2 - sg.b2; ++j) dst[j] = src[j] + b;
          }
        }
      }
  }
}

// The taps of one output row (o0, o1, [b2, e2) along the last dim) of one sample and
// group: for each input channel ci of the group (xg: the group's first channel) and
// each kernel offset (k0, k1, k2) that reads inside the input, f(tap, xr, v), with tap
// the weight's index ((ci, k0, k1, k2) flattened), v the outputs along the last dim
// it reaches, and xr the input element the first of them reads (the next ones are
// g.s[2] apart). What the direct forward, the data gradient (which writes through xr:
// Ptr is then T*) and the weight gradient all walk.
template <class Ptr, class F>
void for_each_tap_row(const Geo& g, Ptr xg, int64_t o0, int64_t o1, int64_t b2, int64_t e2, F&& f) {
  for (int64_t ci = 0; ci < g.cg; ++ci) {
    const Ptr xc = xg + ci * g.in_cells;
    for (int64_t k0 = 0; k0 < g.k[0]; ++k0) {
      const int64_t p0 = g.st[0] + o0 * g.s[0] + k0 * g.dl[0];
      if (p0 < 0 || p0 >= g.in[0]) continue;
      for (int64_t k1 = 0; k1 < g.k[1]; ++k1) {
        const int64_t p1 = g.st[1] + o1 * g.s[1] + k1 * g.dl[1];
        if (p1 < 0 || p1 >= g.in[1]) continue;
        const Ptr xr0 = xc + (p0 * g.in[1] + p1) * g.in[2];
        for (int64_t k2 = 0; k2 < g.k[2]; ++k2) {
          const int64_t t2 = g.st[2] + k2 * g.dl[2];
          const Range v = inside(t2, g.s[2], 0, g.in[2], b2, e2);
          if (v.lo == v.hi) continue;
          f(((ci * g.k[0] + k0) * g.k[1] + k1) * g.k[2] + k2, xr0 + t2 + v.lo * g.s[2], v);
        }
      }
    }
  }
}

// Direct: for each output row along the last dim, acc += w * (the input row each tap
// reads), kCB output channels at once so that each input row is read once for them.
template <class T>
void forward_direct(const Geo& g, const Box& x, const T* in, const T* w, const T* bias, T* y) {
  constexpr int64_t kCB = 4;
  const int64_t L = x.extent(2);
  if (L == 0) return;
  T* acc = scratch<T, 2>(static_cast<std::size_t>(kCB * L));
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t grp = 0; grp < g.groups; ++grp)
      for (int64_t cb = 0; cb < g.cog; cb += kCB) {
        const int64_t nb = std::min(kCB, g.cog - cb);
        const int64_t co0 = grp * g.cog + cb;  // first output channel of the block
        for (int64_t o0 = x.b[0]; o0 < x.e[0]; ++o0)
          for (int64_t o1 = x.b[1]; o1 < x.e[1]; ++o1) {
            for (int64_t c = 0; c < nb; ++c) std::fill_n(acc + c * L, L, bias ? bias[co0 + c] : T(0));
            const T* xg = in + (n * g.cin + grp * g.cg) * g.in_cells;
            for_each_tap_row(g, xg, o0, o1, x.b[2], x.e[2], [&](int64_t tap, const T* xr, Range v) {
              const int64_t len = v.size();
              for (int64_t c = 0; c < nb; ++c) {
                const T wv = w[(co0 + c) * g.rows() + tap];
                T* a = acc + c * L + (v.lo - x.b[2]);
                if (g.s[2] == 1)
                  for (int64_t j = 0; j < len; ++j) a[j] += wv * xr[j];
                else
                  for (int64_t j = 0; j < len; ++j) a[j] += wv * xr[j * g.s[2]];
              }
            });
            for (int64_t c = 0; c < nb; ++c)
              std::copy_n(acc + c * L, L, y + (n * g.cout + co0 + c) * g.out_cells + out_index(g, o0, o1, x.b[2]));
          }
      }
}

// --- backward ---

template <class T>
void backward_data_gemm(const Geo& g, const T* dy, const T* w, T* dx) {
  const Box x = full_box(g);
  const int64_t cells = x.cells(), chunk = chunk_cells<T>(g, cells);
  T* col = scratch<T, 0>(static_cast<std::size_t>(g.rows() * chunk));
  for (int64_t c0 = 0; c0 < cells; c0 += chunk) {
    const int64_t nc = std::min(chunk, cells - c0);
    const auto& segs = segments(g, x, c0, nc);
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        // col [rows, nc] = W_g^T [rows, cog] dy_g [cog, nc]
        const T* dyg = dy + (n * g.cout + grp * g.cog) * g.out_cells + c0;
        compute::gemm_ex(Device::host(),
                         GemmDims{.trans_a = true, .m = g.rows(), .n = nc, .k = g.cog, .ldb = g.out_cells, .ldc = nc},
                         T(1), w + grp * g.cog * g.rows(), dyg, T(0), col);
        col2im(g, segs, nc, col, dx + (n * g.cin + grp * g.cg) * g.in_cells);
      }
  }
}

// Direct: dx row (each tap's) += w * dy row, for every output row.
template <class T>
void backward_data_direct(const Geo& g, const T* dy, const T* w, T* dx) {
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t grp = 0; grp < g.groups; ++grp)
      for (int64_t cl = 0; cl < g.cog; ++cl) {
        const int64_t co = grp * g.cog + cl;
        const T* dyc = dy + (n * g.cout + co) * g.out_cells;
        for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
          for (int64_t o1 = 0; o1 < g.out[1]; ++o1) {
            const T* dyr = dyc + out_index(g, o0, o1, 0);
            T* xg = dx + (n * g.cin + grp * g.cg) * g.in_cells;
            for_each_tap_row(g, xg, o0, o1, 0, g.out[2], [&](int64_t tap, T* xr, Range v) {
              const T wv = w[co * g.rows() + tap];
              const T* d = dyr + v.lo;
              const int64_t len = v.size();
              if (g.s[2] == 1)
                for (int64_t j = 0; j < len; ++j) xr[j] += wv * d[j];
              else
                for (int64_t j = 0; j < len; ++j) xr[j * g.s[2]] += wv * d[j];
            });
          }
      }
}

// dw must hold the terms to add to (zeros for a fresh gradient).
template <class T>
void backward_weight_gemm(const Geo& g, const T* in, const T* dy, T* dw) {
  const Box x = full_box(g);
  const int64_t cells = x.cells(), chunk = chunk_cells<T>(g, cells);
  T* col = scratch<T, 0>(static_cast<std::size_t>(g.rows() * chunk));
  for (int64_t c0 = 0; c0 < cells; c0 += chunk) {
    const int64_t nc = std::min(chunk, cells - c0);
    const auto& segs = segments(g, x, c0, nc);
    for (int64_t n = 0; n < g.batch; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        im2col(g, segs, nc, in + (n * g.cin + grp * g.cg) * g.in_cells, col);
        // dW_g [cog, rows] += dy_g [cog, nc] col^T [nc, rows]
        const T* dyg = dy + (n * g.cout + grp * g.cog) * g.out_cells + c0;
        compute::gemm_ex(Device::host(),
                         GemmDims{.trans_b = true, .m = g.cog, .n = g.rows(), .k = nc, .lda = g.out_cells, .ldb = nc},
                         T(1), dyg, col, T(1), dw + grp * g.cog * g.rows());
      }
  }
}

// Direct: dw[co, ci, tap] += dot(dy row, the input row the tap reads), over every output
// row. The products go into one accumulator row per tap (acc[tap][o2] += dy * x, which
// vectorises; a running dot product would not, as floating-point sums are not
// reassociated), summed once per output channel.
template <class T>
void backward_weight_direct(const Geo& g, const T* in, const T* dy, T* dw) {
  const int64_t L = g.out[2];
  T* acc = scratch<T, 2>(static_cast<std::size_t>(g.rows() * L));
  for (int64_t grp = 0; grp < g.groups; ++grp)
    for (int64_t cl = 0; cl < g.cog; ++cl) {
      const int64_t co = grp * g.cog + cl;
      std::fill_n(acc, g.rows() * L, T(0));
      for (int64_t n = 0; n < g.batch; ++n) {
        const T* dyc = dy + (n * g.cout + co) * g.out_cells;
        for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
          for (int64_t o1 = 0; o1 < g.out[1]; ++o1) {
            const T* dyr = dyc + out_index(g, o0, o1, 0);
            const T* xg = in + (n * g.cin + grp * g.cg) * g.in_cells;
            for_each_tap_row(g, xg, o0, o1, 0, g.out[2], [&](int64_t tap, const T* xr, Range v) {
              const T* d = dyr + v.lo;
              T* a = acc + tap * L + v.lo;
              const int64_t len = v.size();
              if (g.s[2] == 1)
                for (int64_t j = 0; j < len; ++j) a[j] += d[j] * xr[j];
              else
                for (int64_t j = 0; j < len; ++j) a[j] += d[j] * xr[j * g.s[2]];
            });
          }
      }
      T* wc = dw + co * g.rows();
      for (int64_t r = 0; r < g.rows(); ++r) {
        T sum = 0;
        for (int64_t o = 0; o < L; ++o) sum += acc[r * L + o];
        wc[r] += sum;
      }
    }
}

// Which algorithm the host runs. From bench/bench_conv_local.cpp (float, CPU time of
// one core, AMD EPYC at 2.45 GHz, x86-64 SSE2 build, 2-D 64 x 64 unless said; the
// ratio is direct / GEMM time; cg, cog: input and output channels per group):
//   forward          GEMM always: 1.6 - 4.7x faster from cg * cog = 16 (3x3 16 -> 16:
//                    0.98 vs 2.56 ms, 19 GFLOP/s; 256 x 256: 15.1 vs 38.2 ms; 1x1, 7x7,
//                    3 -> 16, groups of 2 and 4 alike), and 1.0 - 1.16x for depthwise
//                    and groups of 2 channels.
//   backward data    direct when cg * cog <= 4 (depthwise, depthwise with 2 outputs per
//   and weight       input, groups of 2): data 0.29 - 0.79x, weight 0.62 - 0.82x of the
//                    GEMM's time (a product with m or k of 1 or 2 is mostly packing);
//                    GEMM from cg * cog = 16 (groups of 4: direct 1.5x and 1.7x slower;
//                    16 -> 16: 1.8 - 6x).
enum class Algo { Gemm, Direct };
enum class Pass { Forward, BackwardData, BackwardWeight };
inline Algo choose(const Geo& g, Pass p) {
  if (p == Pass::Forward) return Algo::Gemm;
  return g.cg * g.cog <= 4 ? Algo::Direct : Algo::Gemm;
}

// The host implementations, with dims checked (validate and OutBox::resolved).
template <class T>
void forward(const ConvDims& d, const T* x, const T* w, const T* bias, T* y, const OutBox& box, Algo a) {
  const Geo g = geo_of(d);
  const Box b = box_of(d, box);
  if (b.cells() == 0 || g.batch == 0) return;
  if (a == Algo::Gemm)
    forward_gemm(g, b, x, w, bias, y);
  else
    forward_direct(g, b, x, w, bias, y);
}
template <class T>
void backward_data(const ConvDims& d, const T* dy, const T* w, T* dx, Algo a) {
  const Geo g = geo_of(d);
  std::fill_n(dx, d.x_size(), T(0));
  if (g.out_cells == 0 || g.batch == 0) return;
  if (a == Algo::Gemm)
    backward_data_gemm(g, dy, w, dx);
  else
    backward_data_direct(g, dy, w, dx);
}
template <class T>
void backward_weight(const ConvDims& d, const T* x, const T* dy, T* dw, bool accumulate, Algo a) {
  const Geo g = geo_of(d);
  if (!accumulate) std::fill_n(dw, d.w_size(), T(0));
  if (g.out_cells == 0 || g.batch == 0) return;
  if (a == Algo::Gemm)
    backward_weight_gemm(g, x, dy, dw);
  else
    backward_weight_direct(g, x, dy, dw);
}
template <class T>
void backward_bias(const ConvDims& d, const T* dy, T* db, bool accumulate) {
  // Each plane summed in double (compute/row_stats.hpp: vectorised, the same order
  // every run), the planes of a channel and db's old value too, then rounded to T once.
  const int64_t cells = d.out_cells();
  for (int64_t co = 0; co < d.out_channels; ++co) {
    double sum = accumulate ? static_cast<double>(db[co]) : 0.0;
    for (int64_t n = 0; n < d.batch; ++n) sum += rows::sum(dy + (n * d.out_channels + co) * cells, cells);
    db[co] = detail::convert_element<T>(sum);
  }
}

template <class T>
constexpr void check_type() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || is_float16_v<T>,
                "dtensor::local convolution, pooling and upsampling take float, double, bfloat16 or float16 tensors");
}

// f(g) writes every one of the n cells of a gradient through g: dx itself, or for a
// 16-bit T a per-thread float buffer whose cells are then rounded into dx once (a
// gradient that adds several terms into a cell, as pooling's and upsampling's
// adjoints do, must not add them in 16 bits).
template <class T, class F>
void with_float_gradient(T* dx, int64_t n, F&& f) {
  if constexpr (is_float16_v<T>) {
    float* g = scratch<float, 14>(static_cast<std::size_t>(n));
    f(g);
    for (int64_t i = 0; i < n; ++i) dx[i] = T(g[i]);
  } else {
    f(dx);
  }
}

// --- 16-bit tensors by conversion (defined after the float entry points they call) ---

template <class T>
void forward_by_conversion(const ConvDims& d, const T* x, const T* w, const T* bias, T* y, const OutBox& box);
template <class T>
void backward_data_by_conversion(const ConvDims& d, const T* dy, const T* w, T* dx);
template <class T>
void backward_weight_by_conversion(const ConvDims& d, const T* x, const T* dy, T* dw, bool accumulate);

}  // namespace detail::conv

namespace compute {

// y[box] = conv(x, w) + bias (bias: out_channels values, or nullptr for none); the
// outputs outside the box are left as they are.
template <class T>
void conv_forward(Device d, const ConvDims& dims, const T* x, const T* w, const std::type_identity_t<T>* bias, T* y,
                  OutBox box = {}) {
  detail::conv::check_type<T>();
  dims.validate("conv_forward");
  const OutBox b = box.resolved(dims);
  if (!d.is_host()) return detail::device_backend(d).conv_forward(dtype_of<T>(), dims, x, w, bias, y, b);
  if (dims.batch > 0 && !b.empty(dims) && detail::onednn::conv_forward(dims, x, w, bias, y, b)) return;
  if constexpr (is_float16_v<T>) {
    detail::conv::forward_by_conversion(dims, x, w, bias, y, b);
  } else {
    const auto g = detail::conv::geo_of(dims);
    detail::conv::forward(dims, x, w, bias, y, b, detail::conv::choose(g, detail::conv::Pass::Forward));
  }
}

// dx = the transposed convolution of dy (the gradient of conv_forward in x): every
// x_size() cell of dx is written, those no tap reads with 0.
template <class T>
void conv_backward_data(Device d, const ConvDims& dims, const T* dy, const T* w, T* dx) {
  detail::conv::check_type<T>();
  dims.validate("conv_backward_data");
  if (!d.is_host()) return detail::device_backend(d).conv_backward_data(dtype_of<T>(), dims, dy, w, dx);
  namespace dn = detail::onednn;
  if (dims.batch > 0 && dims.out_cells() > 0 && dn::preferred(dims, dn::Pass::BackwardData, is_float16_v<T>) &&
      dn::conv_backward_data(dims, dy, w, dx))
    return;
  if constexpr (is_float16_v<T>) {
    detail::conv::backward_data_by_conversion(dims, dy, w, dx);
  } else {
    const auto g = detail::conv::geo_of(dims);
    detail::conv::backward_data(dims, dy, w, dx, detail::conv::choose(g, detail::conv::Pass::BackwardData));
  }
}

// dw = (or += with accumulate) the gradient of conv_forward in w, summed over the batch.
template <class T>
void conv_backward_weight(Device d, const ConvDims& dims, const T* x, const T* dy, T* dw, bool accumulate) {
  detail::conv::check_type<T>();
  dims.validate("conv_backward_weight");
  if (!d.is_host()) return detail::device_backend(d).conv_backward_weight(dtype_of<T>(), dims, x, dy, dw, accumulate);
  namespace dn = detail::onednn;
  if (dims.batch > 0 && dims.out_cells() > 0 && dn::preferred(dims, dn::Pass::BackwardWeight, is_float16_v<T>) &&
      dn::conv_backward_weight(dims, x, dy, dw, accumulate))
    return;
  if constexpr (is_float16_v<T>) {
    detail::conv::backward_weight_by_conversion(dims, x, dy, dw, accumulate);
  } else {
    const auto g = detail::conv::geo_of(dims);
    detail::conv::backward_weight(dims, x, dy, dw, accumulate,
                                  detail::conv::choose(g, detail::conv::Pass::BackwardWeight));
  }
}

// db = (or += with accumulate) dy summed over the batch and every output cell.
template <class T>
void conv_backward_bias(Device d, const ConvDims& dims, const T* dy, T* db, bool accumulate) {
  detail::conv::check_type<T>();
  dims.validate("conv_backward_bias");
  if (!d.is_host()) return detail::device_backend(d).conv_backward_bias(dtype_of<T>(), dims, dy, db, accumulate);
  detail::conv::backward_bias(dims, dy, db, accumulate);
}

}  // namespace compute

namespace detail::conv {

// Per-thread float copies of 16-bit operands (slots apart from the float algorithms' 0-2).
template <int Slot, class T>
const float* widened(const T* p, int64_t n) {
  float* f = scratch<float, Slot>(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(p[i]);
  return f;
}

template <class T>
void forward_by_conversion(const ConvDims& d, const T* x, const T* w, const T* bias, T* y, const OutBox& box) {
  const float* xf = widened<10>(x, d.x_size());
  const float* wf = widened<11>(w, d.w_size());
  const float* bf = bias ? widened<12>(bias, d.out_channels) : nullptr;
  float* yf = scratch<float, 13>(static_cast<std::size_t>(d.y_size()));
  compute::conv_forward(Device::host(), d, xf, wf, bf, yf, box);
  // Only the box's outputs are rounded back: the rest of y is left as it is.
  const Geo g = geo_of(d);
  const Box b = box_of(d, box);
  for (int64_t plane = 0; plane < g.batch * g.cout; ++plane)
    for (int64_t o0 = b.b[0]; o0 < b.e[0]; ++o0)
      for (int64_t o1 = b.b[1]; o1 < b.e[1]; ++o1) {
        const int64_t first = plane * g.out_cells + out_index(g, o0, o1, b.b[2]);
        for (int64_t j = 0; j < b.extent(2); ++j) y[first + j] = T(yf[first + j]);
      }
}

template <class T>
void backward_data_by_conversion(const ConvDims& d, const T* dy, const T* w, T* dx) {
  const float* dyf = widened<10>(dy, d.y_size());
  const float* wf = widened<11>(w, d.w_size());
  float* dxf = scratch<float, 13>(static_cast<std::size_t>(d.x_size()));
  compute::conv_backward_data(Device::host(), d, dyf, wf, dxf);
  for (int64_t i = 0; i < d.x_size(); ++i) dx[i] = T(dxf[i]);
}

template <class T>
void backward_weight_by_conversion(const ConvDims& d, const T* x, const T* dy, T* dw, bool accumulate) {
  const float* xf = widened<10>(x, d.x_size());
  const float* dyf = widened<11>(dy, d.y_size());
  float* dwf = scratch<float, 13>(static_cast<std::size_t>(d.w_size()));
  compute::conv_backward_weight(Device::host(), d, xf, dyf, dwf, false);
  for (int64_t i = 0; i < d.w_size(); ++i) dw[i] = T(accumulate ? float(dw[i]) + dwf[i] : dwf[i]);
}

}  // namespace detail::conv

namespace compute {

#ifdef DTENSOR_KERNEL_INSTANCE  // compiled once in the compiled runtime (util/compiled_runtime.hpp)
#define DTENSOR_CONV_KERNELS(T) \
  DTENSOR_KERNEL_INSTANCE void conv_forward<T>(Device, const ConvDims&, const T*, const T*, const T*, T*, OutBox); \
  DTENSOR_KERNEL_INSTANCE void conv_backward_data<T>(Device, const ConvDims&, const T*, const T*, T*); \
  DTENSOR_KERNEL_INSTANCE void conv_backward_weight<T>(Device, const ConvDims&, const T*, const T*, T*, bool); \
  DTENSOR_KERNEL_INSTANCE void conv_backward_bias<T>(Device, const ConvDims&, const T*, T*, bool);
DTENSOR_CONV_KERNELS(float)
DTENSOR_CONV_KERNELS(double)
#undef DTENSOR_CONV_KERNELS
#endif
}  // namespace compute
}  // namespace dtensor
