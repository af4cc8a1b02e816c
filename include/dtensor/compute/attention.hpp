#pragma once
// Scaled dot-product attention on one rank, forward and backward, in tiles with an
// online softmax (the flash-attention scheme): memory O(rows x tile), never the
// [q_len, kv_len] matrix of weights.
//
//   o = softmax(q k^T * scale + mask) v        per (batch, head)
//
// Tensors are row-major [batch, heads, len, head_dim]: q and o with `heads` heads, k and
// v with `kv_heads` (grouped-query attention: query head h reads k/v head
// h / (heads / kv_heads)). The optional additive mask is [q_len, kv_len], the same for
// every batch and head. Causal masking keeps key j for query i where
// kv_offset + j <= q_offset + i: the offsets are the blocks' global positions (0 and 0
// give PyTorch's is_causal on equal lengths, its top-left alignment otherwise), so a
// block of a sharded sequence masks as the whole sequence would.
//
// The forward keeps, per query row, the log-sum-exp of its scores (lse, [batch, heads,
// q_len]), with which the backward recomputes the weights tile by tile:
//   D_i = sum(do_i * o_i);  P = exp(S - lse);  dv += P^T do;  dP = do v^T;
//   dS = P (dP - D);  dq += dS k scale;  dk += dS^T q scale
// A row whose every key is masked has no softmax: its output and gradients are 0 and
// its lse is -inf (PyTorch returns NaN there).
//
// Dropout on the weights (AttentionDropout, p > 0): o = (P * keep / (1 - p)) v, the
// softmax's normalisation unchanged. keep is drawn by the counter generator
// (compute/counter_rng.hpp) from the weight's GLOBAL index (batch, head, query position,
// key position): the single-device mask whatever block of the batch, the heads or the
// sequence this rank holds, and the same draw in forward and backward. The backward
// uses dP = (do v^T) * keep / (1 - p) (and D = sum(do * o) as without dropout).
//
// On the host: one tile product at a time through compute::gemm_ex (OpenBLAS where found,
// else Eigen), the softmax steps with Eigen arrays. On a device (the overloads taking a
// Device): the device table's kernels (kernels/attention.cuh in the CUDA backend), with
// the same rules. The sums are in T.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "dtensor/compute/attention_dims.hpp"
#include "dtensor/compute/counter_rng.hpp"
#include "dtensor/compute/device_backend.hpp"
#include "dtensor/compute/gelu_host.hpp"
#include "dtensor/compute/local.hpp"
#include "dtensor/core/host_isa.hpp"
#include "dtensor/tensor/eigen.hpp"
#include "dtensor/util/error.hpp"
#include "dtensor/util/compiled_runtime.hpp"


// The softmax's weights in place: w = exp(w - shift), exactly 0 where that is below
// 4x the smallest normal (w - shift < -86 in float, -707 in double). Eigen's vectorised
// exp returns ~2.9e-39 below its clamp, -inf (a masked key) included: a masked key got a
// denormal weight instead of 0, and every product of a tile holding denormals ran ~4x
// slower (x86's microcode assists; the transformer block's step was 3.5x its time with
// denormals flushed). So the argument is clamped to log(smallest normal) + 1 first (no
// denormal inside exp either), and what falls below the flush level after exp is 0. A
// weight below 5e-38 of the row's largest (which is 1) changes no float sum of weights;
// flash attention's kernels flush the same way on a GPU. NaN stays NaN. Loops of their
// own (a compare and a blend, which the compiler vectorises; Eigen's select is scalar
// and would take exp with it). Float on a CPU with AVX-512 (core/host_isa.hpp): one loop
// compiled for it, exp by GELU's Cody-Waite form (compute/gelu_host.hpp; Eigen's exp is
// compiled for the build's target, SSE2 in a plain build).
namespace dtensor::detail {
inline namespace DTENSOR_HOST_ISA_ABI {  // core/host_isa.hpp
namespace softmax {

template <class T>
inline const T kWeightFloor = std::log(std::numeric_limits<T>::min()) + 1;  // exp: e x the smallest normal
template <class T>
inline constexpr T kWeightFlush = 4 * std::numeric_limits<T>::min();

#if DTENSOR_HOST_ISA_X86
[[gnu::target("avx512f,avx512bw,avx512vl,fma")]] inline void weights_avx512(float* w, int64_t n, float shift) {
  const float floor = kWeightFloor<float>;
  for (int64_t i = 0; i < n; ++i) {
    float x = w[i] - shift;
    x = x < floor ? floor : x;
    const float e = gelu::exp_nonpositive(x);
    w[i] = e < kWeightFlush<float> ? 0.f : e;
  }
}
#endif

template <class T>
void weights(T* w, int64_t n, T shift) {
#if DTENSOR_HOST_ISA_X86
  if constexpr (std::is_same_v<T, float>)
    if (host_isa() == HostIsa::Avx512) return weights_avx512(w, n, shift);
#endif
  const T floor = kWeightFloor<T>;
  for (int64_t i = 0; i < n; ++i) {
    const T x = w[i] - shift;
    w[i] = x < floor ? floor : x;
  }
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> a(w, n);
  a = a.exp();
  for (int64_t i = 0; i < n; ++i) w[i] = w[i] < kWeightFlush<T> ? T(0) : w[i];
}

}  // namespace softmax
}  // namespace DTENSOR_HOST_ISA_ABI
}  // namespace dtensor::detail

