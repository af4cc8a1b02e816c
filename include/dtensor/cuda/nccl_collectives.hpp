#pragma once
// NcclComm's collectives (cuda/nccl_comm.hpp gathers its parts; docs/ARCHITECTURE.md,
// "The NCCL runtime", says how each maps to NCCL): barrier, all_reduce (blocking and
// not), broadcast, all_gather, reduce_scatter, all_to_all, scatter and gather, with the
// grouped sends and receives of blocks that the uneven ones fall back to.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <vector>

#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/kernels.hpp"
#include "dtensor/cuda/nccl_comm_class.hpp"
#include "dtensor/cuda/nccl_resources.hpp"
#include "dtensor/cuda/nccl_types.hpp"
#include "dtensor/cuda/stream.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

inline void NcclComm::barrier() {
  collective(Kind::Barrier, {}, {}, {}, [&] {
    // A max of zeros stays zero, however many barriers run.
    nccl(ncclAllReduce(scratch_.get(), scratch_.get(), 1, ncclUint8, ncclMax, comm(), stream_),
         "ncclAllReduce (barrier)");
  });
}

inline void NcclComm::all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) {
  // Before anything is queued (a throw inside the collective aborts the communicator):
  // NCCL would take the Max of a complex number's parts one by one.
  ::dtensor::detail::check_orderable(t, op, "NcclComm::all_reduce");
  collective(Kind::AllReduce, {t, op, 0, static_cast<int64_t>(count)}, {}, {}, [&] {
    if (count == 0) return;
    if (is_float16(t)) return all_reduce_through_float(send, recv, count, t, op);
    nccl(ncclAllReduce(send, recv, cuda::detail::nccl_count(t, count), cuda::detail::nccl_type(t),
                       cuda::detail::nccl_op(op, t), comm(), stream_),
         "ncclAllReduce");
    if (cuda::detail::divide_after(op, t))
      cuda::kernels::divide_block(t, recv, StridedBlock::contiguous(0, static_cast<int64_t>(count)), size_, stream_);
  });
}

inline Request NcclComm::start_all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) {
  ::dtensor::detail::check_orderable(t, op, "NcclComm::start_all_reduce");
  enter(Kind::AllReduce);
  cuda::DeviceGuard guard(device_);
  if (guarded_) check_signature({t, op, 0, static_cast<int64_t>(count)}, {}, {});
  auto st = std::make_shared<ExchangeState>();
  st->dtype = t;
  st->posted = Clock::now();
  st->what = detail::cat(what_, " (non-blocking)");
  try {
    follow_caller_stream();
    st->event = events_.take();
    if (count > 0 && is_float16(t)) {
      all_reduce_through_float(send, recv, count, t, op);  // its staging freed in the stream's order
    } else if (count > 0) {
      nccl(ncclAllReduce(send, recv, cuda::detail::nccl_count(t, count), cuda::detail::nccl_type(t),
                         cuda::detail::nccl_op(op, t), comm(), stream_),
           "ncclAllReduce");
      if (cuda::detail::divide_after(op, t))
        cuda::kernels::divide_block(t, recv, StridedBlock::contiguous(0, static_cast<int64_t>(count)), size_, stream_);
    }
    DTENSOR_CUDA(cudaEventRecord(st->event, stream_));
    st->status = ExchangeState::Status::Issued;
  } catch (const std::exception& e) {  // the peers may be in it: they must not wait for this rank
    fail_exchange(*st);
    events_.give(st->event);
    abort_comm(e.what());
    throw;
  }
  return Request(std::make_unique<Exchange>(link_, std::move(st)));
}

inline void NcclComm::do_broadcast(void* buf, std::size_t count, DType t, int root) {
  collective(Kind::Broadcast, {t, ReduceOp::Sum, root, static_cast<int64_t>(count)}, {}, {}, [&] {
    if (count == 0) return;
    nccl(ncclBroadcast(buf, buf, cuda::detail::nccl_count(t, count), cuda::detail::nccl_type(t), root, comm(), stream_),
         "ncclBroadcast");
  });
}

