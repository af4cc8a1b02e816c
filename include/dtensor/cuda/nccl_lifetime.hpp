#pragma once
// How an NcclComm begins and ends (cuda/nccl_comm.hpp gathers its parts): the
// factories from_unique_id and init_all, the constructor, which makes every buffer a
// collective may need, the options' defaults, and the destructor, which withdraws what
// never ran and aborts rather than wait for an exchange abandoned in flight.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/comm/deadline.hpp"
#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/memory.hpp"
#include "dtensor/cuda/nccl_comm_class.hpp"
#include "dtensor/cuda/nccl_error.hpp"
#include "dtensor/cuda/nccl_resources.hpp"
#include "dtensor/cuda/stream.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

inline std::unique_ptr<NcclComm> NcclComm::from_unique_id(ncclUniqueId id, int rank, int size, int device,
                                                          Options options) {
  const char* where = "NcclComm::from_unique_id";
  DTENSOR_CHECK(size >= 1 && rank >= 0 && rank < size, InvalidArgument, where, ": rank ", rank,
                " does not exist in a communicator of ", size, " ranks");
  cuda::detail::check_device(device, where);
  cudaStream_t stream = options.stream;
  if (stream) {
    check_stream_device(stream, device, where);
  } else {
    cuda::set_device(device);
    stream = cuda::current_stream();
  }
  cuda::DeviceGuard guard(device);
  ncclComm_t raw = nullptr;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  const char* call = "ncclCommInitRankConfig";
  const ncclResult_t r = ncclCommInitRankConfig(&raw, size, id, rank, &config);
#else
  const char* call = "ncclCommInitRank";  // no configuration before NCCL 2.14: always blocking
  const ncclResult_t r = ncclCommInitRank(&raw, size, id, rank);
#endif
  cuda::detail::NcclHandle handle(raw);
  if (r != ncclSuccess && !cuda::detail::in_progress(r)) {
    const std::string why = cuda::detail::nccl_error_text(r, raw);
    handle.abort();  // what NCCL left of a failed init, if anything
    throw CommError(detail::cat("dtensor: ", where, ": rank ", rank, " of ", size, " on CUDA device ", device, ": ",
                                call, " failed: ", why));
  }
  return std::unique_ptr<NcclComm>(new NcclComm(std::move(handle), device, nullptr, stream, settings(options)));
}

inline std::vector<std::unique_ptr<NcclComm>> NcclComm::init_all(std::span<const int> devices, Options options) {
  const char* where = "NcclComm::init_all";
  const int n = static_cast<int>(devices.size());
  DTENSOR_CHECK(n >= 1, InvalidArgument, where, ": no devices given");
  DTENSOR_CHECK(options.stream == nullptr, InvalidArgument, where,
                ": Options::stream must be null, since each communicator gets a stream of its own on its device");
  for (int i = 0; i < n; ++i) {
    cuda::detail::check_device(devices[i], where);
    for (int j = 0; j < i; ++j)
      DTENSOR_CHECK(devices[j] != devices[i], InvalidArgument, where, ": CUDA device ", devices[i],
                    " is listed twice; NCCL needs a GPU of its own for each rank");
  }
  std::vector<ncclComm_t> raw(static_cast<std::size_t>(n), nullptr);
  const ncclResult_t r = ncclCommInitAll(raw.data(), n, devices.data());
  std::vector<cuda::detail::NcclHandle> handles;
  handles.reserve(raw.size());
  for (ncclComm_t c : raw) handles.emplace_back(c);
  if (r != ncclSuccess && !cuda::detail::in_progress(r)) {
    const std::string why = cuda::detail::nccl_error_text(r, nullptr);
    for (auto& h : handles) h.abort();
    throw CommError(detail::cat("dtensor: ", where, ": ncclCommInitAll on ", n, " devices failed: ", why));
  }
  const Settings s = settings(options);
  std::vector<std::unique_ptr<NcclComm>> comms;
  comms.reserve(raw.size());
  for (int i = 0; i < n; ++i) {
    auto owner = std::make_shared<cuda::detail::OwnedStream>(devices[i]);
    const cudaStream_t stream = owner->stream;
    std::unique_ptr<NcclComm> c(new NcclComm(std::move(handles[i]), devices[i], std::move(owner), stream, s));
    comms.push_back(std::move(c));
  }
  return comms;
}