// (in dtensor::detail, not dtensor::compute::detail: a compute::detail would hide
// dtensor::detail from the compute headers that name detail:: inside dtensor::local)
namespace dtensor::detail::attention {

using compute::AttentionDims;
using compute::AttentionDropout;

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MapC = Eigen::Map<const Mat<T>>;
template <class T>
using Map = Eigen::Map<Mat<T>>;

// c [m, n] (rows ldc apart) = alpha op(a) op(b) + beta c: the tiles' products, through
// compute::gemm_ex (OpenBLAS where CMake found it, so a plain Release build gets the
// CPU's vector units; Eigen otherwise).
template <class T>
void product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
             int64_t ldb, T beta, T* c, int64_t ldc) {
  compute::gemm_ex(Device::host(),
                   GemmDims{.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc},
                   alpha, a, b, beta, c);
}

// The scores of q rows [i0, i0 + ni) against keys [j0, j0 + nj): scale q k^T + mask,
// -inf where causal masking drops a key.
template <class T>
void scores(const AttentionDims& d, const T* q, const T* k, const T* mask, int64_t i0, int64_t ni, int64_t j0,
            int64_t nj, Mat<T>& s) {
  const int64_t D = d.head_dim;
  s.resize(ni, nj);
  product(false, true, ni, nj, D, static_cast<T>(d.softmax_scale()), q + i0 * D, D, k + j0 * D, D, T(0), s.data(),
          nj);
  if (mask) s += MapC<T>(mask, d.q_len, d.kv_len).block(i0, j0, ni, nj);
  if (d.causal)
    for (int64_t r = 0; r < ni; ++r) {
      const int64_t last = d.q_offset + i0 + r - d.kv_offset;  // the last key position this row sees, local
      for (int64_t c = std::max<int64_t>(0, last + 1 - j0); c < nj; ++c) s(r, c) = -std::numeric_limits<T>::infinity();
    }
}

// The kept-and-scaled dropout factors of the tile (rows i0.., keys j0..) of head bh
// (batch bh / heads, head bh % heads of this block): keep / (1 - p) or 0.
template <class T>
void dropout_factors(const AttentionDims& d, int64_t bh, int64_t i0, int64_t ni, int64_t j0, int64_t nj, Mat<T>& keep) {
  keep.resize(ni, nj);
  for (int64_t x = 0; x < ni; ++x)
    for (int64_t y = 0; y < nj; ++y) keep(x, y) = compute::attention_dropout_factor<T>(d, bh, i0 + x, j0 + y);
}

// f(bh, bkv, qh, kh, vh) for each (batch, query head) bh, with its key/value head
// bkv and the three heads' rows.
template <class T, class F>
void for_each_head(const AttentionDims& d, const T* q, const T* k, const T* v, F&& f) {
  const int64_t group = d.heads / d.kv_heads, D = d.head_dim;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const int64_t bh = b * d.heads + h, bkv = b * d.kv_heads + h / group;
      f(bh, bkv, q + bh * d.q_len * D, k + bkv * d.kv_len * D, v + bkv * d.kv_len * D);
    }
}

