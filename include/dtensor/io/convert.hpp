#pragma once
// Loading a tensor into another floating-point type than the checkpoint stores it in:
// only when asked (LoadOptions::convert), since a model saved in float32 and loaded
// into bfloat16 loses bits the program did not say it could lose.
//
//   io::load(sd, dir, comm, {.convert = io::Convert::Allowed});
//
// Convert::Exact (the default): a stored dtype other than the destination's is a
// CheckpointError naming the tensor and both types. Convert::Allowed: any of F32,
// F64, BF16 and F16 loads into any of float, double, bfloat16 and float16, element by
// element, each rounded once to nearest even: a 16-bit value or a float widens
// exactly; a float narrows to 16 bits by the type's constructor; a double narrows to
// float by the cast, and to 16 bits by T::from_double (core/float16.hpp), which does
// not round twice through float. Integer types never convert: they load as saved.
//
// The loader reads the stored bytes as it always does (only the pieces that hold the
// rank's block, each checksum verified) and converts them as they are copied out of
// its staging buffer: it writes each element of the destination block once and
// nothing beside it, and a stored element cut by a piece boundary is put together
// before it is converted (io/read_plan.hpp).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "dtensor/compute/convert.hpp"
#include "dtensor/core/dtype.hpp"

namespace dtensor::io {

enum class Convert { Exact, Allowed };

namespace detail {

// Converts n elements of From (little-endian, as stored: `src` need not be aligned)
// into n elements of To at `dst`.
template <class To, class From>
void convert_elements(unsigned char* dst, const unsigned char* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    From x;
    std::memcpy(&x, src + i * sizeof(From), sizeof(From));
    const To y = dtensor::detail::convert_element<To>(x);
    std::memcpy(dst + i * sizeof(To), &y, sizeof(To));
  }
}

using ConvertFn = void (*)(unsigned char* dst, const unsigned char* src, std::size_t n);

// The conversion of stored `from` elements into `to` ones, or null where either is
// not a floating-point type.
inline ConvertFn converter(DType from, DType to) {
  if (!is_floating(from) || !is_floating(to)) return nullptr;
  return visit_dtype(from, [&](auto f) -> ConvertFn {
    using From = decltype(f);
    return visit_dtype(to, [&](auto t) -> ConvertFn {
      using To = decltype(t);
      if constexpr (FloatingElement<From> && FloatingElement<To>) return &convert_elements<To, From>;
      else return nullptr;
    });
  });
}

// Bytes of stored elements in, converted elements out, in order: an element whose
// bytes come in two calls (cut by a piece boundary) is converted when its last byte
// arrives. Writes exactly one destination element per stored element given.
class ConvertingCopy {
 public:
  ConvertingCopy(ConvertFn f, unsigned char* out, std::size_t from_size, std::size_t to_size)
      : f_(f), out_(out), from_(from_size), to_(to_size) {}

  void put(const unsigned char* p, std::size_t n) {
    if (have_ > 0) {
      const std::size_t k = std::min(n, from_ - have_);
      std::memcpy(part_ + have_, p, k);
      have_ += k, p += k, n -= k;
      if (have_ < from_) return;
      f_(out_, part_, 1);
      out_ += to_, have_ = 0;
    }
    const std::size_t whole = n / from_;
    f_(out_, p, whole);
    out_ += whole * to_, p += whole * from_, n -= whole * from_;
    std::memcpy(part_, p, n);
    have_ = n;
  }

 private:
  ConvertFn f_;
  unsigned char* out_;
  std::size_t from_, to_, have_ = 0;
  unsigned char part_[8];  // the bytes so far of an element cut in two
};

}  // namespace detail
}  // namespace dtensor::io
