#pragma once
// NcclComm's guarded mode (cuda/nccl_comm.hpp gathers its parts; docs/ARCHITECTURE.md,
// "The NCCL runtime"): before each collective the ranks all-gather a signature and the
// per-peer block sizes, and every rank judges the same table, so that all throw or
// none does.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "dtensor/comm/signature.hpp"
#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/nccl_comm_class.hpp"
#include "dtensor/util/error.hpp"
#include "dtensor/util/small_vector.hpp"

namespace dtensor {

inline void NcclComm::check_signature(const Signature& sig, std::span<const StridedBlock> a,
                                      std::span<const StridedBlock> b) {
  phase_ = " (comparing signatures, guarded mode)";
  const std::size_t len = signature_length(), all = len * static_cast<std::size_t>(size_);
  enqueue_and_wait([&] {
    int64_t* host = sig_host_.get<int64_t>(all * sizeof(int64_t));
    int64_t* dev = sig_dev_.get<int64_t>(all * sizeof(int64_t));
    int64_t* row = host + static_cast<std::size_t>(rank_) * len;
    row[0] = seq_, row[1] = static_cast<int64_t>(kind_) + 1, row[2] = static_cast<int64_t>(sig.dtype);
    row[3] = static_cast<int64_t>(sig.op), row[4] = sig.root, row[5] = sig.count;
    for (int k = 0; k < size_; ++k) {
      row[kHeader + k] = k < static_cast<int>(a.size()) ? a[k].numel() : 0;
      row[kHeader + size_ + k] = k < static_cast<int>(b.size()) ? b[k].numel() : 0;
    }
    int64_t* mine = dev + static_cast<std::size_t>(rank_) * len;
    DTENSOR_CUDA(cudaMemcpyAsync(mine, row, len * sizeof(int64_t), cudaMemcpyHostToDevice, stream_));
    nccl(ncclAllGather(mine, dev, len, ncclInt64, comm(), stream_), "ncclAllGather (signatures)");
    DTENSOR_CUDA(cudaMemcpyAsync(host, dev, all * sizeof(int64_t), cudaMemcpyDeviceToHost, stream_));
  });
  judge_signatures();
}

// Every rank judges the same table, so every rank reaches the same verdict: all
// throw, or none does (and then none has queued anything, so the communicator
// stays usable).
inline void NcclComm::judge_signatures() const {
  const std::size_t len = signature_length();
  const int64_t* table = sig_host_.get<int64_t>();
  const int n = size_;
  auto row = [&](int k) { return table + static_cast<std::size_t>(k) * len; };
  auto count = [&](int k) { return row(k)[5]; };
  auto a = [&](int i, int k) { return row(i)[kHeader + k]; };
  auto b = [&](int i, int k) { return row(i)[kHeader + n + k]; };
  // The runtimes' one check (comm/signature.hpp), judged from rank 0's row on every
  // rank (the same verdict everywhere); then the per-peer sizes, which only this
  // runtime's table holds.
  detail::SmallVector<detail::Signature, 16> sigs(static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k) {
    const int64_t* r = row(k);
    const int64_t kind = r[1] >= 1 ? r[1] - 1 : kCollectiveKinds;  // 0: no collective (unknown)
    sigs[static_cast<std::size_t>(k)] = {
        .seq = r[0], .kind = kind, .dtype = r[2], .op = r[3], .root = r[4], .count = r[5]};
  }
  detail::check_signatures(sigs, 0);
  const int64_t* r0 = row(0);
  auto sizes = [&](auto&&... what) {
    throw CommError(detail::cat("dtensor: ", what_, ": ", what..., "; the ranks disagree on the sizes"));
  };
  const int root = static_cast<int>(r0[4]);
  switch (kind_) {
    case Kind::AllGather:
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < n; ++k)
          if (a(i, k) != count(k))
            sizes("rank ", k, " sends ", count(k), " elements to rank ", i, ", which expects ", a(i, k));
      break;
    case Kind::ReduceScatter:
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < n; ++k)
          if (a(i, k) != count(k))
            sizes("rank ", i, " contributes ", a(i, k), " elements to the piece of rank ", k, ", which holds ",
                  count(k));
      break;
    case Kind::AllToAll:
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < n; ++k)
          if (a(i, k) != b(k, i))
            sizes("rank ", i, " sends ", a(i, k), " elements to rank ", k, ", which expects ", b(k, i));
      break;
    case Kind::Scatter:
      for (int k = 0; k < n; ++k)
        if (a(root, k) != count(k))
          sizes("root ", root, " sends ", a(root, k), " elements to rank ", k, ", which expects ", count(k));
      break;
    case Kind::Gather:
      for (int k = 0; k < n; ++k)
        if (a(root, k) != count(k))
          sizes("rank ", k, " sends ", count(k), " elements to root ", root, ", which expects ", a(root, k));
      break;
    default:
      break;
  }
}

}  // namespace dtensor
