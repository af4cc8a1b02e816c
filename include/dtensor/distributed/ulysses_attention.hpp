#pragma once
// All-to-all attention (DeepSpeed Ulysses), the other scheme of context parallelism:
// the sequence is sharded over a group of n ranks; one all-to-all per tensor trades
// it for a split of the heads, so that every rank attends over the whole sequence for
// H / n of the heads, and one all-to-all trades back.
//
//   forward    q, k, v [b, heads, this rank's positions, D] --all-to-all--> [b, heads / n,
//              all positions, D]; the attention core (compute/attention.hpp) on the
//              whole sequence; o and lse --all-to-all--> back to this rank's positions
//   backward   dout the same way; the core's backward with the saved head-split
//              tensors; dq, dk, dv back to this rank's positions
//
// All-to-alls on the group per layer: 5 forward (q, k, v, o, lse), 4 backward (do, dq,
// dk, dv); each moves (n - 1) / n of its tensor, against the ring's n - 1 shifts of the
// whole k/v block. The query and key/value head counts must be multiples of n (checked,
// with the counts named). Blocks of the sequence may be uneven: every rank knows them
// all, and each all-to-all's blocks are strided ranges of the row-major tensors, moved
// in place (core/block.hpp). Causal masking and dropout see global positions and heads.
// The tensors live where the group's communicator keeps its buffers: the host or a GPU.
#include <cstdint>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/compute/attention.hpp"
#include "dtensor/distributed/comm_counter.hpp"
#include "dtensor/distributed/ring_attention.hpp"
#include "dtensor/tensor/tensor.hpp"

namespace dtensor {

template <class T>
class UlyssesAttention {
 public:
  // group: the sequence's ranks and blocks (AttentionRing: communicator and offsets);
  // mesh_dim: the mesh dim it is, for CommCounter.
  UlyssesAttention(AttentionRing group, int mesh_dim) : g_(std::move(group)), mesh_dim_(mesh_dim) {}

  // d: this rank's dims (q_len its block's length; every head). Writes o and lse of its
  // positions; keeps what the backward needs.
  void forward(compute::AttentionDims d, const T* q, const T* k, const T* v, T* o, T* lse) {
    const int n = g_.size(), r = g_.rank();
    DTENSOR_CHECK(d.heads % n == 0 && d.kv_heads % n == 0, InvalidArgument, "all-to-all attention: ", d.heads,
                  " query heads and ", d.kv_heads, " key/value heads over ", n,
                  " ranks: both must be multiples of the ranks (use the ring instead, or another head count)");
    DTENSOR_CHECK(g_.pieces.empty(), InvalidArgument,
                  "all-to-all attention: the group's ranks must hold contiguous blocks of the sequence (offsets)");
    DTENSOR_CHECK(g_.length(r) == d.q_len, InvalidArgument, "all-to-all attention: rank ", r, " holds ", d.q_len,
                  " positions, the group's offsets give it ", g_.length(r));
    local_ = d;
    heads_ = d;  // the whole sequence, this rank's heads
    heads_.heads = d.heads / n;
    heads_.kv_heads = d.kv_heads / n;
    heads_.q_len = heads_.kv_len = g_.offsets.back();
    heads_.q_offset = heads_.kv_offset = 0;
    if (d.dropout.p > 0) {
      heads_.dropout.head_offset = d.dropout.head_offset + r * heads_.heads;
      heads_.dropout.heads_total = d.dropout.heads_total ? d.dropout.heads_total : d.heads;
      heads_.dropout.q_total = heads_.dropout.kv_total = heads_.q_len;
    }
    const int64_t L = heads_.q_len, D = d.head_dim;
    const Device dev = g_.comm->device();
    q_ = buffer(d.batch * heads_.heads * L * D);
    k_ = buffer(d.batch * heads_.kv_heads * L * D);
    v_ = buffer(k_.numel());
    o_ = buffer(q_.numel());
    lse_ = buffer(d.batch * heads_.heads * L);
    to_heads(q, q_.data(), d.heads, D);
    to_heads(k, k_.data(), d.kv_heads, D);
    to_heads(v, v_.data(), d.kv_heads, D);
    compute::attention_forward(dev, heads_, q_.data(), k_.data(), v_.data(), static_cast<const T*>(nullptr), o_.data(),
                               lse_.data());
    to_positions(o_.data(), o, d.heads, D);
    to_positions(lse_.data(), lse, d.heads, 1);
  }

  void backward(const T* dout, T* dq, T* dk, T* dv) {
    const int64_t D = local_.head_dim;
    Tensor<T, 1> dout_h = buffer(o_.numel()), dq_h = buffer(q_.numel()), dk_h = buffer(k_.numel()),
                 dv_h = buffer(v_.numel());
    to_heads(dout, dout_h.data(), local_.heads, D);
    const T* no_mask = nullptr;
    compute::attention_backward(g_.comm->device(), heads_, q_.data(), k_.data(), v_.data(), no_mask, o_.data(),
                                lse_.data(), dout_h.data(), dq_h.data(), dk_h.data(), dv_h.data());
    to_positions(dq_h.data(), dq, local_.heads, D);
    to_positions(dk_h.data(), dk, local_.kv_heads, D);
    to_positions(dv_h.data(), dv, local_.kv_heads, D);
  }

 private:
  // [b, heads, this rank's positions, row] -> [b, heads / n, all positions, row]: rank
  // k receives heads [k h, (k + 1) h) of every rank's positions, in position order.
  void to_heads(const T* x, T* y, int64_t heads, int64_t row) {
    exchange(x, {local_.batch, heads, g_.length(g_.rank()), row}, y, {local_.batch, heads / g_.size(),
                                                                          g_.offsets.back(), row}, false);
  }
  void to_positions(const T* y, T* x, int64_t heads, int64_t row) {
    exchange(y, {local_.batch, heads / g_.size(), g_.offsets.back(), row}, x,
             {local_.batch, heads, g_.length(g_.rank()), row}, true);
  }
  // One all-to-all between the positions layout `pos` and the heads layout `hd`
  // (inverse: from heads to positions).
  void exchange(const T* src, Shape<4> src_shape, T* dst, Shape<4> dst_shape, bool inverse) {
    const int n = g_.size();
    std::vector<StridedBlock> send(n), recv(n);
    for (int k = 0; k < n; ++k) {
      // in the positions layout: heads range of rank k; in the heads layout: rank k's positions
      const Shape<4>& pos = inverse ? dst_shape : src_shape;
      const Shape<4>& hd = inverse ? src_shape : dst_shape;
      const StridedBlock by_heads = range_block(pos, 1, k * hd[1], hd[1]);
      const StridedBlock by_positions = range_block(hd, 2, g_.offsets[k], g_.length(k));
      send[k] = inverse ? by_positions : by_heads;
      recv[k] = inverse ? by_heads : by_positions;
    }
    int64_t moved = 0;
    for (int k = 0; k < n; ++k) moved += send[k].numel();
    CommCounter::record(StepKind::AllToAll, mesh_dim_, static_cast<std::size_t>(moved) * sizeof(T));
    g_.comm->all_to_all(src, send, dst, recv, dtype_of<T>());
  }

  // On the group's device (its communicator's: the host or a GPU).
  Tensor<T, 1> buffer(int64_t n) const { return Tensor<T, 1>::uninitialized({n}, g_.comm->device()); }

  AttentionRing g_;
  int mesh_dim_;
  compute::AttentionDims local_{}, heads_{};
  Tensor<T, 1> q_{}, k_{}, v_{}, o_{}, lse_{};  // head-split, whole sequence
};

}  // namespace dtensor
