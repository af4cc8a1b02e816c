#pragma once
// Comm: the one interface every communication runtime implements (in-process
// threads, MPI, NCCL). It is type-erased over the element type (DType) and takes
// Blocks, so a collective reads and writes tensors in place. One virtual call per
// collective, never per element.
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

#include "dtensor/comm/block.hpp"
#include "dtensor/comm/dtype.hpp"
#include "dtensor/comm/reduce_op.hpp"
#include "dtensor/tensor/device.hpp"

namespace dtensor {

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "threads", "mpi", "nccl"
  // Where the buffers of this communicator's calls live.
  virtual Device device() const { return Device::host(); }

  virtual void barrier() = 0;

  // recv[i] = reduction over ranks of send[i]; send may equal recv.
  virtual void all_reduce(const void* send, void* recv, std::size_t count, DType, ReduceOp) = 0;

  virtual void broadcast(void* buf, std::size_t count, DType, int root) = 0;

  // Rank k's `send_block` of `send` lands in `recv_blocks[k]` of `recv` on every rank.
  // recv_blocks must be the same on every rank (they describe the gathered result).
  virtual void all_gather(const void* send, Block send_block, void* recv,
                          std::span<const Block> recv_blocks, DType) = 0;

  // This rank's `recv_block` of `recv` = reduction over ranks k of `send_blocks[rank()]` of k's `send`.
  virtual void reduce_scatter(const void* send, std::span<const Block> send_blocks, void* recv,
                              Block recv_block, DType, ReduceOp) = 0;

  // `send_blocks[k]` of this rank's `send` lands in `recv_blocks[rank()]` of rank k's `recv`.
  virtual void all_to_all(const void* send, std::span<const Block> send_blocks, void* recv,
                          std::span<const Block> recv_blocks, DType) = 0;

  // From root: `send_blocks[k]` (read on root only) lands in rank k's `recv_block`.
  virtual void scatter(const void* send, std::span<const Block> send_blocks, void* recv,
                       Block recv_block, DType, int root) = 0;

  // To root: rank k's `send_block` lands in `recv_blocks[k]` (written on root only).
  virtual void gather(const void* send, Block send_block, void* recv,
                      std::span<const Block> recv_blocks, DType, int root) = 0;

  // Point to point. Messages between a pair of ranks are matched in order; the tag
  // and the count must agree with the matching call, or both sides get an error.
  virtual void send(const void* buf, std::size_t count, DType, int dst, int tag = 0) = 0;
  virtual void recv(void* buf, std::size_t count, DType, int src, int tag = 0) = 0;

  // Ranks with the same color form a new communicator, ordered by (key, rank).
  // A negative color takes no part and gets nullptr.
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;

 protected:
  // Argument checks every runtime makes before it touches a peer.
  void check_peers(std::span<const Block> blocks, const char* op) const {
    DTENSOR_CHECK(static_cast<int>(blocks.size()) == size(), InvalidArgument, op, ": ", blocks.size(),
                  " blocks given for a communicator of ", size(), " ranks");
  }
  void check_peer(int peer, const char* op) const {
    DTENSOR_CHECK(peer >= 0 && peer < size() && peer != rank(), InvalidArgument, op, ": rank ", rank(),
                  " named peer ", peer, " on a communicator of ", size(), " ranks");
  }
};

}  // namespace dtensor
