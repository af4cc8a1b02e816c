#pragma once
// Whether every rank of a sum all-reduce passed the same signature, found by the
// all-reduce itself: four more doubles in the buffer, no collective of its own.
//
// A layer whose collectives carry only sums (per-channel statistics, a loss's totals)
// cannot tell from the result that a rank built its input with another global shape:
// the sums just come out wrong. Each rank hashes what it believes (the global shape)
// into 24 bits, split into two 12-bit halves h, and appends h and h^2 of each. After
// the sum over n ranks, n sum(h^2) == (sum h)^2 holds exactly when every h was the
// same (the variance of the h is zero), and every rank sees the same sums, so every
// rank reaches the same verdict. The sums stay below 2^53 up to 16384 ranks, so the
// doubles hold them exactly (past that the check is skipped); two beliefs that hash
// alike (1 in 2^24) pass.
#include <array>
#include <cstdint>
#include <initializer_list>

namespace dtensor {

inline constexpr std::size_t kAgreementValues = 4;

namespace detail {
constexpr uint64_t agreement_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace detail

// A signature of some integers (a shape's extents, a tag of what is compared).
inline constexpr uint64_t agreement_signature(std::initializer_list<int64_t> values) {
  uint64_t h = 0x243F6A8885A308D3ull;
  for (int64_t v : values) h = detail::agreement_mix(h ^ static_cast<uint64_t>(v));
  return h;
}
template <std::size_t N>
constexpr uint64_t agreement_signature(const std::array<int64_t, N>& values, int64_t tag = 0) {
  uint64_t h = detail::agreement_mix(0x243F6A8885A308D3ull ^ static_cast<uint64_t>(tag));
  for (int64_t v : values) h = detail::agreement_mix(h ^ static_cast<uint64_t>(v));
  return h;
}

// The four values this rank appends to a sum all-reduce for `signature`.
inline void write_agreement(double* tail, uint64_t signature) {
  const auto lo = static_cast<double>(signature & 0xFFF), hi = static_cast<double>((signature >> 12) & 0xFFF);
  tail[0] = lo, tail[1] = lo * lo, tail[2] = hi, tail[3] = hi * hi;
}

// After the sum over `ranks` ranks: whether they all wrote the same signature.
inline bool agreed(const double* tail, int64_t ranks) {
  if (ranks > 16384) return true;  // the sums could round: no verdict
  const auto n = static_cast<double>(ranks);
  return n * tail[1] == tail[0] * tail[0] && n * tail[3] == tail[2] * tail[2];
}

}  // namespace dtensor
