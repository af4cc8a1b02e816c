#pragma once
// Typed collectives on contiguous spans, over any Comm: the forms users call
// directly (the DTensor machinery calls the StridedBlock forms of Comm).
#include <cstdint>
#include <span>
#include <type_traits>

#include "dtensor/comm/comm.hpp"
#include "dtensor/util/error.hpp"
#include "dtensor/util/small_vector.hpp"

namespace dtensor {

namespace detail {
using BlockList = SmallVector<StridedBlock, 16>;

// Consecutive contiguous blocks of the given element counts, one per rank.
inline BlockList packed_blocks(const Comm& comm, std::span<const int64_t> counts, int64_t total,
                               const char* op) {
  DTENSOR_CHECK(static_cast<int>(counts.size()) == comm.size(), InvalidArgument, op, ": ",
                counts.size(), " counts given for a communicator of ", comm.size(), " ranks");
  BlockList b(counts.size());
  int64_t off = 0;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    DTENSOR_CHECK(counts[k] >= 0, InvalidArgument, op, ": negative count ", counts[k], " for rank ", k);
    b[k] = StridedBlock::contiguous(off, counts[k]);
    off += counts[k];
  }
  DTENSOR_CHECK(off <= total, InvalidArgument, op, ": counts add up to ", off,
                " elements but the buffer holds ", total);
  return b;
}

inline BlockList even_blocks(const Comm& comm, int64_t per_rank) {
  BlockList b(comm.size());
  for (int k = 0; k < comm.size(); ++k) b[k] = StridedBlock::contiguous(k * per_rank, per_rank);
  return b;
}

inline void check_root(const Comm& comm, int root, const char* op) {
  DTENSOR_CHECK(root >= 0 && root < comm.size(), InvalidArgument, op, ": root rank ", root,
                " is outside the communicator of ", comm.size(), " ranks");
}
}  // namespace detail

template <Element T>
void all_reduce(Comm& comm, std::span<T> buf, ReduceOp op = ReduceOp::Sum) {
  comm.all_reduce(buf.data(), buf.data(), buf.size(), dtype_of<T>(), op);
}

template <Element T>
void broadcast(Comm& comm, std::span<T> buf, int root) {
  detail::check_root(comm, root, "broadcast");
  comm.broadcast(buf.data(), buf.size(), dtype_of<T>(), root);
}

// Every rank contributes send.size() elements; recv holds size() * send.size().
template <Element T>
void all_gather(Comm& comm, std::span<const T> send, std::span<T> recv) {
  const int64_t n = static_cast<int64_t>(send.size());
  DTENSOR_CHECK(static_cast<int64_t>(recv.size()) == n * comm.size(), InvalidArgument,
                "all_gather: recv holds ", recv.size(), " elements, expected ", n * comm.size());
  comm.all_gather(send.data(), StridedBlock::contiguous(0, n), recv.data(), detail::even_blocks(comm, n),
                  dtype_of<T>());
}

// Rank k contributes counts[k] elements, concatenated in rank order in recv.
template <Element T>
void all_gatherv(Comm& comm, std::span<const T> send, std::span<T> recv, std::span<const int64_t> counts) {
  auto blocks = detail::packed_blocks(comm, counts, static_cast<int64_t>(recv.size()), "all_gatherv");
  DTENSOR_CHECK(static_cast<int64_t>(send.size()) == counts[comm.rank()], InvalidArgument,
                "all_gatherv: rank ", comm.rank(), " sends ", send.size(), " elements but counts say ",
                counts[comm.rank()]);
  comm.all_gather(send.data(), StridedBlock::contiguous(0, static_cast<int64_t>(send.size())), recv.data(),
                  blocks, dtype_of<T>());
}

// send holds size() equal pieces; this rank receives the reduction of piece rank().
template <Element T>
void reduce_scatter(Comm& comm, std::span<const T> send, std::span<T> recv, ReduceOp op = ReduceOp::Sum) {
  const int64_t n = static_cast<int64_t>(recv.size());
  DTENSOR_CHECK(static_cast<int64_t>(send.size()) == n * comm.size(), InvalidArgument,
                "reduce_scatter: send holds ", send.size(), " elements, expected ", n * comm.size());
  comm.reduce_scatter(send.data(), detail::even_blocks(comm, n), recv.data(), StridedBlock::contiguous(0, n),
                      dtype_of<T>(), op);
}

