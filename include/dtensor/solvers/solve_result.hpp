#pragma once
// What an iterative solve returns: how many iterations ran, whether the residual
// met the tolerance, the residual norms along the way, how long it took and how
// many all-reduces it made.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/util/error.hpp"

namespace dtensor {

// Stop once ||r_k|| <= max(rtol * ||b||, atol) or after max_iters iterations.
// rtol = atol = 0 runs exactly max_iters iterations (a benchmark's fixed count).
struct StopCriteria {
  int max_iters = 1000;
  double rtol = 1e-8;
  double atol = 0;
};

struct SolveResult {
  int iterations = 0;      // updates of x made
  bool converged = false;  // ||r|| met the tolerance
  double residual = 0;     // the last ||r|| computed (the solver's recursive residual for CG)
  double rhs_norm = 0;     // ||b||
  // ||r_0||, ||r_1||, ...: one entry per residual the solver computed (CG: every
  // iteration; Jacobi: every check_every iterations, r of the iterate before the update).
  std::vector<double> history;
  double seconds = 0;            // the whole solve, setup included
  double iteration_seconds = 0;  // the iterations alone
  int64_t all_reduces = 0;       // made by the solve (each a handful of doubles)

  double relative_residual() const { return rhs_norm > 0 ? residual / rhs_norm : residual; }
  double seconds_per_iteration() const { return iterations > 0 ? iteration_seconds / iterations : 0; }
  std::string to_string() const {
    return detail::cat(iterations, " iterations, ", converged ? "converged" : "not converged",
                       ", ||r||/||b|| = ", relative_residual(), ", ", seconds_per_iteration() * 1e6,
                       " us per iteration, ", all_reduces, " all-reduces");
  }
};

namespace detail {
inline double stop_threshold(const StopCriteria& s, double bnorm) { return std::max(s.rtol * bnorm, s.atol); }
}  // namespace detail

}  // namespace dtensor
