#pragma once
// NCCL's versions and errors for the NCCL runtime (cuda/nccl_comm.hpp): the oldest
// NCCL supported and the newer calls used where present, results named with NCCL's
// last error, DTENSOR_NCCL(call) for calls outside a communicator.
#include <nccl.h>

#include <string>

#include "dtensor/util/error.hpp"

// The oldest NCCL this header supports, and the newer calls it uses when present.
#if !defined(NCCL_VERSION_CODE) || !defined(NCCL_VERSION)
#error "dtensor: this nccl.h defines no NCCL_VERSION_CODE; NcclComm needs NCCL 2.7 or newer"
#elif NCCL_VERSION_CODE < NCCL_VERSION(2, 7, 0)
#error "dtensor: NcclComm needs NCCL 2.7 or newer (ncclSend/ncclRecv)"
#endif

namespace dtensor {

namespace cuda::detail {

// ncclAvg (2.10); before it, floating Avg is a Sum followed by a division, like integers.
inline constexpr bool kNcclHasAvg = NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0);
// ncclCommSplit (2.18); before it, split() goes through fresh unique ids.
inline constexpr bool kNcclHasSplit = NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0);

// ncclInProgress (2.14, non-blocking communicators); older NCCL never answers it.
constexpr bool in_progress(ncclResult_t r) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  return r == ncclInProgress;
#else
  return (void)r, false;
#endif
}

inline const char* nccl_result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
    case ncclRemoteError: return "ncclRemoteError";
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    case ncclInProgress: return "ncclInProgress";
#endif
    default: return "ncclResult_t(unknown)";
  }
}

// NCCL's name and text for a result, and its last error message when it has one
// (which may say more, e.g. which peer or which CUDA call; NCCL 2.13 and newer).
inline std::string nccl_error_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = ::dtensor::detail::cat(nccl_result_name(r), ": ", ncclGetErrorString(r));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += ::dtensor::detail::cat(" (NCCL's last error: ", last, ")");
#else
  (void)comm;
#endif
  return s;
}

inline void check_nccl(ncclResult_t r, const char* call, const char* file, int line) {
  if (r == ncclSuccess) return;
  throw CommError(::dtensor::detail::cat("dtensor: NCCL call ", call, " failed: ", nccl_error_text(r, nullptr), " (",
                                         file, ":", line, ")"));
}

}  // namespace cuda::detail
}  // namespace dtensor

// DTENSOR_NCCL(ncclGetUniqueId(&id)): throws dtensor::CommError if the call fails.
// (Calls on an NcclComm's communicator go through the comm, which also aborts it.)
#ifndef DTENSOR_NCCL
#define DTENSOR_NCCL(call) ::dtensor::cuda::detail::check_nccl((call), #call, __FILE__, __LINE__)
#endif
