#pragma once
// Ring attention (context parallelism): attention over a sequence sharded along a ring
// of ranks, each keeping its queries while the key/value blocks travel around.
//
//   forward    step t = 0 .. n-1: the block in hand is rank (r - t)'s; start sending it
//              to rank r + 1 and receiving the next from r - 1 (non-blocking point to
//              point), compute this rank's queries against it (compute/attention.hpp,
//              tiled) and merge the result into the running output by the online
//              softmax's rule (log-sum-exp weights); then wait, and swap buffers.
//   backward   the same tour with the forward's global output and log-sum-exp: each
//              block's dq is added here, its dk and dv into accumulators that travel
//              with the block (one hop behind it, sent once added to and received
//              while the next block computes), and after the last step the
//              accumulators take one more hop home to their owner.
//
// Exchanges per rank and layer on a ring of n: n - 1 forward, 2n - 1 backward (n - 1
// shifts of k/v, n of their gradients); CommCounter counts each. Blocks may have any
// lengths (uneven shards are exact): every rank knows every block's extent from the
// layout, so each receive is posted with the right size. Causal masking uses the
// blocks' global positions; a block that lies wholly after this rank's queries is
// skipped (its messages still pass, the ring stays in step). A rank that fails in the
// middle fails the others' waits (the runtimes' point-to-point rules): no hang.
//
// Tensors as compute/attention.hpp's: q, o [batch, heads, q_len, head_dim], k, v
// [batch, kv_heads, kv_len, head_dim] of this rank's block; lse [batch, heads, q_len].
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/compute/attention.hpp"
#include "dtensor/distributed/comm_counter.hpp"

namespace dtensor {

// The ring: its communicator (ranks in ring order) and the sequence's block offsets,
// rank i holding positions [offsets[i], offsets[i + 1]).
struct AttentionRing {
  Comm* comm = nullptr;
  std::vector<int64_t> offsets;

