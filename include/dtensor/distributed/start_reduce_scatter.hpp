#pragma once
// start_reduce_scatter: a non-blocking reduce-scatter (sum) made of one exchange, so
// that every runtime has it (in-process, MPI, NCCL) with the exchange's failure rules.
//
// Rank r sends block send_blocks[k] of its `send` to rank k; the piece each rank sends
// this rank lands in a slot of its own in a staging buffer (not added on arrival,
// which would add in arrival order); completing the Request adds the slots into
// `recv_block` of `recv` in rank order, so the sum has the same order, and bits, on
// every run. nn::FullyShard reduce-scatters a layer's gradients with it while the next
// layer's backward runs.
#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/tensor/movement.hpp"
#include "dtensor/tensor/tensor.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor {

namespace detail {
// The staging slots of a started reduce-scatter and their sum into the result.
class OrderedReduceScatter final : public PendingExchange {
 public:
  DTENSOR_RUNTIME_KEY_FUNCTION(OrderedReduceScatter)  // util/compiled_runtime.hpp
  OrderedReduceScatter(Device device, DType t, int ranks, int64_t count, void* recv, StridedBlock recv_block)
      : device_(device), t_(t), ranks_(ranks), count_(count), recv_(recv), recv_block_(recv_block),
        staging_(Tensor<std::byte, 1>::uninitialized(
                     {static_cast<int64_t>(ranks) * count * static_cast<int64_t>(size_of(t))}, device)) {}
  void* staging() { return staging_.data(); }
  void start(Request inner) { inner_ = std::move(inner); }

  bool test() override {
    if (!inner_.test()) return false;
    sum();
    return true;
  }
  void wait() override {
    inner_.wait();
    sum();
  }

 private:
  // The ranks' slots summed in rank order (a 16-bit type in float, rounded once).
  void sum() {
    const std::byte* slots = staging_.data();
    const std::size_t elem = size_of(t_);
    movement::reduce_sources(
        device_, t_, ReduceOp::Sum, ranks_,
        [&](int k) {
          return std::pair<const void*, StridedBlock>{slots + static_cast<std::size_t>(k * count_) * elem,
                                                      StridedBlock::contiguous(0, count_)};
        },
        recv_, recv_block_);
  }

  Device device_;
  DType t_;
  int ranks_;
  int64_t count_;
  void* recv_;
  StridedBlock recv_block_;
  Tensor<std::byte, 1> staging_;
  Request inner_;  // declared last: abandoned (destroyed) first, before staging_ goes
};
}  // namespace detail

// Tag of the exchanges of start_reduce_scatter: a program's own exchanges on the same
// communicator must not use it (Comm::kAllGatherTag is the one beside it).
inline constexpr int kReduceScatterTag = Comm::kAllGatherTag - 1;

// Non-blocking reduce_scatter with ReduceOp::Sum: recv_block of recv = the sum over
// ranks k of send_blocks[rank()] of k's send, once the Request completes. Between the
// two the caller must not write `send` nor touch `recv`. Every rank starts its
// reduce-scatters in the same order; sizes that disagree fail both sides of the
// message, a failing or silent peer ends every wait with an exception.
inline Request start_reduce_scatter(Comm& comm, const void* send, std::span<const StridedBlock> send_blocks, void* recv,
                                    StridedBlock recv_block, DType t) {
  DTENSOR_CHECK(static_cast<int>(send_blocks.size()) == comm.size(), InvalidArgument,
                "start_reduce_scatter: ", send_blocks.size(), " blocks given for a communicator of ", comm.size(),
                " ranks");
  const int n = comm.size();
  const int64_t count = recv_block.numel();
  auto op = std::make_unique<detail::OrderedReduceScatter>(comm.device(), t, n, count, recv, recv_block);
  std::vector<SendSpec> sends;
  std::vector<RecvSpec> recvs;
  for (int k = 0; k < n; ++k) {
    sends.push_back({k, kReduceScatterTag, send, Region::of(send_blocks[static_cast<std::size_t>(k)]).simplified()});
    recvs.push_back({k, kReduceScatterTag, op->staging(), Region::contiguous(k * count, count), false});
  }
  op->start(comm.start_exchange(sends, recvs, t));
  return Request(std::move(op));
}

}  // namespace dtensor
