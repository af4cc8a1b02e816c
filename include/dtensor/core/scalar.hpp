#pragma once
// Scalar: one element of any element type, carried bit for bit across the
// type-erased device tables (a double would round 64-bit integers above 2^53).
#include <cstdint>
#include <cstring>

namespace dtensor {

struct Scalar {
  std::uint64_t bits = 0;
  template <class T>
  static Scalar of(T v) {
    static_assert(sizeof(T) <= sizeof(bits));
    Scalar s;
    std::memcpy(&s.bits, &v, sizeof v);
    return s;
  }
  template <class T>
  T as() const {
    T v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
};

}  // namespace dtensor
