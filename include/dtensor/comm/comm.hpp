#pragma once
// Comm: the one interface every communication runtime implements (in-process
// threads, MPI, NCCL). It is type-erased over the element type (DType) and takes
// Blocks, so a collective reads and writes tensors in place. One virtual call per
// collective, never per element.
//
// The collectives that take peers, roots or messages are public non-virtual
// functions that check their arguments here, once for every runtime, and then call
// the runtime's protected do_* (no runtime can drift from the rules).
//
// Contract, for every runtime:
//  * all ranks of a communicator call the same collectives in the same order, with
//    the same root, reduction and element type;
//  * an error on any rank (bad sizes, a peer that failed, a timeout) ends the
//    collective with an exception on every rank instead of a hang;
//  * `send` may equal `recv` where noted (in-place);
//  * every buffer lives where device() says: host memory, or memory of that GPU
//    (host values such as shapes go through comm/host_values.hpp).
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtensor/core/block.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/core/reduce_op.hpp"
#include "dtensor/comm/request.hpp"
#include "dtensor/comm/segments.hpp"
#include "dtensor/tensor/device.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor {

class Comm {
 public:
  DTENSOR_RUNTIME_KEY_FUNCTION(Comm)  // util/compiled_runtime.hpp
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "threads", "mpi", "nccl"
  // Where the buffers of this communicator's calls live.
  virtual Device device() const { return Device::host(); }

  virtual void barrier() = 0;

  // recv[i] = reduction over ranks of send[i]; send may equal recv.
  virtual void all_reduce(const void* send, void* recv, std::size_t count, DType, ReduceOp) = 0;

