#pragma once
// Reduction operators: the tags users write in Partial<Op>, and the run-time enum
// the communicators take.
#include <algorithm>
#include <cstddef>
#include <type_traits>

namespace dtensor {

enum class ReduceOp { Sum, Avg, Max, Min };

struct Sum { static constexpr ReduceOp value = ReduceOp::Sum; static constexpr const char* name = "sum"; };
struct Avg { static constexpr ReduceOp value = ReduceOp::Avg; static constexpr const char* name = "avg"; };
struct Max { static constexpr ReduceOp value = ReduceOp::Max; static constexpr const char* name = "max"; };
struct Min { static constexpr ReduceOp value = ReduceOp::Min; static constexpr const char* name = "min"; };

template <class Op>
concept ReduceOpTag = std::is_same_v<Op, Sum> || std::is_same_v<Op, Avg> ||
                      std::is_same_v<Op, Max> || std::is_same_v<Op, Min>;

// The tag of an operator: ReduceOp -> Sum, Avg, Max or Min.
template <ReduceOp Op>
using reduce_tag = std::conditional_t<Op == ReduceOp::Sum, Sum,
                                      std::conditional_t<Op == ReduceOp::Avg, Avg,
                                                         std::conditional_t<Op == ReduceOp::Max, Max, Min>>>;

constexpr const char* name(ReduceOp op) {
  constexpr const char* names[] = {"sum", "avg", "max", "min"};
  return names[static_cast<int>(op)];
}

namespace detail {

// out[i] = out[i] (op) in[i]. Avg accumulates like Sum; the caller divides once at the end.
template <class T>
inline void reduce_into(ReduceOp op, T* __restrict out, const T* __restrict in, std::size_t n) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      for (std::size_t i = 0; i < n; ++i) out[i] += in[i];
      break;
    case ReduceOp::Max:
    case ReduceOp::Min:
      // Complex numbers have no order: every communicator refuses Max and Min of them
      // (check_orderable) before any element is reduced.
      if constexpr (requires(T a, T b) { a < b; }) {
        if (op == ReduceOp::Max)
          for (std::size_t i = 0; i < n; ++i) out[i] = std::max(out[i], in[i]);
        else
          for (std::size_t i = 0; i < n; ++i) out[i] = std::min(out[i], in[i]);
      }
      break;
  }
}

// Finishes an Avg: divides by the number of terms (integer division for integers).
template <class T>
inline void divide_by(T* p, std::size_t n, int terms) {
  const T d = static_cast<T>(terms);
  for (std::size_t i = 0; i < n; ++i) p[i] /= d;
}

}  // namespace detail
}  // namespace dtensor