  int size() const { return comm->size(); }
  int rank() const { return comm->rank(); }
  int64_t length(int i) const { return offsets[i + 1] - offsets[i]; }
  int64_t longest() const {
    int64_t m = 0;
    for (int i = 0; i < size(); ++i) m = std::max(m, length(i));
    return m;
  }
};

namespace detail::ring {

// Posts the sends of `bufs` (each `count_out` elements) to the next rank and the
// receives into `into` (each `count_in`) from the previous one, tags first_tag, ...
// (k/v and their gradients may be in flight together: they take different tags).
template <class T>
Request shift(const AttentionRing& ring, std::initializer_list<const T*> bufs, int64_t count_out,
              std::initializer_list<T*> into, int64_t count_in, int first_tag = 0) {
  const int n = ring.size(), r = ring.rank();
  std::vector<SendSpec> sends;
  std::vector<RecvSpec> recvs;
  int tag = first_tag;
  for (const T* b : bufs) sends.push_back({(r + 1) % n, tag++, b, Region::contiguous(0, count_out)});
  tag = first_tag;
  for (T* b : into) recvs.push_back({(r + n - 1) % n, tag++, b, Region::contiguous(0, count_in), false});
  CommCounter::record_exchange(static_cast<std::size_t>(count_out) * bufs.size() * sizeof(T));
  return ring.comm->start_exchange(sends, recvs, dtype_of<T>());
}

// The dims of this rank's queries against block j.
inline local::AttentionDims block_dims(local::AttentionDims d, const AttentionRing& ring, int j) {
  d.q_offset = ring.offsets[ring.rank()];
  d.kv_offset = ring.offsets[j];
  d.kv_len = ring.length(j);
  return d;
}
inline bool block_masked(const local::AttentionDims& d) {
  return d.kv_len == 0 || d.q_len == 0 || (d.causal && d.kv_offset > d.q_offset + d.q_len - 1);
}

}  // namespace detail::ring

// o and lse of this rank's queries against the whole sequence. d: the local dims
// (q_len this rank's; kv_len, offsets are set per block from the ring).
template <class T>
void ring_attention_forward(const AttentionRing& ring, local::AttentionDims d, const T* q, const T* k, const T* v,
                            T* o, T* lse) {
  namespace R = detail::ring;
  const int n = ring.size(), r = ring.rank();
  DTENSOR_CHECK(static_cast<int>(ring.offsets.size()) == n + 1 && ring.length(r) == d.q_len, InvalidArgument,
                "ring attention: rank ", r, " holds ", d.q_len, " positions, but the ring's offsets give it ",
                static_cast<int>(ring.offsets.size()) == n + 1 ? ring.length(r) : -1);
  const int64_t kv_row = d.batch * d.kv_heads * d.head_dim;  // elements per position of k (or v)
  const int64_t rows = d.batch * d.heads * d.q_len, D = d.head_dim;
  const T inf = std::numeric_limits<T>::infinity();
  std::fill(o, o + rows * D, T(0));
  std::fill(lse, lse + rows, -inf);
  // Buffers of the longest block, never resized: messages land in them while they are in flight.
  const auto longest = static_cast<std::size_t>(kv_row * ring.longest());
  std::vector<T> cur_k(longest), cur_v(longest), next_k(longest), next_v(longest);
  std::copy_n(k, kv_row * ring.length(r), cur_k.data());
  std::copy_n(v, kv_row * ring.length(r), cur_v.data());
  std::vector<T> ob(static_cast<std::size_t>(rows * D)), lb(static_cast<std::size_t>(rows));
  for (int t = 0; t < n; ++t) {
    const int j = (r - t + n) % n, incoming = (r - t - 1 + 2 * n) % n;
    Request req;
    if (t + 1 < n)
      req = R::shift<T>(ring, {cur_k.data(), cur_v.data()}, kv_row * ring.length(j), {next_k.data(), next_v.data()},
                        kv_row * ring.length(incoming));
    const local::AttentionDims bd = R::block_dims(d, ring, j);
    if (!R::block_masked(bd)) {
      local::attention_forward(bd, q, cur_k.data(), cur_v.data(), static_cast<const T*>(nullptr), ob.data(),
                               lb.data());
      // merge: lse' = log(e^lse + e^lb), o' = o e^(lse - lse') + ob e^(lb - lse')
      for (int64_t i = 0; i < rows; ++i) {
        if (lb[i] == -inf) continue;
        if (lse[i] == -inf) {
          std::copy_n(ob.data() + i * D, D, o + i * D);
          lse[i] = lb[i];
          continue;
        }
        const T m = std::max(lse[i], lb[i]);
        const T merged = m + std::log(std::exp(lse[i] - m) + std::exp(lb[i] - m));
        const T a = std::exp(lse[i] - merged), b = std::exp(lb[i] - merged);
        for (int64_t c = 0; c < D; ++c) o[i * D + c] = a * o[i * D + c] + b * ob[i * D + c];
        lse[i] = merged;
      }
    }
    if (t + 1 < n) {
      req.wait();
      std::swap(cur_k, next_k);
      std::swap(cur_v, next_v);
    }
  }
}

// dq, dk, dv (written) of this rank's blocks from the forward's o and lse and dout.
template <class T>
void ring_attention_backward(const AttentionRing& ring, local::AttentionDims d, const T* q, const T* k, const T* v,
                             const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv) {
  namespace R = detail::ring;
  const int n = ring.size(), r = ring.rank();
  const int64_t kv_row = d.batch * d.kv_heads * d.head_dim;
  const int64_t qn = d.batch * d.heads * d.q_len * d.head_dim, own = kv_row * ring.length(r);
  // Buffers of the longest block, never resized: messages land in them while they are in flight.
  const auto longest = static_cast<std::size_t>(kv_row * ring.longest());
  std::fill(dq, dq + qn, T(0));
  std::vector<T> k_hand(longest), v_hand(longest), k_next(longest), v_next(longest);
  std::copy_n(k, own, k_hand.data());
  std::copy_n(v, own, v_hand.data());
  std::vector<T> acc_dk(longest), acc_dv(longest), in_dk(longest), in_dv(longest);
  std::vector<T> dqb(static_cast<std::size_t>(qn)), dkb(longest), dvb(longest);
  Request grads;  // the accumulators' shift, in flight during the next block's compute
  for (int t = 0; t < n; ++t) {
    const int j = (r - t + n) % n, incoming = (r - t - 1 + 2 * n) % n;
    const int64_t here = kv_row * ring.length(j), there = kv_row * ring.length(incoming);
    Request kv;
    if (t + 1 < n) kv = R::shift<T>(ring, {k_hand.data(), v_hand.data()}, here, {k_next.data(), v_next.data()}, there);
    const local::AttentionDims bd = R::block_dims(d, ring, j);
    const bool computed = !R::block_masked(bd);
    if (computed) {
      local::attention_backward(bd, q, k_hand.data(), v_hand.data(), static_cast<const T*>(nullptr), o, lse, dout,
                                dqb.data(), dkb.data(), dvb.data());
      for (int64_t i = 0; i < qn; ++i) dq[i] += dqb[i];
    }
    // Block j's accumulated gradients: zero at home, else what the previous rank sent
    // (its shift overlapped this step's compute).
    if (t == 0) {
      std::fill(acc_dk.begin(), acc_dk.begin() + here, T(0));
      std::fill(acc_dv.begin(), acc_dv.begin() + here, T(0));
    } else {
      grads.wait();
      std::swap(acc_dk, in_dk);
      std::swap(acc_dv, in_dv);
    }
    if (computed)
      for (int64_t i = 0; i < here; ++i) acc_dk[i] += dkb[i], acc_dv[i] += dvb[i];
    if (n == 1) break;
    // The accumulators follow their block to the next rank (after the last step, the
    // block's owner); the previous rank's come in (after the last step, ours).
    grads = R::shift<T>(ring, {acc_dk.data(), acc_dv.data()}, here, {in_dk.data(), in_dv.data()},
                        t + 1 < n ? there : own, 2);
    if (t + 1 < n) {
      kv.wait();
      std::swap(k_hand, k_next);
      std::swap(v_hand, v_next);
    }
  }
  if (n > 1) {
    grads.wait();
    std::copy_n(in_dk.data(), own, dk);
    std::copy_n(in_dv.data(), own, dv);
  } else {
    std::copy_n(acc_dk.data(), own, dk);
    std::copy_n(acc_dv.data(), own, dv);
  }
}

}  // namespace dtensor
