#pragma once
// Neighborhood attention in 2-D on one rank's blocks (compute/neighborhood_attention.hpp
// defines it: NATTEN's clamped windows, compute/neighborhood_window.hpp) on a GPU.
//
//   neighborhood_forward_kernel  one thread per (query pixel, head): o, the window's
//                                maximum and sum found in a first pass
//   neighborhood_dq_kernel       one thread per (query pixel, head): dq, and the
//                                window's log-sum-exp and delta = sum P dP into `stats`
//   neighborhood_dkv_kernel      one thread per (key pixel of the key block, head): dk
//                                and dv gathered over the queries whose windows hold
//                                the key (the inverse neighborhood), written whole,
//                                each weight recomputed from the query's stats
// The forward keeps nothing (a layer saves what the host path saves); the backward's
// stats live in a scratch buffer of its caller. Every thread owns what it writes: no
// atomics, the same bits on every run, and kernels that the host launcher runs in CI.
// Sums are in T, as on the host (whose order differs: the results agree to rounding).
// A window holds at most a few hundred keys and a head a few hundred values: the
// products run from global memory, which the caches serve (queries of neighbouring
// threads share most of their keys).
#include <cstdint>

#include "dtensor/compute/neighborhood_dims.hpp"
#include "elementwise.cuh"
#include "grid.cuh"

