#pragma once
// Neighborhood attention in 2-D on one rank (NATTEN's na2d, stride 1): each pixel's
// query attends to the kernel_x x kernel_y pixels of a window around it,
//
//   o(p) = sum over keys m of the window W(p):  softmax_m(q(p) . k(m) * scale) v(m)
//
// Windows follow NATTEN: clamped at the image's borders, never padded, shifted inward
// near them (compute/neighborhood_window.hpp: where each starts). K * d <= L (every
// group of a dilated dim holds a whole window).
//
// Tensors are heads-last like NATTEN's: q, o [batch, qx, qy, heads, head_dim] over a
// block of query pixels, k, v [batch, kx, ky, heads, head_dim] over a block of key
// pixels that contains every window of those queries (a halo; each block given by its
// global first pixel and extents, so a rank of an image sharded in space runs this on
// its block and its ghosts). The backward recomputes each window's weights (K^2 per
// query) and accumulates dk, dv into the key block (ghosts included: the halo's
// reverse exchange adds them to their owners).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "dtensor/compute/neighborhood_dims.hpp"
#include "dtensor/core/float16.hpp"
#include "dtensor/util/error.hpp"
#include "dtensor/util/compiled_runtime.hpp"

// (dtensor::detail, not dtensor::compute::detail, which would hide dtensor::detail from
// the compute headers that name detail:: inside dtensor::local)
namespace dtensor::detail::neighborhood {
using compute::NeighborhoodDims;
using compute::neighborhood_start;
using compute::neighborhood_reach;
template <class T, class F>
void for_each_query(const NeighborhoodDims& d, F&& f) {
  d.check("neighborhood attention");
  d.check_key_block("neighborhood attention");
  for (int a = 0; a < 2; ++a)
    if (d.q_len[a] == 0) return;
  std::vector<int64_t> keys(static_cast<std::size_t>(d.kernel[0] * d.kernel[1]));
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t x = 0; x < d.q_len[0]; ++x)
      for (int64_t y = 0; y < d.q_len[1]; ++y) {
        const int64_t sx = neighborhood_start(d.q_first[0] + x, d.extent[0], d.kernel[0], d.dilation[0]);
        const int64_t sy = neighborhood_start(d.q_first[1] + y, d.extent[1], d.kernel[1], d.dilation[1]);
        int64_t m = 0;
        for (int64_t i = 0; i < d.kernel[0]; ++i)
          for (int64_t j = 0; j < d.kernel[1]; ++j) {
            const int64_t kx = sx + d.dilation[0] * i - d.kv_first[0], ky = sy + d.dilation[1] * j - d.kv_first[1];
            keys[m++] = (b * d.kv_len[0] + kx) * d.kv_len[1] + ky;  // the key pixel's index in the key block
          }
        f((b * d.q_len[0] + x) * d.q_len[1] + y, keys);
      }
}
// The backward with dk, dv added into accumulators of type A.
template <class T, class A>
void backward_into(const NeighborhoodDims& d, const T* q, const T* k, const T* v,
                   const T* dout, T* dq, A* dk, A* dv) {
  const int64_t H = d.heads, D = d.head_dim, pix = H * D;
  const A scale = static_cast<A>(d.softmax_scale());
  std::vector<A> p(static_cast<std::size_t>(d.kernel[0] * d.kernel[1])), dp(p.size()),
      dqa(static_cast<std::size_t>(D));
  for_each_query<T>(d, [&](int64_t i, const std::vector<int64_t>& keys) {
    for (int64_t h = 0; h < H; ++h) {
      const T* qi = q + i * pix + h * D;
      const T* doi = dout + i * pix + h * D;
      A mx = -std::numeric_limits<A>::infinity();
      for (std::size_t m = 0; m < keys.size(); ++m) {
        const T* km = k + keys[m] * pix + h * D;
        const T* vm = v + keys[m] * pix + h * D;
        A acc = 0, dacc = 0;
        for (int64_t c = 0; c < D; ++c)
          acc += static_cast<A>(qi[c]) * static_cast<A>(km[c]), dacc += static_cast<A>(doi[c]) * static_cast<A>(vm[c]);
        p[m] = acc * scale;
        dp[m] = dacc;
        mx = std::max(mx, p[m]);
      }
      A sum = 0;
      for (auto& e : p) sum += (e = std::exp(e - mx));
      A delta = 0;  // sum_m P_m dP_m (= do . o)
      for (std::size_t m = 0; m < keys.size(); ++m) delta += (p[m] /= sum) * dp[m];
      std::fill(dqa.begin(), dqa.end(), A(0));
      for (std::size_t m = 0; m < keys.size(); ++m) {
        const A ds = p[m] * (dp[m] - delta) * scale;
        const T* km = k + keys[m] * pix + h * D;
        A* dkm = dk + keys[m] * pix + h * D;
        A* dvm = dv + keys[m] * pix + h * D;
        for (int64_t c = 0; c < D; ++c) {
          dqa[static_cast<std::size_t>(c)] += ds * static_cast<A>(km[c]);
          dkm[c] += ds * static_cast<A>(qi[c]);
          dvm[c] += p[m] * static_cast<A>(doi[c]);
        }
      }
      T* dqi = dq + i * pix + h * D;
      for (int64_t c = 0; c < D; ++c) dqi[c] = static_cast<T>(dqa[static_cast<std::size_t>(c)]);
    }
  });
}
}  // namespace dtensor::detail::neighborhood

