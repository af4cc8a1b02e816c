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
// middle fails the others' waits (the runtimes' point-to-point rules): no hang. The
// blocks live where the communicator keeps its buffers (the host or a GPU); on a GPU
// the core, the merges and the accumulations run as kernels on the rank's stream.
//
// A rank may hold several ranges of positions (AttentionRing::pieces): the load-balanced
// layout of a causal sequence gives rank r chunks r and 2n - 1 - r of 2n, so that every
// rank has as much work below the diagonal; each pair of a query piece and a key piece
// is then computed head by head at its global positions. relayout() moves rows between
// two layouts (the blocks of a sharded sequence and the balanced one) in one exchange.
//
// Tensors as compute/attention.hpp's: q, o [batch, heads, q_len, head_dim], k, v
// [batch, kv_heads, kv_len, head_dim] of this rank's positions (its pieces' rows in
// order); lse [batch, heads, q_len].
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/compute/attention.hpp"
#include "dtensor/core/region.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/placement/shard_layout.hpp"
#include "dtensor/tensor/movement.hpp"
#include "dtensor/tensor/tensor.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor {

// A range of sequence positions a rank holds.
struct RingPiece {
  int64_t start = 0, len = 0;
};

// The ring: its communicator (ranks in ring order) and which positions each rank holds:
// the contiguous blocks [offsets[i], offsets[i + 1]), or, where `pieces` is given,
// rank i's ranges pieces[i], its rows in that order (balanced(): the load-balanced
// layout of a causal ring).
struct AttentionRing {
  Comm* comm = nullptr;
  std::vector<int64_t> offsets;
  std::vector<std::vector<RingPiece>> pieces{};

  // The causal ring's load-balanced layout: 2n chunks of the sequence (the chunk
  // rule), rank r holding chunk r and chunk 2n - 1 - r, so that every rank has as many
  // (query, key) pairs below the diagonal as any other.
  static AttentionRing balanced(Comm& comm, int64_t total) {
    const int n = comm.size();
    std::vector<int64_t> first{0};
    for (int c = 0; c < 2 * n; ++c) first.push_back(first.back() + chunk_size(total, 2 * n, c));
    AttentionRing ring{&comm, {0, total}, {}};
    for (int r = 0; r < n; ++r)
      ring.pieces.push_back(
          {{first[r], first[r + 1] - first[r]}, {first[2 * n - 1 - r], first[2 * n - r] - first[2 * n - 1 - r]}});
    return ring;
  }

