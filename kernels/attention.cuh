#pragma once
// Scaled dot-product attention on one rank's blocks, with compute/attention.hpp's
// definition and rules (compute/attention_dims.hpp: causal masking by global positions,
// grouped-query heads, dropout drawn from each weight's global index, a row with no key
// gives 0 and lse -inf), tiled in shared memory with an online softmax, so that the
// [q_len, kv_len] weights never exist in global memory.
//
//   attention_forward_kernel   one block per (batch x head, tile of query rows): o, lse
//   attention_dq_kernel        one block per (batch x head, tile of query rows): dq
//   attention_dkv_kernel       one block per (batch x kv head, tile of key rows): dk, dv,
//                              over the group's query heads and every query tile
//   attention_merge_kernel     one thread per row: a partial result (over some keys)
//                              merged into a running one by log-sum-exp (ring attention)
// The backward recomputes the weights from lse in both of its kernels (twice the score
// products of a fused backward) so that each block owns the rows it writes: no atomics,
// the same bits on every run, and kernels that the host launcher runs in CI.
//
// `tile` rows of q and of k/v per tile (attention_tile picks it from the head dim and
// the element size so the block's shared memory fits 48 KiB); the block's threads
// stride over each tile's elements. Sums are in T, as on the host.
#include <cmath>
#include <cstdint>

#include "dtensor/compute/attention_dims.hpp"
#include "elementwise.cuh"
#include "grid.cuh"