inline void NcclComm::do_all_gather(const void* send, StridedBlock send_block, void* recv,
                                    std::span<const StridedBlock> recv_blocks, DType t) {
  collective(Kind::AllGather, {t, ReduceOp::Sum, 0, send_block.numel()}, recv_blocks, {}, [&] {
    const std::size_t elem = size_of(t);
    const int64_t n = send_block.numel();
    check_own_size(n, recv_blocks[rank_].numel(), "its send_block", "recv_blocks[rank] (its own piece of the result)");
    using cuda::detail::Staging;
    if (cuda::detail::same_size(recv_blocks)) {
      // Every rank sends n elements: NCCL's all-gather, into `recv` itself when the
      // pieces lie back to back.
      if (n == 0) return;
      Staging st(stream_);
      const std::size_t in_at = cuda::detail::dense(send_block) ? Staging::kNone : st.reserve(n, elem);
      const bool direct = cuda::detail::back_to_back(recv_blocks);
      const std::size_t out_at = direct ? Staging::kNone : st.reserve(n * size_, elem);
      st.allocate();
      const void* in = cuda::detail::at(send, send_block.offset, elem);
      if (in_at != Staging::kNone) {
        cuda::kernels::copy_block(send, send_block, st.at(in_at), StridedBlock::contiguous(0, n), elem, stream_);
        in = st.at(in_at);
      }
      void* out = direct ? cuda::detail::at(recv, recv_blocks[0].offset, elem) : st.at(out_at);
      nccl(ncclAllGather(in, out, cuda::detail::nccl_count(t, n), cuda::detail::nccl_type(t), comm(), stream_),
           "ncclAllGather");
      if (!direct)
        for (int k = 0; k < size_; ++k)
          cuda::kernels::copy_block(out, StridedBlock::contiguous(k * n, n), recv, recv_blocks[k], elem, stream_);
      return;
    }
    if (const int64_t m = cuda::detail::padded_piece(recv_blocks); m > 0) {
      // Uneven pieces padded to m elements: one ncclAllGather of m per rank into
      // staging (a piece's tail past its size is never read), then each piece into
      // its place.
      Staging st(stream_);
      const std::size_t in_at = st.reserve(m, elem), out_at = st.reserve(m * size_, elem);
      st.allocate();
      if (n > 0)
        cuda::kernels::copy_block(send, send_block, st.at(in_at), StridedBlock::contiguous(0, n), elem, stream_);
      nccl(ncclAllGather(st.at(in_at), st.at(out_at), cuda::detail::nccl_count(t, m), cuda::detail::nccl_type(t),
                         comm(), stream_),
           "ncclAllGather (padded)");
      for (int k = 0; k < size_; ++k)
        if (recv_blocks[k].numel() > 0)
          cuda::kernels::copy_block(st.at(out_at), StridedBlock::contiguous(k * m, recv_blocks[k].numel()), recv,
                                    recv_blocks[k], elem, stream_);
      return;
    }
    // Pieces too uneven to pad: this rank's piece (packed once) to every peer, each
    // peer's piece into its place.
    Staging st(stream_);
    const std::size_t in_at = cuda::detail::dense(send_block) ? Staging::kNone : st.reserve(n, elem);
    st.allocate();
    const void* in = send;
    StridedBlock in_block = send_block;
    if (in_at != Staging::kNone) {
      cuda::kernels::copy_block(send, send_block, st.at(in_at), StridedBlock::contiguous(0, n), elem, stream_);
      in = st.at(in_at), in_block = StridedBlock::contiguous(0, n);
    }
    std::vector<Outgoing> outs;
    std::vector<Incoming> ins;
    for (int k = 0; k < size_; ++k)
      if (k != rank_) outs.push_back({k, in, in_block}), ins.push_back({k, recv, recv_blocks[k]});
    exchange(outs, ins, t);
    copy_own(send, send_block, recv, recv_blocks[rank_], elem);
  });
}

inline void NcclComm::all_reduce_through_float(const void* send, void* recv, std::size_t count, DType t,
                                               ReduceOp op) {
  const auto n = static_cast<int64_t>(count);
  const StridedBlock all = StridedBlock::contiguous(0, n);
  cuda::detail::Staging st(stream_);
  const std::size_t at = st.reserve(n, sizeof(float));
  st.allocate();
  void* wide = st.at(at);
  cuda::kernels::convert_block(t, send, all, DType::Float32, wide, all, stream_);
  // An Avg as the sum divided once (the in-process and MPI runtimes' rule), not NCCL's
  // own average, which scales each term first.
  const ReduceOp float_op = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  nccl(ncclAllReduce(wide, wide, count, ncclFloat32, cuda::detail::nccl_op(float_op, DType::Float32), comm(), stream_),
       "ncclAllReduce (float staging)");
  if (op == ReduceOp::Avg) cuda::kernels::divide_block(DType::Float32, wide, all, size_, stream_);
  cuda::kernels::convert_block(DType::Float32, wide, all, t, recv, all, stream_);
}

