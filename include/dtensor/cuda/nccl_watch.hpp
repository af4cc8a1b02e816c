#pragma once
// How an NcclComm waits and fails (cuda/nccl_comm.hpp gathers its parts): a wait polls
// an event and NCCL's asynchronous error state under the deadline, spinning briefly,
// then sleeping; a GPU fault, an NCCL error or the timeout aborts the communicator
// (ncclCommAbort) and throws, naming the rank, the call and the time it took.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/nccl_comm_class.hpp"
#include "dtensor/cuda/nccl_error.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor {

inline void NcclComm::abort_comm(const std::string& why) noexcept {
  if (aborted_) return;
  aborted_ = true;
  try {
    abort_reason_ = why.rfind("dtensor: ", 0) == 0 ? why.substr(9) : why;
  } catch (...) {
  }
  comm_.abort();
}

// A failure this rank found on its own: abort (its peers may be waiting in the
// collective) and say so.
inline void NcclComm::fail_local(const std::string& msg) {
  abort_comm(msg);
  throw CommError(msg + "; the NCCL communicator was aborted");
}

inline void NcclComm::nccl(ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return;
  if (cuda::detail::in_progress(r)) return ready(comm(), call);  // a non-blocking communicator
  fail_local(detail::cat("dtensor: rank ", rank_, ": ", what_, phase_, ": NCCL call ", call, " failed: ",
                         cuda::detail::nccl_error_text(r, comm())));
}

inline std::string NcclComm::elapsed_since(Clock::time_point from) {
  const double s = std::chrono::duration<double>(Clock::now() - from).count();
  return detail::cat(std::round(s * 1000) / 1000, " s");
}

inline void NcclComm::fail_timeout() {
  std::string msg = detail::cat(
      "dtensor: rank ", rank_, ": ", what_, phase_, " timed out after ", elapsed(), " (limit ", timeout_.count(),
      " ms, from NcclOptions::timeout or DTENSOR_TIMEOUT_S): a peer did not join it, joined another collective, "
      "or failed");
  if (!abandoned_.empty())
    msg += detail::cat(" (", abandoned_, " was abandoned while in flight and may hold the stream)");
  msg += "; the NCCL communicator was aborted";
  abort_comm(msg);
  throw CollectiveTimeout(msg);
}

inline void NcclComm::pause(int polls) {
  if (polls < 64) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(polls < 1024 ? 10 : 200));
}

// Waits until NCCL has finished an operation still in progress on `c` (init, or a
// call on a non-blocking communicator).
inline void NcclComm::ready(ncclComm_t c, const char* call) {
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(c, &state);
    if (q != ncclSuccess) state = q;
    if (state == ncclSuccess) return;
    if (!cuda::detail::in_progress(state))
      fail_local(detail::cat("dtensor: rank ", rank_, ": ", what_, phase_, ": NCCL call ", call, " failed: ",
                             cuda::detail::nccl_error_text(state, c)));
    if (timed_out()) fail_timeout();
    pause(polls);
  }
}

// One look at an event: true once the GPU has passed it. A GPU fault or an
// asynchronous NCCL error aborts the communicator and throws, naming `what` (the
// operation and its phase) and the time since `since`.
inline bool NcclComm::passed(cudaEvent_t event, const std::string& what, const char* phase,
                             Clock::time_point since) {
  const cudaError_t e = cudaEventQuery(event);
  if (e == cudaSuccess) return true;
  if (e != cudaErrorNotReady) {
    (void)cudaGetLastError();
    const std::string msg = detail::cat("dtensor: rank ", rank_, ": ", what, phase, ": the GPU reported ",
                                        cudaGetErrorName(e), ": ", cudaGetErrorString(e), " after ",
                                        elapsed_since(since),
                                        " (it may come from earlier work on the stream); the NCCL communicator "
                                        "was aborted");
    abort_comm(msg);
    throw CudaError(msg);
  }
  ncclResult_t async = ncclSuccess;
  const ncclResult_t q = ncclCommGetAsyncError(comm(), &async);
  if (q != ncclSuccess) async = q;
  if (async != ncclSuccess && !cuda::detail::in_progress(async)) {
    const std::string msg = detail::cat("dtensor: rank ", rank_, ": ", what, phase, " failed after ",
                                        elapsed_since(since), ": NCCL reported an asynchronous error: ",
                                        cuda::detail::nccl_error_text(async, comm()),
                                        "; the NCCL communicator was aborted");
    abort_comm(msg);
    throw CommError(msg);
  }
  return false;
}

// Waits for everything queued so far, watching for NCCL's asynchronous errors and
// the timeout. Never spins for long: after a few polls it sleeps between them.
inline void NcclComm::wait() {
  DTENSOR_CUDA(cudaEventRecord(done_, stream_));
  for (int polls = 0;; ++polls) {
    if (passed(done_, what_, phase_, start_)) break;
    if (timed_out()) fail_timeout();
    pause(polls);
  }
  // Everything queued before has finished, exchanges included.
  exchanges_issued_ = false;
}

}  // namespace dtensor