namespace dtensor::cuda::kernels::detail {

using ::dtensor::compute::AttentionDims;

template <class T>
DTENSOR_DEVICE inline T dinf() {
  return static_cast<T>(INFINITY);
}

// The row pitch of a [tile, head_dim] array in shared memory: odd, so that the threads
// of a warp reading column e of consecutive rows hit different banks.
DTENSOR_HOST_DEVICE constexpr int64_t attention_pitch(int64_t dim) { return dim | 1; }

// Shared memory per block, in elements of T, for tiles of `b` rows and head dim `dim`:
// `per_row` [tile, dim] arrays, `per_pair` [tile, tile] arrays and `per_row_scalars`
// [tile] arrays.
constexpr int64_t attention_shared_elems(int64_t b, int64_t dim, int per_row, int per_pair, int per_row_scalars) {
  return per_row * b * attention_pitch(dim) + per_pair * b * b + per_row_scalars * b;
}
// Forward: q, acc, k, v; scores; m, l, rescale.
constexpr int kForwardRows = 4, kForwardPairs = 1, kForwardScalars = 3;
// dq: q, do, dq, k, v; dS; lse, delta.  dk/dv: k, v, dk, dv, q, do; P, dS; lse, delta.
constexpr int kDqRows = 5, kDkvRows = 6, kBackwardPairs = 2, kBackwardScalars = 2;
constexpr int64_t kAttentionSharedBytes = 48 * 1024;  // a block's dynamic shared memory without opting in

// The largest tile of at most 64 rows whose arrays fit kAttentionSharedBytes, 0 if not one row does.
inline int64_t attention_tile(int64_t dim, int64_t elem_bytes, int per_row, int per_pair, int per_row_scalars) {
  for (int64_t b = 64; b >= 1; b /= 2)
    if (attention_shared_elems(b, dim, per_row, per_pair, per_row_scalars) * elem_bytes <= kAttentionSharedBytes)
      return b;
  return 0;
}

// The scaled score of query row r of sq against key row c of sk (both [tile, dim] in
// shared memory) plus the mask, or -inf where causal masking drops the pair. i0, j0:
// the tiles' first rows in the block.
template <class T>
DTENSOR_DEVICE inline T attention_score(const AttentionDims& d, const T* sq, const T* sk, const T* mask, int64_t i0,
                                        int64_t j0, int64_t r, int64_t c) {
  if (!::dtensor::compute::attention_sees(d, i0 + r, j0 + c)) return -dinf<T>();
  const int64_t D = d.head_dim, P = attention_pitch(D);
  T s = 0;
  for (int64_t e = 0; e < D; ++e) s += sq[r * P + e] * sk[c * P + e];
  s *= static_cast<T>(d.scale);
  if (mask) s += mask[(i0 + r) * d.kv_len + j0 + c];
  return s;
}

// Copies rows [0, n) of a [*, dim] array into shared memory, rows attention_pitch(dim)
// apart (the block's threads together).
template <class T>
DTENSOR_DEVICE inline void attention_load(T* dst, const T* src, int64_t n, int64_t dim) {
  for (int64_t e = threadIdx.x; e < n * dim; e += blockDim.x) dst[e / dim * attention_pitch(dim) + e % dim] = src[e];
}

// d.scale resolved (not 0) by the launcher.
template <class T>
DTENSOR_KERNEL void attention_forward_kernel(AttentionDims d, const T* __restrict__ q, const T* __restrict__ k,
                                             const T* __restrict__ v, const T* __restrict__ mask, T* __restrict__ o,
                                             T* __restrict__ lse, int64_t tile) {
  DTENSOR_DYNAMIC_SHARED(T, shared);
  const int64_t B = tile, D = d.head_dim, P = attention_pitch(D);
  T* sq = shared;
  T* acc = sq + B * P;
  T* sk = acc + B * P;
  T* sv = sk + B * P;
  T* ss = sv + B * P;
  T* m = ss + B * B;
  T* l = m + B;
  T* rescale = l + B;
  const T inf = dinf<T>();
  const int64_t tiles = (d.q_len + B - 1) / B, group = d.heads / d.kv_heads;
  for (int64_t job = blockIdx.x; job < d.batch * d.heads * tiles; job += gridDim.x) {  // uniform per block
    const int64_t bh = job / tiles, i0 = job % tiles * B, ni = d.q_len - i0 < B ? d.q_len - i0 : B;
    const int64_t bkv = bh / d.heads * d.kv_heads + bh % d.heads / group;
    const T* kh = k + bkv * d.kv_len * D;
    const T* vh = v + bkv * d.kv_len * D;
    attention_load(sq, q + (bh * d.q_len + i0) * D, ni, D);
    for (int64_t e = threadIdx.x; e < ni * D; e += blockDim.x) acc[e] = 0;
    for (int64_t r = threadIdx.x; r < ni; r += blockDim.x) m[r] = -inf, l[r] = 0;
    for (int64_t j0 = 0; j0 < d.kv_len; j0 += B) {
      if (::dtensor::compute::attention_tile_masked(d, i0, ni, j0)) break;  // and every later tile
      const int64_t nj = d.kv_len - j0 < B ? d.kv_len - j0 : B;
      attention_load(sk, kh + j0 * D, nj, D);
      attention_load(sv, vh + j0 * D, nj, D);
      DTENSOR_SYNCTHREADS();
      for (int64_t e = threadIdx.x; e < ni * nj; e += blockDim.x) {
        const int64_t r = e / nj, c = e % nj;
        ss[r * B + c] = attention_score(d, sq, sk, mask, i0, j0, r, c);
      }
      DTENSOR_SYNCTHREADS();
      // Each row's running maximum and sum; the weights in place of the scores.
      for (int64_t r = threadIdx.x; r < ni; r += blockDim.x) {
        T mx = m[r];
        for (int64_t c = 0; c < nj; ++c) mx = ss[r * B + c] > mx ? ss[r * B + c] : mx;
        T sum = 0;
        for (int64_t c = 0; c < nj; ++c) {
          T p = mx == -inf ? T(0) : dexp(ss[r * B + c] - mx);  // every key so far masked: no weight yet
          sum += p;
          // the normalisation counts every weight; the output the kept ones
          if (d.dropout.p > 0) p *= ::dtensor::compute::attention_dropout_factor<T>(d, bh, i0 + r, j0 + c);
          ss[r * B + c] = p;
        }
        // the earlier terms' factor exp(m - m_new): 0 where there were none, 1 where
        // there still are none (both -inf: exp would give NaN)
        const T f = mx == -inf ? T(1) : m[r] == -inf ? T(0) : dexp(m[r] - mx);
        l[r] = l[r] * f + sum;
        rescale[r] = f;
        m[r] = mx;
      }
      DTENSOR_SYNCTHREADS();
      for (int64_t e = threadIdx.x; e < ni * D; e += blockDim.x) {
        const int64_t r = e / D, c = e % D;
        T a = acc[e] * rescale[r];
        for (int64_t j = 0; j < nj; ++j) a += ss[r * B + j] * sv[j * P + c];
        acc[e] = a;
      }
      DTENSOR_SYNCTHREADS();
    }
    DTENSOR_SYNCTHREADS();  // l and m of rows that no key tile reached: written by other threads
    T* ot = o + (bh * d.q_len + i0) * D;
    for (int64_t e = threadIdx.x; e < ni * D; e += blockDim.x) {
      const T sum = l[e / D];
      ot[e] = sum > 0 ? acc[e] / sum : T(0);
    }
    for (int64_t r = threadIdx.x; r < ni; r += blockDim.x)
      lse[bh * d.q_len + i0 + r] = l[r] > 0 ? m[r] + dlog(l[r]) : -inf;
    DTENSOR_SYNCTHREADS();  // before the next job overwrites the tiles
  }
}

// lse and delta = sum(do * o) of query rows [i0, i0 + ni) of head bh into shared memory.
template <class T>
DTENSOR_DEVICE inline void attention_row_terms(const AttentionDims& d, const T* o, const T* lse, const T* dout,
                                               int64_t bh, int64_t i0, int64_t ni, T* slse, T* delta) {
  const int64_t D = d.head_dim;
  for (int64_t r = threadIdx.x; r < ni; r += blockDim.x) {
    const T* orow = o + (bh * d.q_len + i0 + r) * D;
    const T* drow = dout + (bh * d.q_len + i0 + r) * D;
    T s = 0;
    for (int64_t c = 0; c < D; ++c) s += drow[c] * orow[c];
    delta[r] = s;
    slse[r] = lse[bh * d.q_len + i0 + r];
  }
}

// P = exp(S - lse) (0 in a row with no key) and dP = do v^T (through the dropout mask)
// of the pair (r, c): *p the weight, *ds = P (dP - delta), *pk the kept-and-scaled weight
// (what dv sums).
template <class T>
DTENSOR_DEVICE inline void attention_pair_grads(const AttentionDims& d, const T* sq, const T* sk, const T* sdo,
                                                const T* sv, const T* mask, const T* slse, const T* delta, int64_t bh,
                                                int64_t i0, int64_t j0, int64_t r, int64_t c, T* ds, T* pk) {
  const int64_t D = d.head_dim, P = attention_pitch(D);
  const T s = attention_score(d, sq, sk, mask, i0, j0, r, c);
  const T p = slse[r] == -dinf<T>() ? T(0) : dexp(s - slse[r]);
  T dp = 0;
  for (int64_t e = 0; e < D; ++e) dp += sdo[r * P + e] * sv[c * P + e];
  T keep = 1;
  if (d.dropout.p > 0) keep = ::dtensor::compute::attention_dropout_factor<T>(d, bh, i0 + r, j0 + c);
  *ds = p * (dp * keep - delta[r]);
  if (pk) *pk = p * keep;
}

template <class T>
DTENSOR_KERNEL void attention_dq_kernel(AttentionDims d, const T* __restrict__ q, const T* __restrict__ k,
                                        const T* __restrict__ v, const T* __restrict__ mask, const T* __restrict__ o,
                                        const T* __restrict__ lse, const T* __restrict__ dout, T* __restrict__ dq,
                                        int64_t tile) {
  DTENSOR_DYNAMIC_SHARED(T, shared);
  const int64_t B = tile, D = d.head_dim, P = attention_pitch(D);
  T* sq = shared;
  T* sdo = sq + B * P;
  T* sdq = sdo + B * P;
  T* sk = sdq + B * P;
  T* sv = sk + B * P;
  T* sds = sv + B * P;
  T* slse = sds + B * B;
  T* delta = slse + B;
  const T scale = static_cast<T>(d.scale);
  const int64_t tiles = (d.q_len + B - 1) / B, group = d.heads / d.kv_heads;
  for (int64_t job = blockIdx.x; job < d.batch * d.heads * tiles; job += gridDim.x) {
    const int64_t bh = job / tiles, i0 = job % tiles * B, ni = d.q_len - i0 < B ? d.q_len - i0 : B;
    const int64_t bkv = bh / d.heads * d.kv_heads + bh % d.heads / group;
    attention_load(sq, q + (bh * d.q_len + i0) * D, ni, D);
    attention_load(sdo, dout + (bh * d.q_len + i0) * D, ni, D);
    for (int64_t e = threadIdx.x; e < ni * D; e += blockDim.x) sdq[e] = 0;
    attention_row_terms(d, o, lse, dout, bh, i0, ni, slse, delta);
    for (int64_t j0 = 0; j0 < d.kv_len; j0 += B) {
      if (::dtensor::compute::attention_tile_masked(d, i0, ni, j0)) break;
      const int64_t nj = d.kv_len - j0 < B ? d.kv_len - j0 : B;
      attention_load(sk, k + (bkv * d.kv_len + j0) * D, nj, D);
      attention_load(sv, v + (bkv * d.kv_len + j0) * D, nj, D);
      DTENSOR_SYNCTHREADS();
      for (int64_t e = threadIdx.x; e < ni * nj; e += blockDim.x) {
        const int64_t r = e / nj, c = e % nj;
        attention_pair_grads(d, sq, sk, sdo, sv, mask, slse, delta, bh, i0, j0, r, c, &sds[r * B + c],
                             static_cast<T*>(nullptr));
      }
      DTENSOR_SYNCTHREADS();
      for (int64_t e = threadIdx.x; e < ni * D; e += blockDim.x) {  // dq += scale dS k
        const int64_t r = e / D, c = e % D;
        T a = 0;
        for (int64_t j = 0; j < nj; ++j) a += sds[r * B + j] * sk[j * P + c];
        sdq[e] += scale * a;
      }
      DTENSOR_SYNCTHREADS();
    }
    T* out = dq + (bh * d.q_len + i0) * D;
    for (int64_t e = threadIdx.x; e < ni * D; e += blockDim.x) out[e] = sdq[e];
    DTENSOR_SYNCTHREADS();
  }
}

template <class T>
DTENSOR_KERNEL void attention_dkv_kernel(AttentionDims d, const T* __restrict__ q, const T* __restrict__ k,
                                         const T* __restrict__ v, const T* __restrict__ mask, const T* __restrict__ o,
                                         const T* __restrict__ lse, const T* __restrict__ dout, T* __restrict__ dk,
                                         T* __restrict__ dv, int64_t tile) {
  DTENSOR_DYNAMIC_SHARED(T, shared);
  const int64_t B = tile, D = d.head_dim, P = attention_pitch(D);
  T* sk = shared;
  T* sv = sk + B * P;
  T* sdk = sv + B * P;
  T* sdv = sdk + B * P;
  T* sq = sdv + B * P;
  T* sdo = sq + B * P;
  T* sp = sdo + B * P;
  T* sds = sp + B * B;
  T* slse = sds + B * B;
  T* delta = slse + B;
  const T scale = static_cast<T>(d.scale);
  const int64_t tiles = (d.kv_len + B - 1) / B, group = d.heads / d.kv_heads;
  for (int64_t job = blockIdx.x; job < d.batch * d.kv_heads * tiles; job += gridDim.x) {
    const int64_t bkv = job / tiles, j0 = job % tiles * B, nj = d.kv_len - j0 < B ? d.kv_len - j0 : B;
    const int64_t b = bkv / d.kv_heads, first_head = bkv % d.kv_heads * group;
    attention_load(sk, k + (bkv * d.kv_len + j0) * D, nj, D);
    attention_load(sv, v + (bkv * d.kv_len + j0) * D, nj, D);
    for (int64_t e = threadIdx.x; e < nj * D; e += blockDim.x) sdk[e] = 0, sdv[e] = 0;
    for (int64_t h = first_head; h < first_head + group; ++h) {
      const int64_t bh = b * d.heads + h;
      for (int64_t i0 = 0; i0 < d.q_len; i0 += B) {
        const int64_t ni = d.q_len - i0 < B ? d.q_len - i0 : B;
        if (::dtensor::compute::attention_tile_masked(d, i0, ni, j0)) continue;  // a later query tile may see it
        attention_load(sq, q + (bh * d.q_len + i0) * D, ni, D);
        attention_load(sdo, dout + (bh * d.q_len + i0) * D, ni, D);
        attention_row_terms(d, o, lse, dout, bh, i0, ni, slse, delta);
        DTENSOR_SYNCTHREADS();
        for (int64_t e = threadIdx.x; e < ni * nj; e += blockDim.x) {
          const int64_t r = e / nj, c = e % nj;
          attention_pair_grads(d, sq, sk, sdo, sv, mask, slse, delta, bh, i0, j0, r, c, &sds[r * B + c],
                               &sp[r * B + c]);
        }
        DTENSOR_SYNCTHREADS();
        for (int64_t e = threadIdx.x; e < nj * D; e += blockDim.x) {  // dv += P^T do, dk += scale dS^T q
          const int64_t j = e / D, c = e % D;
          T av = 0, ak = 0;
          for (int64_t r = 0; r < ni; ++r) {
            av += sp[r * B + j] * sdo[r * P + c];
            ak += sds[r * B + j] * sq[r * P + c];
          }
          sdv[e] += av;
          sdk[e] += scale * ak;
        }
        DTENSOR_SYNCTHREADS();
      }
    }
    for (int64_t e = threadIdx.x; e < nj * D; e += blockDim.x) {
      dk[(bkv * d.kv_len + j0) * D + e] = sdk[e];
      dv[(bkv * d.kv_len + j0) * D + e] = sdv[e];
    }
    DTENSOR_SYNCTHREADS();
  }
}

// o, lse (a result over some keys) merged with ob, lb (over others), in place:
// lse' = log(e^lse + e^lb), o' = o e^(lse - lse') + ob e^(lb - lse'); a side with
// lse -inf (no key) contributes nothing. compute/attention.hpp's attention_merge.
template <class T>
DTENSOR_KERNEL void attention_merge_kernel(T* __restrict__ o, T* __restrict__ lse, const T* __restrict__ ob,
                                           const T* __restrict__ lb, int64_t rows, int64_t dim) {
  const T inf = dinf<T>();
  for (int64_t i = first(); i < rows; i += stride()) {
    const T l = lse[i], b = lb[i];
    T* oi = o + i * dim;
    const T* bi = ob + i * dim;
    if (b == -inf) continue;
    if (l == -inf) {
      for (int64_t c = 0; c < dim; ++c) oi[c] = bi[c];
      lse[i] = b;
      continue;
    }
    const T m = l > b ? l : b;
    const T merged = m + dlog(dexp(l - m) + dexp(b - m));
    const T fa = dexp(l - merged), fb = dexp(b - merged);
    for (int64_t c = 0; c < dim; ++c) oi[c] = fa * oi[c] + fb * bi[c];
    lse[i] = merged;
  }
}

}  // namespace dtensor::cuda::kernels::detail