  int size() const { return comm->size(); }
  int rank() const { return comm->rank(); }
  std::vector<RingPiece> pieces_of(int i) const {
    if (!pieces.empty()) return pieces[i];
    return {{offsets[i], offsets[i + 1] - offsets[i]}};
  }
  int64_t length(int i) const {
    int64_t n = 0;
    for (const auto& p : pieces_of(i)) n += p.len;
    return n;
  }
  int64_t longest() const {
    int64_t m = 0;
    for (int i = 0; i < size(); ++i) m = std::max(m, length(i));
    return m;
  }
  int64_t total() const {
    int64_t n = 0;
    for (int i = 0; i < size(); ++i) n += length(i);
    return n;
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

// One tensor moved between two layouts of the sequence: [groups, positions, row] in
// each rank's order of its positions.
template <class T>
struct RelayoutTensor {
  const T* src = nullptr;
  T* dst = nullptr;
  int64_t groups = 1, row = 1;
};

// Moves rows from layout `from` to layout `to` (the same ranks, the same sequence):
// one point-to-point exchange; each message one intersection of a piece that a rank
// holds in `from` with a piece that another (or itself) holds in `to`, every rank
// deriving every message from the two layouts.
template <class T>
void relayout(const AttentionRing& from, const AttentionRing& to, std::initializer_list<RelayoutTensor<T>> tensors) {
  const int n = from.size(), me = from.rank();
  std::vector<SendSpec> sends;
  std::vector<RecvSpec> recvs;
  int64_t sent = 0;
  // rows of `ps` before piece i
  auto row_of = [](const std::vector<RingPiece>& ps, std::size_t i) {
    int64_t r = 0;
    for (std::size_t k = 0; k < i; ++k) r += ps[k].len;
    return r;
  };
  for (int s = 0; s < n; ++s)
    for (int t = 0; t < n; ++t) {
      if (s != me && t != me) continue;
      const auto fs = from.pieces_of(s), tt = to.pieces_of(t);
      const int64_t ls = from.length(s), lt = to.length(t);
      for (std::size_t i = 0; i < fs.size(); ++i)
        for (std::size_t j = 0; j < tt.size(); ++j) {
          const int64_t lo = std::max(fs[i].start, tt[j].start);
          const int64_t hi = std::min(fs[i].start + fs[i].len, tt[j].start + tt[j].len);
          if (lo >= hi) continue;
          int tensor = 0;
          for (const auto& x : tensors) {
            const int tag = (tensor++ * 16 + static_cast<int>(i)) * 16 + static_cast<int>(j);
            const Shape<3> size{x.groups, hi - lo, x.row};
            if (s == me) {
              const Shape<3> at{0, row_of(fs, i) + lo - fs[i].start, 0};
              sends.push_back({t, tag, x.src, Region::box(Shape<3>{x.groups, ls, x.row}, at, size).simplified()});
              sent += x.groups * (hi - lo) * x.row;
            }
            if (t == me) {
              const Shape<3> at{0, row_of(tt, j) + lo - tt[j].start, 0};
              recvs.push_back(
                  {s, tag, x.dst, Region::box(Shape<3>{x.groups, lt, x.row}, at, size).simplified(), false});
            }
          }
        }
    }
  if (n > 1) CommCounter::record_exchange(static_cast<std::size_t>(sent) * sizeof(T));  // (alone: a local copy)
  from.comm->start_exchange(sends, recvs, dtype_of<T>()).wait();
}

// f(dims, q row, k row) for each pair of a query piece of this rank and a key piece of
// block j that causal masking does not wholly drop, and each (batch, query head): the
// core's dims for that head's rows (one head, the pieces' global positions) and the
// first rows of q (in this rank's layout, `q_len` rows per head) and of k (in block j's).
// Where both ranks hold one piece, one call covers every head (dims of the whole
// blocks, first rows 0): one launch per block on a GPU rather than one per head.
template <class F>
void for_each_piece_pair(const compute::AttentionDims& d, const AttentionRing& ring, int j, F&& f) {
  const auto mine = ring.pieces_of(ring.rank()), theirs = ring.pieces_of(j);
  const int64_t kv_len = ring.length(j), total = ring.total(), group = d.heads / d.kv_heads;
  if (mine.size() == 1 && theirs.size() == 1) {  // whole blocks: every head in one call
    const RingPiece p = mine[0], s = theirs[0];
    if (p.len == 0 || s.len == 0 || (d.causal && s.start > p.start + p.len - 1)) return;
    compute::AttentionDims all = d;
    all.q_len = p.len, all.kv_len = s.len, all.q_offset = p.start, all.kv_offset = s.start;
    all.dropout.heads_total = d.dropout.heads_total ? d.dropout.heads_total : d.heads;
    all.dropout.q_total = d.dropout.q_total ? d.dropout.q_total : total;
    all.dropout.kv_total = d.dropout.kv_total ? d.dropout.kv_total : total;
    return f(all, int64_t{0}, int64_t{0});
  }
  int64_t qrow = 0;
  for (const RingPiece& p : mine) {
    int64_t krow = 0;
    for (const RingPiece& s : theirs) {
      const bool masked = p.len == 0 || s.len == 0 || (d.causal && s.start > p.start + p.len - 1);
      if (!masked)
        for (int64_t b = 0; b < d.batch; ++b)
          for (int64_t h = 0; h < d.heads; ++h) {
            compute::AttentionDims one = d;
            one.batch = 1, one.heads = 1, one.kv_heads = 1;
            one.q_len = p.len, one.kv_len = s.len, one.q_offset = p.start, one.kv_offset = s.start;
            one.dropout.batch_offset = d.dropout.batch_offset + b;
            one.dropout.head_offset = d.dropout.head_offset + h;
            one.dropout.heads_total = d.dropout.heads_total ? d.dropout.heads_total : d.heads;
            one.dropout.q_total = d.dropout.q_total ? d.dropout.q_total : total;
            one.dropout.kv_total = d.dropout.kv_total ? d.dropout.kv_total : total;
            const int64_t bh = b * d.heads + h, bkv = b * d.kv_heads + h / group;
            f(one, bh * d.q_len + qrow, bkv * kv_len + krow);
          }
      krow += s.len;
    }
    qrow += p.len;
  }
}

}  // namespace detail::ring

namespace detail::ring {

// A buffer on the ring's device (its communicator's: host memory or a GPU's).
template <class T>
Tensor<T, 1> buffer(Device dev, int64_t n) {
  return Tensor<T, 1>::uninitialized({n}, dev);
}
// dst[0, n) = src[0, n) on that device.
template <class T>
void copy(Device dev, const T* src, T* dst, int64_t n) {
  if (n > 0)
    movement::copy_block(dev, src, StridedBlock::contiguous(0, n), dst, StridedBlock::contiguous(0, n), sizeof(T));
}
// dst[0, n) += src[0, n) on that device.
template <class T>
void add(Device dev, const T* src, T* dst, int64_t n) {
  if (n > 0)
    movement::reduce_block(dev, dtype_of<T>(), ReduceOp::Sum, src, StridedBlock::contiguous(0, n), dst,
                           StridedBlock::contiguous(0, n));
}

}  // namespace detail::ring

// o and lse of this rank's queries against the whole sequence. d: the local dims
// (q_len this rank's; kv_len, offsets are set per block from the ring). The tensors
// live where the ring's communicator keeps its buffers (Comm::device()): host memory,
// or a GPU, where the attention core, the merges and the copies run as kernels.
template <class T>
void ring_attention_forward(const AttentionRing& ring, compute::AttentionDims d, const T* q, const T* k, const T* v,
                            T* o, T* lse) {
  namespace R = detail::ring;
  const int n = ring.size(), r = ring.rank();
  DTENSOR_CHECK((ring.pieces.empty() ? static_cast<int>(ring.offsets.size()) == n + 1
                                     : static_cast<int>(ring.pieces.size()) == n) &&
                    ring.length(r) == d.q_len,
                InvalidArgument, "ring attention: rank ", r, " holds ", d.q_len,
                " positions, but the ring's layout gives it another count or has no entry for every rank");
  const Device dev = ring.comm->device();
  const int64_t kv_row = d.batch * d.kv_heads * d.head_dim;  // elements per position of k (or v)
  const int64_t rows = d.batch * d.heads * d.q_len, D = d.head_dim;
  movement::fill(dev, o, rows * D, T(0));
  movement::fill(dev, lse, rows, -std::numeric_limits<T>::infinity());
  // Buffers of the longest block, never resized: messages land in them while they are in flight.
  const int64_t longest = kv_row * ring.longest();
  Tensor<T, 1> cur_k = R::buffer<T>(dev, longest), cur_v = R::buffer<T>(dev, longest);
  Tensor<T, 1> next_k = R::buffer<T>(dev, longest), next_v = R::buffer<T>(dev, longest);
  R::copy(dev, k, cur_k.data(), kv_row * ring.length(r));
  R::copy(dev, v, cur_v.data(), kv_row * ring.length(r));
  // one call's result: one head's rows, or every head's (for_each_piece_pair)
  Tensor<T, 1> ob = R::buffer<T>(dev, rows * D), lb = R::buffer<T>(dev, rows);
  for (int t = 0; t < n; ++t) {
    const int j = (r - t + n) % n, incoming = (r - t - 1 + 2 * n) % n;
    Request req;
    if (t + 1 < n)
      req = R::shift<T>(ring, {cur_k.data(), cur_v.data()}, kv_row * ring.length(j), {next_k.data(), next_v.data()},
                        kv_row * ring.length(incoming));
    // This rank's query pieces against block j's key pieces, each result merged into
    // the running output by log-sum-exp (compute::attention_merge).
    R::for_each_piece_pair(d, ring, j, [&](const compute::AttentionDims& one, int64_t qrow, int64_t krow) {
      const int64_t nq = one.batch * one.heads * one.q_len;
      compute::attention_forward(dev, one, q + qrow * D, cur_k.data() + krow * D, cur_v.data() + krow * D,
                                 static_cast<const T*>(nullptr), ob.data(), lb.data());
      compute::attention_merge(dev, o + qrow * D, lse + qrow, ob.data(), lb.data(), nq, D);
    });
    if (t + 1 < n) {
      req.wait();
      std::swap(cur_k, next_k);
      std::swap(cur_v, next_v);
    }
  }
}

// dq, dk, dv (written) of this rank's blocks from the forward's o and lse and dout
// (on the ring's device, as the forward).
template <class T>
void ring_attention_backward(const AttentionRing& ring, compute::AttentionDims d, const T* q, const T* k, const T* v,
                             const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv) {
  namespace R = detail::ring;
  const int n = ring.size(), r = ring.rank();
  const Device dev = ring.comm->device();
  const int64_t kv_row = d.batch * d.kv_heads * d.head_dim, D = d.head_dim;
  const int64_t qn = d.batch * d.heads * d.q_len * d.head_dim, own = kv_row * ring.length(r);
  // Buffers of the longest block, never resized: messages land in them while they are in flight.
  const int64_t longest = kv_row * ring.longest();
  movement::fill(dev, dq, qn, T(0));
  Tensor<T, 1> k_hand = R::buffer<T>(dev, longest), v_hand = R::buffer<T>(dev, longest);
  Tensor<T, 1> k_next = R::buffer<T>(dev, longest), v_next = R::buffer<T>(dev, longest);
  R::copy(dev, k, k_hand.data(), own);
  R::copy(dev, v, v_hand.data(), own);
  Tensor<T, 1> acc_dk = R::buffer<T>(dev, longest), acc_dv = R::buffer<T>(dev, longest);
  Tensor<T, 1> in_dk = R::buffer<T>(dev, longest), in_dv = R::buffer<T>(dev, longest);
  Tensor<T, 1> dkb = R::buffer<T>(dev, longest), dvb = R::buffer<T>(dev, longest);
  // one call's dq, dk, dv: one head's rows, or every head's (for_each_piece_pair)
  Tensor<T, 1> dqh = R::buffer<T>(dev, qn), dkh = R::buffer<T>(dev, longest), dvh = R::buffer<T>(dev, longest);
  Request grads;  // the accumulators' shift, in flight during the next block's compute
  for (int t = 0; t < n; ++t) {
    const int j = (r - t + n) % n, incoming = (r - t - 1 + 2 * n) % n;
    const int64_t here = kv_row * ring.length(j), there = kv_row * ring.length(incoming);
    Request kv;
    if (t + 1 < n) kv = R::shift<T>(ring, {k_hand.data(), v_hand.data()}, here, {k_next.data(), v_next.data()}, there);
    // dq added here; block j's dk and dv into dkb, dvb (then into its accumulators).
    movement::fill(dev, dkb.data(), here, T(0));
    movement::fill(dev, dvb.data(), here, T(0));
    R::for_each_piece_pair(d, ring, j, [&](const compute::AttentionDims& one, int64_t qrow, int64_t krow) {
      const int64_t nq = one.batch * one.heads * one.q_len * D, nk = one.batch * one.kv_heads * one.kv_len * D;
      compute::attention_backward(dev, one, q + qrow * D, k_hand.data() + krow * D, v_hand.data() + krow * D,
                                  static_cast<const T*>(nullptr), o + qrow * D, lse + qrow, dout + qrow * D,
                                  dqh.data(), dkh.data(), dvh.data());
      R::add(dev, dqh.data(), dq + qrow * D, nq);
      R::add(dev, dkh.data(), dkb.data() + krow * D, nk);
      R::add(dev, dvh.data(), dvb.data() + krow * D, nk);
    });
    // StridedBlock j's accumulated gradients: zero at home, else what the previous rank sent
    // (its shift overlapped this step's compute).
    if (t == 0) {
      movement::fill(dev, acc_dk.data(), here, T(0));
      movement::fill(dev, acc_dv.data(), here, T(0));
    } else {
      grads.wait();
      std::swap(acc_dk, in_dk);
      std::swap(acc_dv, in_dv);
    }
    R::add(dev, dkb.data(), acc_dk.data(), here);
    R::add(dev, dvb.data(), acc_dv.data(), here);
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
  if (n > 1) grads.wait();  // our block's accumulators, home after the last hop
  R::copy(dev, n > 1 ? in_dk.data() : acc_dk.data(), dk, own);
  R::copy(dev, n > 1 ? in_dv.data() : acc_dv.data(), dv, own);
}

#ifdef DTENSOR_KERNEL_INSTANCE  // compiled once in the compiled runtime (util/compiled_runtime.hpp)
#define DTENSOR_RING_KERNELS(T) \
  DTENSOR_KERNEL_INSTANCE void ring_attention_forward<T>(const AttentionRing&, compute::AttentionDims, const T*, \
      const T*, const T*, T*, T*); \
  DTENSOR_KERNEL_INSTANCE void ring_attention_backward<T>(const AttentionRing&, compute::AttentionDims, const T*, \
      const T*, const T*, const T*, const T*, const T*, T*, T*, T*);
DTENSOR_RING_KERNELS(float)
DTENSOR_RING_KERNELS(double)
#undef DTENSOR_RING_KERNELS
#endif
}  // namespace dtensor