inline void NcclComm::do_reduce_scatter(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                                        StridedBlock recv_block, DType t, ReduceOp op) {
  ::dtensor::detail::check_orderable(t, op, "NcclComm::reduce_scatter");
  collective(Kind::ReduceScatter, {t, op, 0, recv_block.numel()}, send_blocks, {},
             [&] { reduce_scatter_queued(send, send_blocks, recv, recv_block, t, op); });
}

inline void NcclComm::reduce_scatter_queued(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                                            StridedBlock recv_block, DType t, ReduceOp op) {
  const std::size_t elem = size_of(t);
  const int64_t n = recv_block.numel();
  check_own_size(send_blocks[rank_].numel(), n, "send_blocks[rank] (its own contribution to its piece)",
                 "its recv_block");
  if (is_float16(t)) {
    // Through float (all_reduce_through_float says why): every piece widened into one
    // staging buffer, back to back, the float reduce-scatter on it, the result rounded
    // once into recv_block.
    cuda::detail::Staging wide(stream_);
    int64_t total = 0;
    for (const StridedBlock& b : send_blocks) total += b.numel();
    const std::size_t in_at = wide.reserve(total, sizeof(float)), out_at = wide.reserve(n, sizeof(float));
    wide.allocate();
    std::vector<StridedBlock> pieces;
    int64_t offset = 0;
    for (const StridedBlock& b : send_blocks) {
      pieces.push_back(StridedBlock::contiguous(offset, b.numel()));
      if (b.numel() > 0) cuda::kernels::convert_block(t, send, b, DType::Float32, wide.at(in_at), pieces.back(),
                                                       stream_);
      offset += b.numel();
    }
    const StridedBlock out = StridedBlock::contiguous(0, n);
    // An Avg as the sum divided once (all_reduce_through_float says why).
    reduce_scatter_queued(wide.at(in_at), pieces, wide.at(out_at), out, DType::Float32,
                          op == ReduceOp::Avg ? ReduceOp::Sum : op);
    if (op == ReduceOp::Avg) cuda::kernels::divide_block(DType::Float32, wide.at(out_at), out, size_, stream_);
    if (n > 0) cuda::kernels::convert_block(DType::Float32, wide.at(out_at), out, t, recv, recv_block, stream_);
    return;
  }
  const ncclDataType_t type = cuda::detail::nccl_type(t);
  const ncclRedOp_t rop = cuda::detail::nccl_op(op, t);
  using cuda::detail::Staging;
  Staging st(stream_);
  if (cuda::detail::same_size(send_blocks)) {
    // Every piece holds n elements: NCCL's reduce-scatter, on the caller's
    // buffers when the pieces lie back to back and the output is contiguous.
    if (n == 0) return;
    const bool direct_in = cuda::detail::back_to_back(send_blocks);
    const std::size_t in_at = direct_in ? Staging::kNone : st.reserve(n * size_, elem);
    const std::size_t out_at = cuda::detail::dense(recv_block) ? Staging::kNone : st.reserve(n, elem);
    st.allocate();
    const void* in = cuda::detail::at(send, send_blocks[0].offset, elem);
    if (!direct_in) {
      for (int k = 0; k < size_; ++k)
        cuda::kernels::copy_block(send, send_blocks[k], st.at(in_at), StridedBlock::contiguous(k * n, n), elem,
                                  stream_);
      in = st.at(in_at);
    }
    void* out = out_at == Staging::kNone ? cuda::detail::at(recv, recv_block.offset, elem) : st.at(out_at);
    nccl(ncclReduceScatter(in, out, cuda::detail::nccl_count(t, n), type, rop, comm(), stream_), "ncclReduceScatter");
    if (out_at != Staging::kNone)
      cuda::kernels::copy_block(out, StridedBlock::contiguous(0, n), recv, recv_block, elem, stream_);
  } else if (const int64_t m = cuda::detail::padded_piece(send_blocks); m > 0) {
    // Uneven pieces padded to m elements: piece k packed at k m of staging (its
    // tail is reduced but never read), one ncclReduceScatter of m per rank, this
    // rank's n elements out.
    const std::size_t in_at = st.reserve(m * size_, elem), out_at = st.reserve(m, elem);
    st.allocate();
    for (int k = 0; k < size_; ++k)
      if (send_blocks[k].numel() > 0)
        cuda::kernels::copy_block(send, send_blocks[k], st.at(in_at),
                                  StridedBlock::contiguous(k * m, send_blocks[k].numel()), elem, stream_);
    nccl(ncclReduceScatter(st.at(in_at), st.at(out_at), cuda::detail::nccl_count(t, m), type, rop, comm(), stream_),
         "ncclReduceScatter (padded)");
    if (n > 0)
      cuda::kernels::copy_block(st.at(out_at), StridedBlock::contiguous(0, n), recv, recv_block, elem, stream_);
  } else {
    // Pieces too uneven to pad: one reduce per rank, rooted at the rank whose
    // piece it is, all in one group so that they run together.
    std::vector<std::size_t> in_at(static_cast<std::size_t>(size_), Staging::kNone);
    for (int k = 0; k < size_; ++k)
      if (!cuda::detail::dense(send_blocks[k])) in_at[k] = st.reserve(send_blocks[k].numel(), elem);
    const std::size_t out_at = cuda::detail::dense(recv_block) ? Staging::kNone : st.reserve(n, elem);
    st.allocate();
    for (int k = 0; k < size_; ++k)
      if (in_at[k] != Staging::kNone)
        cuda::kernels::copy_block(send, send_blocks[k], st.at(in_at[k]),
                                  StridedBlock::contiguous(0, send_blocks[k].numel()), elem, stream_);
    void* out = out_at == Staging::kNone ? cuda::detail::at(recv, recv_block.offset, elem) : st.at(out_at);
    {
      cuda::detail::GroupCall group;
      nccl(group.started(), "ncclGroupStart");
      for (int k = 0; k < size_; ++k) {
        const int64_t c = send_blocks[k].numel();
        if (c == 0) continue;  // every rank skips it: they agree on the sizes
        const void* in = in_at[k] == Staging::kNone ? cuda::detail::at(send, send_blocks[k].offset, elem)
                                                     : static_cast<const void*>(st.at(in_at[k]));
        nccl(ncclReduce(in, k == rank_ ? out : nullptr, cuda::detail::nccl_count(t, c), type, rop, k, comm(),
                        stream_),
             "ncclReduce");
      }
      nccl(group.end(), "ncclGroupEnd");
    }
    if (out_at != Staging::kNone)
      cuda::kernels::copy_block(out, StridedBlock::contiguous(0, n), recv, recv_block, elem, stream_);
  }
  if (cuda::detail::divide_after(op, t)) cuda::kernels::divide_block(t, recv, recv_block, size_, stream_);
}