namespace dtensor::compute {

// o from q, k, v. Computed in accumulator_t<T> (float for bfloat16 and float16: the
// scores, the softmax and each output's sum), each output rounded once.
template <class T>
void neighborhood_attention_forward(const NeighborhoodDims& d, const T* q, const T* k, const T* v, T* o) {
  using A = accumulator_t<T>;
  const int64_t H = d.heads, D = d.head_dim, pix = H * D;
  const A scale = static_cast<A>(d.softmax_scale());
  std::vector<A> s(static_cast<std::size_t>(d.kernel[0] * d.kernel[1])), out(static_cast<std::size_t>(D));
  dtensor::detail::neighborhood::for_each_query<T>(d, [&](int64_t p, const std::vector<int64_t>& keys) {
    for (int64_t h = 0; h < H; ++h) {
      const T* qp = q + p * pix + h * D;
      A mx = -std::numeric_limits<A>::infinity();
      for (std::size_t m = 0; m < keys.size(); ++m) {
        const T* km = k + keys[m] * pix + h * D;
        A acc = 0;
        for (int64_t c = 0; c < D; ++c) acc += static_cast<A>(qp[c]) * static_cast<A>(km[c]);
        s[m] = acc * scale;
        mx = std::max(mx, s[m]);
      }
      A sum = 0;
      for (auto& e : s) sum += (e = std::exp(e - mx));
      std::fill(out.begin(), out.end(), A(0));
      for (std::size_t m = 0; m < keys.size(); ++m) {
        const A w = s[m] / sum;
        const T* vm = v + keys[m] * pix + h * D;
        for (int64_t c = 0; c < D; ++c) out[static_cast<std::size_t>(c)] += w * static_cast<A>(vm[c]);
      }
      T* op = o + p * pix + h * D;
      for (int64_t c = 0; c < D; ++c) op[c] = static_cast<T>(out[static_cast<std::size_t>(c)]);
    }
  });
}


// dq (written) and dk, dv (added into: zero them first, ghosts included) from dout.
// Computed in accumulator_t<T>: for bfloat16 and float16, dk and dv (each key's terms
// from every query whose window holds it) add up in float buffers, then are added into
// dk and dv rounding once.
template <class T>
void neighborhood_attention_backward(const NeighborhoodDims& d, const T* q, const T* k, const T* v, const T* dout,
                                     T* dq, T* dk, T* dv) {
  using A = accumulator_t<T>;
  if constexpr (std::is_same_v<A, T>) {
    dtensor::detail::neighborhood::backward_into<T, A>(d, q, k, v, dout, dq, dk, dv);
  } else {
    const std::size_t n = static_cast<std::size_t>(d.batch * d.kv_len[0] * d.kv_len[1] * d.heads * d.head_dim);
    std::vector<A> dka(n), dva(n);
    for (std::size_t e = 0; e < n; ++e) dka[e] = static_cast<A>(dk[e]), dva[e] = static_cast<A>(dv[e]);
    dtensor::detail::neighborhood::backward_into<T, A>(d, q, k, v, dout, dq, dka.data(), dva.data());
    for (std::size_t e = 0; e < n; ++e) dk[e] = static_cast<T>(dka[e]), dv[e] = static_cast<T>(dva[e]);
  }
}

#ifdef DTENSOR_KERNEL_INSTANCE  // compiled once in the compiled runtime (util/compiled_runtime.hpp)
#define DTENSOR_NEIGHBORHOOD_KERNELS(T) \
  DTENSOR_KERNEL_INSTANCE void neighborhood_attention_forward<T>(const NeighborhoodDims&, const T*, const T*, \
      const T*, T*); \
  DTENSOR_KERNEL_INSTANCE void neighborhood_attention_backward<T>(const NeighborhoodDims&, const T*, const T*, \
      const T*, const T*, T*, T*, T*);
DTENSOR_NEIGHBORHOOD_KERNELS(float)
DTENSOR_NEIGHBORHOOD_KERNELS(double)
#undef DTENSOR_NEIGHBORHOOD_KERNELS
#endif
}  // namespace dtensor::compute
