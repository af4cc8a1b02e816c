#pragma once
// The deadline of every blocking wait of the runtimes (in-process, MPI; NCCL takes it
// where NcclOptions::timeout is unset): DTENSOR_TIMEOUT_S seconds, or 120 s when the
// variable is unset. A job whose rank returned early, failed outside the library or
// was stopped ends with a message within it instead of hanging; PyTorch's NCCL watchdog
// waits 10 minutes. 0 (or a negative value) means no deadline.
#include <cstdlib>

namespace dtensor {

inline constexpr double kDefaultDeadlineS = 120;

// Seconds; 0 for none.
inline double deadline_s() {
  if (const char* s = std::getenv("DTENSOR_TIMEOUT_S")) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (end != s) return v > 0 ? v : 0;
  }
  return kDefaultDeadlineS;
}

}  // namespace dtensor