  // Non-blocking all_reduce: posts it and returns at once; the Request completes it
  // (recv holds the result once wait() returns or test() returns true). Between the
  // two the caller must not touch `send` nor `recv`. Same contract as the blocking
  // one: every rank posts the same collectives (blocking and non-blocking) in the
  // same order, with the same count, type and reduction; results are bitwise equal
  // to all_reduce's. Several may be in flight at once and complete in any order.
  // Failure: a peer that fails, never posts, or drops its Request before it
  // completed ends every wait (and test) with an exception, never a hang; a Request
  // dropped before completion is safe (the runtime keeps the buffers out of use
  // once the destructor returns).
  // A runtime without non-blocking collectives completes it at once (the default).
  virtual Request start_all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) {
    all_reduce(send, recv, count, t, op);
    return Request();
  }
  // The same, in place over `segments` as if they were one buffer (their
  // concatenation; comm/segments.hpp): a bucket of gradients without packing it. The
  // ranks give the same total count; they may cut it into segments differently,
  // unless `cuts` is Same (then a runtime may reduce segment by segment). A runtime
  // that cannot address them in place packs them into a buffer the Request owns
  // (the default).
  virtual Request start_all_reduce(std::span<const Segment> segments, DType t, ReduceOp op,
                                   SegmentCuts cuts = SegmentCuts::MayDiffer) {
    (void)cuts;  // one buffer: any cut
    if (segments.size() == 1) return start_all_reduce(segments[0].data, segments[0].data, segments[0].count, t, op);
    auto packed = std::make_unique<detail::PackedAllReduce>(segments, t, device());
    packed->start(start_all_reduce(packed->flat(), packed->flat(), total_count(segments), t, op));
    return Request(std::move(packed));
  }

  void broadcast(void* buf, std::size_t count, DType t, int root) {
    check_root(root, "broadcast");
    do_broadcast(buf, count, t, root);
  }

  // Rank k's `send_block` of `send` lands in `recv_blocks[k]` of `recv` on every rank.
  // recv_blocks must be the same on every rank (they describe the gathered result).
  void all_gather(const void* send, StridedBlock send_block, void* recv, std::span<const StridedBlock> recv_blocks,
                  DType t) {
    check_peers(recv_blocks, "all_gather");
    do_all_gather(send, send_block, recv, recv_blocks, t);
  }

  // Non-blocking all_gather: posts it and returns at once; the Request completes it
  // (recv_blocks[k] of `recv` holds rank k's block once wait() returns or test()
  // returns true). Between the two the caller must not write `send` nor touch `recv`.
  // Made of point-to-point messages (one start_exchange: this rank's block to every
  // rank, itself included, tag kAllGatherTag), so every runtime has it with the
  // exchange's rules: sizes that disagree fail both sides, and a peer that fails or
  // never posts ends every wait with an exception, never a hang. Messages of one tag
  // match in posting order, so several may be in flight at once provided every rank
  // starts them in the same order; a program's own exchanges must not use the tag.
  // (nn::FullyShard prefetches the next layer's parameters with it.)
  static constexpr int kAllGatherTag = (1 << 13) - 8;  // below realign's and the halo exchanges' tags
  virtual Request start_all_gather(const void* send, StridedBlock send_block, void* recv,
                                   std::span<const StridedBlock> recv_blocks, DType t) {
    check_peers(recv_blocks, "all_gather (non-blocking)");
    std::vector<SendSpec> sends;
    std::vector<RecvSpec> recvs;
    sends.reserve(static_cast<std::size_t>(size()));
    recvs.reserve(static_cast<std::size_t>(size()));
    const Region mine = Region::of(send_block).simplified();
    for (int k = 0; k < size(); ++k) {
      sends.push_back({k, kAllGatherTag, send, mine});
      const Region theirs = Region::of(recv_blocks[static_cast<std::size_t>(k)]).simplified();
      recvs.push_back({k, kAllGatherTag, recv, theirs, false});
    }
    return start_exchange(sends, recvs, t);
  }

  // This rank's `recv_block` of `recv` = reduction over ranks k of `send_blocks[rank()]` of k's `send`.
  void reduce_scatter(const void* send, std::span<const StridedBlock> send_blocks, void* recv, StridedBlock recv_block,
                      DType t, ReduceOp op) {
    check_peers(send_blocks, "reduce_scatter");
    do_reduce_scatter(send, send_blocks, recv, recv_block, t, op);
  }

  // `send_blocks[k]` of this rank's `send` lands in `recv_blocks[rank()]` of rank k's `recv`.
  void all_to_all(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                  std::span<const StridedBlock> recv_blocks, DType t) {
    check_peers(send_blocks, "all_to_all");
    check_peers(recv_blocks, "all_to_all");
    do_all_to_all(send, send_blocks, recv, recv_blocks, t);
  }

  // From root: `send_blocks[k]` (read on root only) lands in rank k's `recv_block`.
  void scatter(const void* send, std::span<const StridedBlock> send_blocks, void* recv, StridedBlock recv_block,
               DType t, int root) {
    check_root(root, "scatter");
    if (rank() == root) check_peers(send_blocks, "scatter");
    do_scatter(send, send_blocks, recv, recv_block, t, root);
  }

  // To root: rank k's `send_block` lands in `recv_blocks[k]` (written on root only).
  void gather(const void* send, StridedBlock send_block, void* recv, std::span<const StridedBlock> recv_blocks, DType t,
              int root) {
    check_root(root, "gather");
    if (rank() == root) check_peers(recv_blocks, "gather");
    do_gather(send, send_block, recv, recv_blocks, t, root);
  }

  // Point to point (comm/request.hpp has the matching and failure rules).
  //
  // Posts every send and receive of `sends` and `recvs` and returns at once; the
  // Request completes them. All messages of one exchange have the element type `t`.
  // A runtime moves regions in place where it can (MPI derived datatypes, direct
  // copies between in-process ranks) and packs them where it must (NCCL).
  Request start_exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs, DType t) {
    for (const SendSpec& m : sends) check_message(m.peer, m.tag, m.region, "start_exchange (send)");
    for (const RecvSpec& m : recvs) check_message(m.peer, m.tag, m.region, "start_exchange (recv)");
    return do_start_exchange(sends, recvs, t);
  }

  Request isend(const void* buf, const Region& region, DType t, int dst, int tag = 0) {
    const SendSpec s{dst, tag, buf, region};
    return start_exchange({&s, 1}, {}, t);
  }
  Request irecv(void* buf, const Region& region, DType t, int src, int tag = 0) {
    const RecvSpec r{src, tag, buf, region, false};
    return start_exchange({}, {&r, 1}, t);
  }
  // Sends to `dst` and receives from `src` at once: a shift along a ring never
  // deadlocks, whatever the order in which the ranks arrive.
  void sendrecv(const void* send_buf, const Region& send_region, int dst, void* recv_buf, const Region& recv_region,
                int src, DType t, int tag = 0) {
    const SendSpec s{dst, tag, send_buf, send_region};
    const RecvSpec r{src, tag, recv_buf, recv_region, false};
    start_exchange({&s, 1}, {&r, 1}, t).wait();
  }

  // Blocking: `send` returns once `buf` may be reused (for the in-process runtime,
  // when the receiver has taken the message), `recv` once the message has arrived.
  void send(const void* buf, std::size_t count, DType t, int dst, int tag = 0) {
    check_peer(dst, "send");
    do_send(buf, count, t, dst, tag);
  }
  void recv(void* buf, std::size_t count, DType t, int src, int tag = 0) {
    check_peer(src, "recv");
    do_recv(buf, count, t, src, tag);
  }

  // Ranks with the same color form a new communicator, ordered by (key, rank).
  // A negative color takes no part and gets nullptr.
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;

 protected:
  // What a runtime implements, called with arguments already checked (the public
  // functions above say what each does).
  virtual void do_broadcast(void* buf, std::size_t count, DType t, int root) = 0;
  virtual void do_all_gather(const void* send, StridedBlock send_block, void* recv,
                             std::span<const StridedBlock> recv_blocks, DType t) = 0;
  virtual void do_reduce_scatter(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                                 StridedBlock recv_block, DType t, ReduceOp op) = 0;
  virtual void do_all_to_all(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                             std::span<const StridedBlock> recv_blocks, DType t) = 0;
  virtual void do_scatter(const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                          StridedBlock recv_block, DType t, int root) = 0;
  virtual void do_gather(const void* send, StridedBlock send_block, void* recv,
                         std::span<const StridedBlock> recv_blocks, DType t, int root) = 0;
  virtual Request do_start_exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs, DType t) = 0;
  // The blocking point to point on top of the exchange (a runtime may do better).
  virtual void do_send(const void* buf, std::size_t count, DType t, int dst, int tag) {
    isend(buf, Region::contiguous(0, static_cast<int64_t>(count)), t, dst, tag).wait();
  }
  virtual void do_recv(void* buf, std::size_t count, DType t, int src, int tag) {
    irecv(buf, Region::contiguous(0, static_cast<int64_t>(count)), t, src, tag).wait();
  }

  // The argument checks, made here once for every runtime.
  void check_peers(std::span<const StridedBlock> blocks, const char* op) const {
    DTENSOR_CHECK(static_cast<int>(blocks.size()) == size(), InvalidArgument, op, ": ", blocks.size(),
                  " blocks given for a communicator of ", size(), " ranks");
  }
  // Point-to-point peers may include this rank itself (start_exchange); the
  // blocking send and recv refuse it (a blocking send to oneself cannot complete).
  void check_exchange_peer(int peer, const char* op) const {
    DTENSOR_CHECK(peer >= 0 && peer < size(), InvalidArgument, op, ": rank ", rank(), " named peer ", peer,
                  " on a communicator of ", size(), " ranks");
  }
  // One message of an exchange: a peer of this communicator, a non-negative tag
  // (MPI's rule, kept everywhere so that a program runs the same on every runtime)
  // and a well-formed region.
  void check_message(int peer, int tag, const Region& region, const char* op) const {
    check_exchange_peer(peer, op);
    DTENSOR_CHECK(tag >= 0, InvalidArgument, op, ": rank ", rank(), " used tag ", tag, "; tags are non-negative");
    DTENSOR_CHECK(region.ndim >= 0 && region.ndim <= kMaxRegionDims, InvalidArgument, op, ": a region of ",
                  region.ndim, " dims");
    for (int d = 0; d < region.ndim; ++d)
      DTENSOR_CHECK(region.extent[d] >= 0 && region.stride[d] >= 0, InvalidArgument, op, ": ", to_string(region),
                    " has a negative extent or stride");
  }
  void check_root(int root, const char* op) const {
    DTENSOR_CHECK(root >= 0 && root < size(), InvalidArgument, op, ": root ", root,
                  " is not a rank of a communicator of ", size(), " ranks");
  }
  void check_peer(int peer, const char* op) const {
    DTENSOR_CHECK(peer >= 0 && peer < size() && peer != rank(), InvalidArgument, op, ": rank ", rank(),
                  " named peer ", peer, " on a communicator of ", size(), " ranks");
  }
};

}  // namespace dtensor
