#pragma once
// Shared pieces of the fault tests: a run with a short timeout, and elapsed time.
#include <dtensor/dtensor.hpp>

#include <chrono>

namespace dtensor::test {

using Clock = std::chrono::steady_clock;

inline RunOptions with_timeout(double s) {
  RunOptions o;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  return o;
}
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace dtensor::test