inline bool tile_masked(const AttentionDims& d, int64_t i0, int64_t ni, int64_t j0) {
  return compute::attention_tile_masked(d, i0, ni, j0);
}

}  // namespace dtensor::detail::attention

namespace dtensor::compute {

// o [batch, heads, q_len, head_dim] and lse [batch, heads, q_len] from q, k, v (see
// above); mask: nullptr or [q_len, kv_len].
template <class T>
void attention_forward(const AttentionDims& d, const T* q, const T* k, const T* v, const T* mask, T* o, T* lse) {
  namespace A = dtensor::detail::attention;
  d.check("attention_forward");
  const T inf = std::numeric_limits<T>::infinity();
  const int64_t D = d.head_dim;
  A::Mat<T> s, acc, keep;
  Eigen::Array<T, Eigen::Dynamic, 1> m, l, m_new, rescale;
  A::for_each_head(d, q, k, v, [&](int64_t bh, int64_t, const T* qh, const T* kh, const T* vh) {
    for (int64_t i0 = 0; i0 < d.q_len; i0 += d.tile) {
      const int64_t ni = std::min(d.tile, d.q_len - i0);
      m.setConstant(ni, -inf);
      l.setZero(ni);
      acc.setZero(ni, D);
      for (int64_t j0 = 0; j0 < d.kv_len; j0 += d.tile) {
        const int64_t nj = std::min(d.tile, d.kv_len - j0);
        if (A::tile_masked(d, i0, ni, j0)) break;  // and every later tile
        A::scores(d, qh, kh, mask, i0, ni, j0, nj, s);
        m_new = m.max(s.rowwise().maxCoeff().array());
        for (int64_t r = 0; r < ni; ++r) {
          if (m_new(r) == -inf) {  // every key so far masked: no weight yet
            s.row(r).setZero();
            continue;
          }
          dtensor::detail::softmax::weights(s.row(r).data(), nj, m_new(r));
        }
        // the earlier terms' factor exp(m - m_new): 0 where there were none, 1 where
        // there still are none (both -inf: exp would give NaN)
        rescale = m - m_new;  // -inf - x: a weight of 0; -inf - -inf: NaN, replaced by 1 below
        dtensor::detail::softmax::weights(rescale.data(), ni, T(0));
        rescale = (m_new == -inf).select(T(1), rescale);
        l = l * rescale + s.rowwise().sum().array();
        acc = rescale.matrix().asDiagonal() * acc;
        if (d.dropout.p > 0) {  // the normalisation above counts every weight; the output the kept ones
          A::dropout_factors(d, bh, i0, ni, j0, nj, keep);
          s.array() *= keep.array();
        }
        A::product(false, false, ni, D, nj, T(1), s.data(), nj, vh + j0 * D, D, T(1), acc.data(), D);
        m = m_new;
      }
      auto ot = A::Map<T>(o + (bh * d.q_len + i0) * D, ni, D);
      for (int64_t r = 0; r < ni; ++r) {
        if (l(r) > 0) {
          ot.row(r) = acc.row(r) / l(r);
          lse[bh * d.q_len + i0 + r] = m(r) + std::log(l(r));
        } else {  // every key masked
          ot.row(r).setZero();
          lse[bh * d.q_len + i0 + r] = -inf;
        }
      }
    }
  });
}

// dq, dk, dv (written, not accumulated) from do and the forward's o and lse.
template <class T>
void attention_backward(const AttentionDims& d, const T* q, const T* k, const T* v, const T* mask, const T* o,
                        const T* lse, const T* dout, T* dq, T* dk, T* dv) {
  namespace A = dtensor::detail::attention;
  d.check("attention_backward");
  const T inf = std::numeric_limits<T>::infinity();
  const int64_t D = d.head_dim;
  const T scale = static_cast<T>(d.softmax_scale());
  std::fill(dq, dq + d.batch * d.heads * d.q_len * D, T(0));
  std::fill(dk, dk + d.batch * d.kv_heads * d.kv_len * D, T(0));
  std::fill(dv, dv + d.batch * d.kv_heads * d.kv_len * D, T(0));
  A::Mat<T> s, dp, keep;
  Eigen::Array<T, Eigen::Dynamic, 1> delta;
  A::for_each_head(d, q, k, v, [&](int64_t bh, int64_t bkv, const T* qh, const T* kh, const T* vh) {
    for (int64_t i0 = 0; i0 < d.q_len; i0 += d.tile) {
      const int64_t ni = std::min(d.tile, d.q_len - i0);
      const auto dot = A::MapC<T>(dout + (bh * d.q_len + i0) * D, ni, D);
      delta = (dot.array() * A::MapC<T>(o + (bh * d.q_len + i0) * D, ni, D).array()).rowwise().sum();
      const T* lse_t = lse + bh * d.q_len + i0;
      for (int64_t j0 = 0; j0 < d.kv_len; j0 += d.tile) {
        const int64_t nj = std::min(d.tile, d.kv_len - j0);
        if (A::tile_masked(d, i0, ni, j0)) break;
        A::scores(d, qh, kh, mask, i0, ni, j0, nj, s);
        for (int64_t r = 0; r < ni; ++r) {  // P = exp(S - lse); 0 where masked, and in a row with no key
          if (lse_t[r] == -inf)
            s.row(r).setZero();
          else
            dtensor::detail::softmax::weights(s.row(r).data(), nj, lse_t[r]);
        }
        const T* dot_p = dout + (bh * d.q_len + i0) * D;
        T* dv_t = dv + (bkv * d.kv_len + j0) * D;
        dp.resize(ni, nj);
        A::product(false, true, ni, nj, D, T(1), dot_p, D, vh + j0 * D, D, T(0), dp.data(), nj);  // dP = do v^T
        if (d.dropout.p > 0) {  // dP through the mask; dv from the kept weights
          A::dropout_factors(d, bh, i0, ni, j0, nj, keep);
          dp.array() *= keep.array();
          keep.array() *= s.array();
          A::product(true, false, nj, D, ni, T(1), keep.data(), nj, dot_p, D, T(1), dv_t, D);
        } else {
          A::product(true, false, nj, D, ni, T(1), s.data(), nj, dot_p, D, T(1), dv_t, D);  // dv += P^T do
        }
        s.array() *= (dp.array().colwise() - delta);  // dS
        A::product(false, false, ni, D, nj, scale, s.data(), nj, kh + j0 * D, D, T(1),
                   dq + (bh * d.q_len + i0) * D, D);  // dq += scale dS k
        A::product(true, false, nj, D, ni, scale, s.data(), nj, qh + i0 * D, D, T(1),
                   dk + (bkv * d.kv_len + j0) * D, D);  // dk += scale dS^T q
      }
    }
  });
}

// The same on the tensors' device: the host code above, or the device table's.
template <class T>
void attention_forward(Device dev, const AttentionDims& d, const T* q, const T* k, const T* v, const T* mask, T* o,
                       T* lse) {
  if (dev.is_host()) return attention_forward(d, q, k, v, mask, o, lse);
  d.check("attention_forward");
  dtensor::detail::device_backend(dev).attention_forward(dtype_of<T>(), d, q, k, v, mask, o, lse);
}
template <class T>
void attention_backward(Device dev, const AttentionDims& d, const T* q, const T* k, const T* v, const T* mask,
                        const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv) {
  if (dev.is_host()) return attention_backward(d, q, k, v, mask, o, lse, dout, dq, dk, dv);
  d.check("attention_backward");
  dtensor::detail::device_backend(dev).attention_backward(dtype_of<T>(), d, q, k, v, mask, o, lse, dout, dq, dk, dv);
}

// o, lse ([rows, dim], [rows]: a result over some keys) merged in place with ob, lb
// (the same rows over other keys): lse' = log(e^lse + e^lb),
// o' = o e^(lse - lse') + ob e^(lb - lse'); a side with lse -inf (no key) adds nothing.
// What ring attention does after each block (kernels/attention.cuh on a device).
template <class T>
void attention_merge(Device dev, T* o, T* lse, const T* ob, const T* lb, int64_t rows, int64_t dim) {
  if (!dev.is_host())
    return dtensor::detail::device_backend(dev).attention_merge(dtype_of<T>(), o, lse, ob, lb, rows, dim);
  const T inf = std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < rows; ++i) {
    T* oi = o + i * dim;
    const T* bi = ob + i * dim;
    if (lb[i] == -inf) continue;
    if (lse[i] == -inf) {
      std::copy_n(bi, dim, oi);
      lse[i] = lb[i];
      continue;
    }
    const T m = std::max(lse[i], lb[i]);
    const T merged = m + std::log(std::exp(lse[i] - m) + std::exp(lb[i] - m));
    const T fa = std::exp(lse[i] - merged), fb = std::exp(lb[i] - merged);
    for (int64_t c = 0; c < dim; ++c) oi[c] = fa * oi[c] + fb * bi[c];
    lse[i] = merged;
  }
}