namespace dtensor::cuda::kernels::detail {

// NeighborhoodDims as plain fields (device code reads them; std::array is host code).
struct NeighborhoodGeo {
  int64_t batch, heads, head_dim;
  int64_t extent[2], kernel[2], dilation[2];
  int64_t q_first[2], q_len[2], kv_first[2], kv_len[2];
  double scale;
  int64_t queries, keys;  // pixels of the query and the key block, over the batch
};

inline NeighborhoodGeo neighborhood_geo(const ::dtensor::compute::NeighborhoodDims& d) {
  NeighborhoodGeo g{};
  g.batch = d.batch, g.heads = d.heads, g.head_dim = d.head_dim;
  for (int a = 0; a < 2; ++a) {
    g.extent[a] = d.extent[a], g.kernel[a] = d.kernel[a], g.dilation[a] = d.dilation[a];
    g.q_first[a] = d.q_first[a], g.q_len[a] = d.q_len[a], g.kv_first[a] = d.kv_first[a], g.kv_len[a] = d.kv_len[a];
  }
  g.scale = d.softmax_scale();
  g.queries = d.batch * d.q_len[0] * d.q_len[1];
  g.keys = d.batch * d.kv_len[0] * d.kv_len[1];
  return g;
}

template <class T>
DTENSOR_DEVICE inline T neighborhood_dot(const T* a, const T* b, int64_t n) {
  T acc = T(0);
  for (int64_t c = 0; c < n; ++c) acc += a[c] * b[c];
  return acc;
}

// Item i of (pixel, head) pairs over a block of extents len: the pixel's batch index
// and coordinates in its block.
DTENSOR_DEVICE inline void neighborhood_pixel(int64_t i, int64_t heads, const int64_t* len, int64_t& b, int64_t& x,
                                              int64_t& y, int64_t& h) {
  int64_t p, rest;
  divmod(i, heads, p, h);
  divmod(p, len[1], rest, y);
  divmod(rest, len[0], b, x);
}

// Query item i (a query pixel and a head) and its window: the key block's pixel of
// window tap (a, c) is key(g, a, c).
struct NeighborhoodQuery {
  int64_t pixel, head, b, sx, sy;  // sx, sy: the window's first key in the key block
  DTENSOR_DEVICE int64_t key(const NeighborhoodGeo& g, int64_t a, int64_t c) const {
    return (b * g.kv_len[0] + sx + g.dilation[0] * a) * g.kv_len[1] + sy + g.dilation[1] * c;
  }
};
DTENSOR_DEVICE inline NeighborhoodQuery neighborhood_query(const NeighborhoodGeo& g, int64_t i) {
  using ::dtensor::compute::neighborhood_start;
  NeighborhoodQuery nq{};
  int64_t x, y;
  neighborhood_pixel(i, g.heads, g.q_len, nq.b, x, y, nq.head);
  nq.pixel = i / g.heads;
  nq.sx = neighborhood_start(g.q_first[0] + x, g.extent[0], g.kernel[0], g.dilation[0]) - g.kv_first[0];
  nq.sy = neighborhood_start(g.q_first[1] + y, g.extent[1], g.kernel[1], g.dilation[1]) - g.kv_first[1];
  return nq;
}

// The window's largest scaled score and the sum of exp(score - largest); kh is k at
// the query's head.
template <class T>
DTENSOR_DEVICE inline void neighborhood_softmax_terms(const NeighborhoodGeo& g, const NeighborhoodQuery& nq,
                                                      const T* qp, const T* kh, T scale, T& mx, T& sum) {
  const int64_t D = g.head_dim, pix = g.heads * D;
  mx = -static_cast<T>(INFINITY);
  for (int64_t a = 0; a < g.kernel[0]; ++a)
    for (int64_t c = 0; c < g.kernel[1]; ++c) {
      const T s = neighborhood_dot(qp, kh + nq.key(g, a, c) * pix, D) * scale;
      mx = s > mx ? s : mx;
    }
  sum = T(0);
  for (int64_t a = 0; a < g.kernel[0]; ++a)
    for (int64_t c = 0; c < g.kernel[1]; ++c)
      sum += dexp(neighborhood_dot(qp, kh + nq.key(g, a, c) * pix, D) * scale - mx);
}

template <class T>
DTENSOR_KERNEL void neighborhood_forward_kernel(NeighborhoodGeo g, const T* q, const T* k, const T* v, T* o) {
  const int64_t H = g.heads, D = g.head_dim, pix = H * D;
  const T scale = static_cast<T>(g.scale);
  for (int64_t i = first(); i < g.queries * H; i += stride()) {
    const NeighborhoodQuery nq = neighborhood_query(g, i);
    const int64_t at = nq.pixel * pix + nq.head * D;  // this query's head in q and o
    const T *qp = q + at, *kh = k + nq.head * D, *vh = v + nq.head * D;
    T mx, sum;
    neighborhood_softmax_terms(g, nq, qp, kh, scale, mx, sum);
    T* op = o + at;
    for (int64_t e = 0; e < D; ++e) op[e] = T(0);
    for (int64_t a = 0; a < g.kernel[0]; ++a)
      for (int64_t c = 0; c < g.kernel[1]; ++c) {
        const int64_t m = nq.key(g, a, c);
        const T w = dexp(neighborhood_dot(qp, kh + m * pix, D) * scale - mx) / sum;
        for (int64_t e = 0; e < D; ++e) op[e] += w * vh[m * pix + e];
      }
  }
}

// stats: [2, queries x heads]: each window's log-sum-exp, then its delta.
template <class T>
DTENSOR_KERNEL void neighborhood_dq_kernel(NeighborhoodGeo g, const T* q, const T* k, const T* v, const T* dout,
                                           T* stats, T* dq) {
  const int64_t H = g.heads, D = g.head_dim, pix = H * D, n = g.queries * H;
  const T scale = static_cast<T>(g.scale);
  for (int64_t i = first(); i < n; i += stride()) {
    const NeighborhoodQuery nq = neighborhood_query(g, i);
    const int64_t at = nq.pixel * pix + nq.head * D;
    const T *qp = q + at, *dop = dout + at, *kh = k + nq.head * D, *vh = v + nq.head * D;
    T mx, sum;
    neighborhood_softmax_terms(g, nq, qp, kh, scale, mx, sum);
    const T lse = mx + dlog(sum);
    T delta = T(0);  // sum over the window of P dP (= do . o)
    for (int64_t a = 0; a < g.kernel[0]; ++a)
      for (int64_t c = 0; c < g.kernel[1]; ++c) {
        const int64_t m = nq.key(g, a, c);
        delta += dexp(neighborhood_dot(qp, kh + m * pix, D) * scale - lse) * neighborhood_dot(dop, vh + m * pix, D);
      }
    T* dqp = dq + at;
    for (int64_t e = 0; e < D; ++e) dqp[e] = T(0);
    for (int64_t a = 0; a < g.kernel[0]; ++a)
      for (int64_t c = 0; c < g.kernel[1]; ++c) {
        const int64_t m = nq.key(g, a, c);
        const T* km = kh + m * pix;
        const T w = dexp(neighborhood_dot(qp, km, D) * scale - lse);
        const T ds = w * (neighborhood_dot(dop, vh + m * pix, D) - delta) * scale;
        for (int64_t e = 0; e < D; ++e) dqp[e] += ds * km[e];
      }
    stats[i] = lse;
    stats[n + i] = delta;
  }
}

template <class T>
DTENSOR_KERNEL void neighborhood_dkv_kernel(NeighborhoodGeo g, const T* q, const T* k, const T* v, const T* dout,
                                            const T* stats, T* dk, T* dv) {
  const int64_t H = g.heads, D = g.head_dim, pix = H * D, n = g.queries * H;
  const T scale = static_cast<T>(g.scale);
  for (int64_t i = first(); i < g.keys * H; i += stride()) {
    int64_t b, kx, ky, h;
    neighborhood_pixel(i, H, g.kv_len, b, kx, ky, h);
    const int64_t m = i / H;
    const T* km = k + m * pix + h * D;
    const T* vm = v + m * pix + h * D;
    T* dkm = dk + m * pix + h * D;
    T* dvm = dv + m * pix + h * D;
    for (int64_t e = 0; e < D; ++e) dkm[e] = T(0), dvm[e] = T(0);
    // The queries whose windows can hold this key lie within a window's span of it
    // (a window shifted inward at a border still spans (kernel - 1) * dilation).
    int64_t lo[2], hi[2];
    const int64_t key[2] = {g.kv_first[0] + kx, g.kv_first[1] + ky};
    for (int a = 0; a < 2; ++a) {
      const int64_t span = (g.kernel[a] - 1) * g.dilation[a];
      lo[a] = key[a] - span > g.q_first[a] ? key[a] - span : g.q_first[a];
      hi[a] = key[a] + span < g.q_first[a] + g.q_len[a] - 1 ? key[a] + span : g.q_first[a] + g.q_len[a] - 1;
    }
    for (int64_t qx = lo[0]; qx <= hi[0]; ++qx) {
      const int64_t sx = ::dtensor::compute::neighborhood_start(qx, g.extent[0], g.kernel[0], g.dilation[0]);
      const int64_t ox = key[0] - sx;
      if (ox < 0 || ox > (g.kernel[0] - 1) * g.dilation[0] || ox % g.dilation[0] != 0) continue;
      for (int64_t qy = lo[1]; qy <= hi[1]; ++qy) {
        const int64_t sy = ::dtensor::compute::neighborhood_start(qy, g.extent[1], g.kernel[1], g.dilation[1]);
        const int64_t oy = key[1] - sy;
        if (oy < 0 || oy > (g.kernel[1] - 1) * g.dilation[1] || oy % g.dilation[1] != 0) continue;
        const int64_t p = (b * g.q_len[0] + qx - g.q_first[0]) * g.q_len[1] + qy - g.q_first[1];
        const T* qp = q + p * pix + h * D;
        const T* dop = dout + p * pix + h * D;
        const T w = dexp(neighborhood_dot(qp, km, D) * scale - stats[p * H + h]);
        const T ds = w * (neighborhood_dot(dop, vm, D) - stats[n + p * H + h]) * scale;
        for (int64_t e = 0; e < D; ++e) {
          dkm[e] += ds * qp[e];
          dvm[e] += w * dop[e];
        }
      }
    }
  }
}

}  // namespace dtensor::cuda::kernels::detail