inline NcclComm::~NcclComm() {
  cuda::detail::QuietDeviceGuard guard(device_);
  link_->comm = nullptr;  // this communicator's Requests now refuse to wait
  // Exchanges never issued: withdrawn. Messages to itself never received: dropped.
  for (auto& s : pending_) release_staging(*s), s->status = ExchangeState::Status::Failed;
  pending_.clear();
  for (auto& m : self_queue_)
    if (m.data) (void)cudaFreeAsync(m.data, stream_);
  self_queue_.clear();
  // An exchange may still be running (one abandoned in flight, whose peers never came):
  // ncclCommDestroy could wait for it forever, ncclCommAbort does not.
  bool busy = false;
  if (exchanges_issued_ && comm_.get() && cudaEventRecord(done_, stream_) == cudaSuccess)
    busy = cudaEventQuery(done_) == cudaErrorNotReady;
  (void)cudaGetLastError();
  if (busy) comm_.abort();
  else comm_.reset();  // ncclCommDestroy; nothing left to do once aborted
  if (done_) (void)cudaEventDestroy(done_);
  if (follow_) (void)cudaEventDestroy(follow_);
  events_.clear();
  sig_dev_.reset(), scratch_.reset();
  sig_host_.reset(), split_host_.reset();
}

inline NcclComm::NcclComm(cuda::detail::NcclHandle handle, int device,
                          std::shared_ptr<cuda::detail::OwnedStream> owner, cudaStream_t stream, Settings s)
    : stream_owner_(std::move(owner)), stream_(stream), device_(device), comm_(std::move(handle)),
      timeout_(s.timeout), guarded_(s.guarded) {
  // On failure below, the members already built (the NCCL handle among them)
  // clean up; the event is the last thing made.
  cuda::DeviceGuard guard(device_);
  start_ = Clock::now();
  what_ = "initialisation";
  ready(comm_.get(), "ncclCommInit");
  DTENSOR_NCCL(ncclCommUserRank(comm_.get(), &rank_));
  DTENSOR_NCCL(ncclCommCount(comm_.get(), &size_));
  // Every buffer a collective may need, now (see cuda::detail::Buffer).
  const std::size_t signatures = signature_length() * static_cast<std::size_t>(size_) * sizeof(int64_t);
  scratch_.make(kScratchBytes, stream_);
  if (guarded_) sig_dev_.make(signatures, stream_), sig_host_.make(signatures, stream_);
  split_host_.make(split_table_words() * sizeof(int64_t), stream_);
  DTENSOR_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

inline NcclComm::Settings NcclComm::settings(const Options& o) {
  Settings s;
  const double deadline = deadline_s();
  if (o.timeout) s.timeout = std::max(*o.timeout, std::chrono::milliseconds(0));
  else if (deadline > 0) s.timeout = std::chrono::milliseconds(std::max<long long>(1, std::llround(deadline * 1000)));
  const char* c = std::getenv("DTENSOR_CHECK_COLLECTIVES");
  s.guarded = o.check_collectives ? *o.check_collectives : (c && *c && *c != '0');
  return s;
}

inline void NcclComm::check_stream_device(cudaStream_t stream, int device, const char* where) {
#if CUDART_VERSION >= 12080
  int d = -1;
  DTENSOR_CUDA(cudaStreamGetDevice(stream, &d));
  DTENSOR_CHECK(d == device, InvalidArgument, where, ": the stream given in the options belongs to CUDA device ", d,
                ", not to the communicator's device ", device);
#else
  (void)stream, (void)device, (void)where;
#endif
}

}  // namespace dtensor