// [batch, len, heads * head_dim] (the projections' rows) <-> [batch, heads, len, head_dim]
// (the attention core's layout).
template <class T>
void heads_to_front(const T* x, T* y, int64_t batch, int64_t len, int64_t heads, int64_t head_dim) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < len; ++s)
      for (int64_t h = 0; h < heads; ++h)
        std::copy_n(x + ((b * len + s) * heads + h) * head_dim, head_dim, y + ((b * heads + h) * len + s) * head_dim);
}
template <class T>
void heads_to_back(const T* y, T* x, int64_t batch, int64_t len, int64_t heads, int64_t head_dim) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < len; ++s)
      for (int64_t h = 0; h < heads; ++h)
        std::copy_n(y + ((b * heads + h) * len + s) * head_dim, head_dim, x + ((b * len + s) * heads + h) * head_dim);
}

}  // namespace dtensor::compute

namespace dtensor::compute {

// The same on the tensors' device (on a GPU, one strided block copy per batch and head).
template <class T>
void heads_to_front(Device dev, const T* x, T* y, int64_t batch, int64_t len, int64_t heads, int64_t head_dim) {
  if (dev.is_host()) return heads_to_front(x, y, batch, len, heads, head_dim);
  const auto& move = dtensor::detail::device_movement(dev);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      move.copy_block(x, StridedBlock{(b * len * heads + h) * head_dim, len, heads * head_dim, head_dim}, y,
                    StridedBlock::contiguous((b * heads + h) * len * head_dim, len * head_dim), sizeof(T));
}
template <class T>
void heads_to_back(Device dev, const T* y, T* x, int64_t batch, int64_t len, int64_t heads, int64_t head_dim) {
  if (dev.is_host()) return heads_to_back(y, x, batch, len, heads, head_dim);
  const auto& move = dtensor::detail::device_movement(dev);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      move.copy_block(y, StridedBlock::contiguous((b * heads + h) * len * head_dim, len * head_dim), x,
                    StridedBlock{(b * len * heads + h) * head_dim, len, heads * head_dim, head_dim}, sizeof(T));
}

#ifdef DTENSOR_KERNEL_INSTANCE  // compiled once in the compiled runtime (util/compiled_runtime.hpp)
#define DTENSOR_ATTENTION_KERNELS(T) \
  DTENSOR_KERNEL_INSTANCE void attention_forward<T>(Device, const AttentionDims&, const T*, const T*, const T*, \
      const T*, T*, T*); \
  DTENSOR_KERNEL_INSTANCE void attention_backward<T>(Device, const AttentionDims&, const T*, const T*, const T*, \
      const T*, const T*, const T*, const T*, T*, T*, T*); \
  DTENSOR_KERNEL_INSTANCE void attention_merge<T>(Device, T*, T*, const T*, const T*, int64_t, int64_t); \
  DTENSOR_KERNEL_INSTANCE void heads_to_front<T>(Device, const T*, T*, int64_t, int64_t, int64_t, int64_t); \
  DTENSOR_KERNEL_INSTANCE void heads_to_back<T>(Device, const T*, T*, int64_t, int64_t, int64_t, int64_t);
DTENSOR_ATTENTION_KERNELS(float)
DTENSOR_ATTENTION_KERNELS(double)
#undef DTENSOR_ATTENTION_KERNELS
#endif
}  // namespace dtensor::compute