inline void NcclComm::do_all_to_all(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                                    std::span<const StridedBlock> recv_blocks, DType t) {
  collective(Kind::AllToAll, {t, ReduceOp::Sum, 0, 0}, send_blocks, recv_blocks, [&] {
    check_own_size(send_blocks[rank_].numel(), recv_blocks[rank_].numel(), "send_blocks[rank] (to itself)",
                   "recv_blocks[rank]");
    std::vector<Outgoing> outs;
    std::vector<Incoming> ins;
    for (int k = 0; k < size_; ++k)
      if (k != rank_) outs.push_back({k, send, send_blocks[k]}), ins.push_back({k, recv, recv_blocks[k]});
    exchange(outs, ins, t);
    copy_own(send, send_blocks[rank_], recv, recv_blocks[rank_], size_of(t));
  });
}

inline void NcclComm::do_scatter(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                                 StridedBlock recv_block, DType t, int root) {
  const bool is_root = rank_ == root;
  const std::span<const StridedBlock> sizes = is_root ? send_blocks : std::span<const StridedBlock>{};
  collective(Kind::Scatter, {t, ReduceOp::Sum, root, recv_block.numel()}, sizes, {}, [&] {
    std::vector<Outgoing> outs;
    std::vector<Incoming> ins;
    if (is_root) {
      check_own_size(send_blocks[root].numel(), recv_block.numel(), "send_blocks[root]", "the root's recv_block");
      for (int k = 0; k < size_; ++k)
        if (k != root) outs.push_back({k, send, send_blocks[k]});
    } else {
      ins.push_back({root, recv, recv_block});
    }
    exchange(outs, ins, t);
    if (is_root) copy_own(send, send_blocks[root], recv, recv_block, size_of(t));
  });
}

