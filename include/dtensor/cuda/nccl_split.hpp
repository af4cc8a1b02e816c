#pragma once
// NcclComm::split (cuda/nccl_comm.hpp gathers its parts): ncclCommSplit where NCCL has
// it (2.18 and newer), else, or when DTENSOR_NCCL_SPLIT_BY_ID is set and not "0", a
// unique id per new communicator, handed out by all-gathers over this one, and
// ncclCommInitRank.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/nccl_comm_class.hpp"
#include "dtensor/cuda/nccl_error.hpp"
#include "dtensor/cuda/nccl_resources.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

inline std::unique_ptr<Comm> NcclComm::split(int color, int key) {
  std::unique_ptr<Comm> out;
  const char* by_id = std::getenv("DTENSOR_NCCL_SPLIT_BY_ID");
  const bool fresh_ids = !cuda::detail::kNcclHasSplit || (by_id && *by_id && *by_id != '0');
  collective(Kind::Split, {}, {}, {}, [&] {
    cuda::detail::NcclHandle handle;
    if (fresh_ids) {
      handle = split_by_unique_id(color, key);
    } else {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
      // A null config: the new communicator inherits this one's settings. The result
      // goes to a member, not the stack: a non-blocking communicator (forced by
      // NCCL_COMM_BLOCKING=0) writes it from NCCL's own thread when the split is done,
      // which nccl() waits for.
      split_result_ = nullptr;
      nccl(ncclCommSplit(comm(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &split_result_, nullptr),
           "ncclCommSplit");
      handle = cuda::detail::NcclHandle(std::exchange(split_result_, nullptr));
#endif
    }
    if (!handle.get()) return;  // no color: not a member of any new communicator
    out.reset(new NcclComm(std::move(handle), device_, stream_owner_, stream_, Settings{timeout_, guarded_}));
  });
  return out;
}

// The ranks all-gather (color, key); the first member of each new communicator (by
// key, then rank) makes a unique id, which a second all-gather hands to the others;
// the members then make the communicator with ncclCommInitRank (blocking, like
// ncclCommSplit). Runs inside split()'s collective: a failure aborts this communicator.
inline cuda::detail::NcclHandle NcclComm::split_by_unique_id(int color, int key) {
  const std::size_t all = kSplitRow * static_cast<std::size_t>(size_);
  int64_t* host = split_host_.get<int64_t>(all * sizeof(int64_t));
  cuda::detail::Staging dev_mem(stream_);
  const std::size_t dev_at = dev_mem.reserve(static_cast<int64_t>(all), sizeof(int64_t));
  dev_mem.allocate();
  auto* dev = reinterpret_cast<int64_t*>(dev_mem.at(dev_at));
  auto gather = [&](std::size_t words, const char* call) {
    int64_t* mine = dev + static_cast<std::size_t>(rank_) * words;
    DTENSOR_CUDA(cudaMemcpyAsync(mine, host + static_cast<std::size_t>(rank_) * words, words * sizeof(int64_t),
                                 cudaMemcpyHostToDevice, stream_));
    nccl(ncclAllGather(mine, dev, words, ncclInt64, comm(), stream_), call);
    DTENSOR_CUDA(cudaMemcpyAsync(host, dev, words * static_cast<std::size_t>(size_) * sizeof(int64_t),
                                 cudaMemcpyDeviceToHost, stream_));
    wait();
  };
  phase_ = " (split by unique id: gathering colors and keys)";
  host[2 * rank_] = color, host[2 * rank_ + 1] = key;
  gather(2, "ncclAllGather (split colors)");
  std::vector<std::pair<int64_t, int>> members;  // (key, rank) of this rank's color
  if (color >= 0)
    for (int k = 0; k < size_; ++k)
      if (host[2 * k] == color) members.emplace_back(host[2 * k + 1], k);
  std::sort(members.begin(), members.end());
  const int leader = members.empty() ? -1 : members[0].second;
  int index = 0;
  while (index < static_cast<int>(members.size()) && members[index].second != rank_) ++index;

  phase_ = " (split by unique id: handing out the unique ids)";
  int64_t* row = host + static_cast<std::size_t>(rank_) * kSplitRow;
  std::fill(row, row + kSplitRow, int64_t{0});
  row[0] = 1;
  std::string why;
  if (leader == rank_) {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r == ncclSuccess) std::memcpy(row + 1, &id, sizeof id);
    else row[0] = 0, why = cuda::detail::nccl_error_text(r, nullptr);
  }
  gather(kSplitRow, "ncclAllGather (split unique ids)");
  for (int k = 0; k < size_; ++k)
    if (host[static_cast<std::size_t>(k) * kSplitRow] == 0)
      throw CommError(detail::cat("dtensor: rank ", rank_, ": ", what_, ": ncclGetUniqueId failed on rank ", k,
                                  k == rank_ ? ": " + why : std::string(), "; the communicator was aborted"));
  if (color < 0) return {};
  ncclUniqueId id;
  std::memcpy(&id, host + static_cast<std::size_t>(leader) * kSplitRow + 1, sizeof id);
  phase_ = " (split by unique id: ncclCommInitRank)";
  ncclComm_t raw = nullptr;
  const ncclResult_t r = ncclCommInitRank(&raw, static_cast<int>(members.size()), id, index);
  cuda::detail::NcclHandle handle(raw);
  if (r != ncclSuccess && !cuda::detail::in_progress(r)) {
    const std::string text = cuda::detail::nccl_error_text(r, raw);
    handle.abort();
    fail_local(detail::cat("dtensor: rank ", rank_, ": ", what_, phase_, ": NCCL call ncclCommInitRank failed: ",
                           text));
  }
  return handle;
}

}  // namespace dtensor
