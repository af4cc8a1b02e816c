#pragma once
// Scalar: one element of any element type, carried bit for bit across the
// type-erased device tables (a double would round 64-bit integers above 2^53).
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace dtensor {

struct Scalar {
  std::uint64_t bits = 0;
  template <class T>
  static Scalar of(T v) {
    static_assert(sizeof(T) <= sizeof(bits) && std::is_trivially_copyable_v<T>);
    Scalar s;
    std::memcpy(&s.bits, static_cast<const void*>(&v), sizeof v);
    return s;
  }
  template <class T>
  T as() const {
    T v{};
    std::memcpy(static_cast<void*>(&v), &bits, sizeof v);  // (bfloat16, float16: a class, trivially copyable)
    return v;
  }
};

}  // namespace dtensor