inline void NcclComm::do_gather(const void* send, StridedBlock send_block, void* recv,
                                std::span<const StridedBlock> recv_blocks, DType t, int root) {
  const bool is_root = rank_ == root;
  const std::span<const StridedBlock> sizes = is_root ? recv_blocks : std::span<const StridedBlock>{};
  collective(Kind::Gather, {t, ReduceOp::Sum, root, send_block.numel()}, sizes, {}, [&] {
    std::vector<Outgoing> outs;
    std::vector<Incoming> ins;
    if (is_root) {
      check_own_size(send_block.numel(), recv_blocks[root].numel(), "the root's send_block", "recv_blocks[root]");
      for (int k = 0; k < size_; ++k)
        if (k != root) ins.push_back({k, recv, recv_blocks[k]});
    } else {
      outs.push_back({root, send, send_block});
    }
    exchange(outs, ins, t);
    if (is_root) copy_own(send, send_block, recv, recv_blocks[root], size_of(t));
  });
}

// Grouped sends and receives; strided blocks are packed into, or received into,
// staging memory. Empty blocks are skipped (both sides agree on the sizes).
inline void NcclComm::exchange(std::span<const Outgoing> outs, std::span<const Incoming> ins, DType t) {
  using cuda::detail::Staging;
  const std::size_t elem = size_of(t);
  const ncclDataType_t type = cuda::detail::nccl_type(t);
  Staging st(stream_);
  std::vector<std::size_t> out_at(outs.size(), Staging::kNone), in_at(ins.size(), Staging::kNone);
  for (std::size_t i = 0; i < outs.size(); ++i)
    if (!cuda::detail::dense(outs[i].block)) out_at[i] = st.reserve(outs[i].block.numel(), elem);
  for (std::size_t i = 0; i < ins.size(); ++i)
    if (!cuda::detail::dense(ins[i].block)) in_at[i] = st.reserve(ins[i].block.numel(), elem);
  st.allocate();
  for (std::size_t i = 0; i < outs.size(); ++i)
    if (out_at[i] != Staging::kNone)
      cuda::kernels::copy_block(outs[i].base, outs[i].block, st.at(out_at[i]),
                                StridedBlock::contiguous(0, outs[i].block.numel()), elem, stream_);
  {
    cuda::detail::GroupCall group;
    nccl(group.started(), "ncclGroupStart");
    for (std::size_t i = 0; i < outs.size(); ++i) {
      const int64_t c = outs[i].block.numel();
      if (c == 0) continue;
      const void* p = out_at[i] == Staging::kNone ? cuda::detail::at(outs[i].base, outs[i].block.offset, elem)
                                                  : static_cast<const void*>(st.at(out_at[i]));
      nccl(ncclSend(p, cuda::detail::nccl_count(t, c), type, outs[i].peer, comm(), stream_), "ncclSend");
    }
    for (std::size_t i = 0; i < ins.size(); ++i) {
      const int64_t c = ins[i].block.numel();
      if (c == 0) continue;
      void* p = in_at[i] == Staging::kNone ? cuda::detail::at(ins[i].base, ins[i].block.offset, elem)
                                           : static_cast<void*>(st.at(in_at[i]));
      nccl(ncclRecv(p, cuda::detail::nccl_count(t, c), type, ins[i].peer, comm(), stream_), "ncclRecv");
    }
    nccl(group.end(), "ncclGroupEnd");
  }
  for (std::size_t i = 0; i < ins.size(); ++i)
    if (in_at[i] != Staging::kNone)
      cuda::kernels::copy_block(st.at(in_at[i]), StridedBlock::contiguous(0, ins[i].block.numel()), ins[i].base,
                                ins[i].block, elem, stream_);
}

// This rank's own piece: a local copy (nothing when it is already in place).
inline void NcclComm::copy_own(const void* src, const StridedBlock& sb, void* dst, const StridedBlock& db,
                               std::size_t elem) {
  if (src == dst && sb == db) return;
  cuda::kernels::copy_block(src, sb, dst, db, elem, stream_);
}

// Only this rank's own blocks are compared here: with guarded mode off, nothing
// tells it what its peers hold.
inline void NcclComm::check_own_size(int64_t from, int64_t to, const char* from_name, const char* to_name) {
  if (from == to) return;
  fail_local(detail::cat("dtensor: rank ", rank_, ": ", what_, ": ", from_name, " holds ", from, " elements but ",
                         to_name, " holds ", to, "; the ranks disagree on the sizes (DTENSOR_CHECK_COLLECTIVES=1 "
                         "makes every rank report such errors without aborting)"));
}

}  // namespace dtensor
