#pragma once
// Exceptions thrown by dtensor. Every error a user can trigger at run time derives
// from dtensor::Error so that one catch clause covers the library.
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dtensor {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Invalid arguments: bad shapes, sizes, ranks, meshes.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A host tensor would bring this process's tensors over the limit set by
// set_host_memory_limit (tensor/device.hpp).
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// A collective could not complete: peer failure, timeout, mismatched calls.
class CommError : public Error {
 public:
  using Error::Error;
};

// A collective waited longer than the configured timeout.
class CollectiveTimeout : public CommError {
 public:
  using CommError::CommError;
};

// Thrown on a healthy rank when another rank has failed; the world is aborted.
class PeerAborted : public CommError {
 public:
  using CommError::CommError;
};

// What run_threads (and later launchers) rethrows on the caller: the first rank
// that failed for a reason of its own, and what it threw.
class RankFailure : public Error {
 public:
  RankFailure(int rank, std::string what, std::exception_ptr original)
      : Error("dtensor: rank " + std::to_string(rank) + " failed: " + what),
        rank_(rank), original_(std::move(original)) {}
  int rank() const noexcept { return rank_; }
  // The exception object the failing rank threw, for callers that need its type.
  const std::exception_ptr& original() const noexcept { return original_; }

 private:
  int rank_;
  std::exception_ptr original_;
};

namespace detail {
template <class... A>
std::string cat(A&&... a) {
  std::ostringstream os;
  (os << ... << std::forward<A>(a));
  return os.str();
}
}  // namespace detail

#define DTENSOR_CHECK(cond, ExType, ...)                                  \
  do {                                                                    \
    if (!(cond)) throw ExType(::dtensor::detail::cat("dtensor: ", __VA_ARGS__)); \
  } while (0)

}  // namespace dtensor