// Uneven form: piece k has counts[k] elements.
template <Element T>
void reduce_scatterv(Comm& comm, std::span<const T> send, std::span<T> recv,
                     std::span<const int64_t> counts, ReduceOp op = ReduceOp::Sum) {
  auto blocks = detail::packed_blocks(comm, counts, static_cast<int64_t>(send.size()), "reduce_scatterv");
  DTENSOR_CHECK(static_cast<int64_t>(recv.size()) == counts[comm.rank()], InvalidArgument,
                "reduce_scatterv: rank ", comm.rank(), " receives into ", recv.size(),
                " elements but counts say ", counts[comm.rank()]);
  comm.reduce_scatter(send.data(), blocks, recv.data(), StridedBlock::contiguous(0, counts[comm.rank()]),
                      dtype_of<T>(), op);
}

// Even all-to-all: send and recv hold size() pieces of equal length.
template <Element T>
void all_to_all(Comm& comm, std::span<const T> send, std::span<T> recv) {
  DTENSOR_CHECK(send.size() == recv.size() && send.size() % comm.size() == 0, InvalidArgument,
                "all_to_all: send (", send.size(), ") and recv (", recv.size(),
                ") must be equal multiples of the communicator size ", comm.size());
  const int64_t n = static_cast<int64_t>(send.size()) / comm.size();
  auto b = detail::even_blocks(comm, n);
  comm.all_to_all(send.data(), b, recv.data(), b, dtype_of<T>());
}

// send_counts[k] elements go to rank k; recv_counts[k] come from rank k.
template <Element T>
void all_to_allv(Comm& comm, std::span<const T> send, std::span<const int64_t> send_counts,
                 std::span<T> recv, std::span<const int64_t> recv_counts) {
  auto sb = detail::packed_blocks(comm, send_counts, static_cast<int64_t>(send.size()), "all_to_allv");
  auto rb = detail::packed_blocks(comm, recv_counts, static_cast<int64_t>(recv.size()), "all_to_allv");
  comm.all_to_all(send.data(), sb, recv.data(), rb, dtype_of<T>());
}

// Root sends counts[k] consecutive elements of send to rank k.
template <Element T>
void scatterv(Comm& comm, std::span<const T> send, std::span<const int64_t> counts, std::span<T> recv, int root) {
  detail::check_root(comm, root, "scatterv");
  auto blocks = detail::packed_blocks(comm, counts,
                                      comm.rank() == root ? static_cast<int64_t>(send.size()) : INT64_MAX,
                                      "scatterv");
  comm.scatter(send.data(), blocks, recv.data(), StridedBlock::contiguous(0, static_cast<int64_t>(recv.size())),
               dtype_of<T>(), root);
}

// Rank k's send lands at its offset in root's recv (counts[k] elements each).
template <Element T>
void gatherv(Comm& comm, std::span<const T> send, std::span<T> recv, std::span<const int64_t> counts, int root) {
  detail::check_root(comm, root, "gatherv");
  auto blocks = detail::packed_blocks(comm, counts,
                                      comm.rank() == root ? static_cast<int64_t>(recv.size()) : INT64_MAX,
                                      "gatherv");
  comm.gather(send.data(), StridedBlock::contiguous(0, static_cast<int64_t>(send.size())), recv.data(), blocks,
              dtype_of<T>(), root);
}

template <Element T>
void send(Comm& comm, std::span<const T> buf, int dst, int tag = 0) {
  comm.send(buf.data(), buf.size(), dtype_of<T>(), dst, tag);
}
template <Element T>
void recv(Comm& comm, std::span<T> buf, int src, int tag = 0) {
  comm.recv(buf.data(), buf.size(), dtype_of<T>(), src, tag);
}

}  // namespace dtensor
