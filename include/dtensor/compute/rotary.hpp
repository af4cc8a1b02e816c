#pragma once
// Rotary position embedding (RoPE) on one rank: each head's vector at sequence
// position p is rotated, pair by pair, by angles proportional to p, so that the dot
// product of a query at p and a key at p' depends on p - p' only.
//
//   pairs (i, i + D/2), i < D/2 (the half-split of GPT-NeoX and LLaMA's rotate_half)
//   angle  p * base^(-2i / D)
//   x_i' = x_i cos - x_{i+D/2} sin,   x_{i+D/2}' = x_{i+D/2} cos + x_i sin
//
// x is row-major [groups, len, head_dim] (groups: batch x heads); row r of a group sits
// at global position first_position + r, so a block of a sharded sequence rotates as the
// whole sequence would. The backward of a rotation is the rotation by -angle
// (`inverse`), applied to the gradient. Angles are worked in double whatever T is:
// p * frequency reaches thousands of radians, where float's rounding of the angle
// alone would move the result.
#include <cmath>
#include <cstdint>
#include <vector>

#include "dtensor/util/error.hpp"

namespace dtensor::local {

struct RotaryDims {
  int64_t groups = 1, len = 0, head_dim = 0;
  int64_t first_position = 0;
  double base = 10000;
};

template <class T>
void rotary_embedding(const RotaryDims& d, T* x, bool inverse = false) {
  DTENSOR_CHECK(d.head_dim % 2 == 0 && d.head_dim > 0, InvalidArgument, "rotary_embedding: head dim ", d.head_dim,
                " is not a positive even number (RoPE rotates pairs of features)");
  DTENSOR_CHECK(d.base > 0, InvalidArgument, "rotary_embedding: base ", d.base, " must be positive");
  const int64_t half = d.head_dim / 2;
  std::vector<double> freq(static_cast<std::size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    freq[i] = std::pow(d.base, -2.0 * static_cast<double>(i) / static_cast<double>(d.head_dim));
  std::vector<T> c(static_cast<std::size_t>(half)), s(static_cast<std::size_t>(half));
  for (int64_t r = 0; r < d.len; ++r) {
    const double p = static_cast<double>(d.first_position + r);
    for (int64_t i = 0; i < half; ++i) {
      c[i] = static_cast<T>(std::cos(p * freq[i]));
      s[i] = static_cast<T>(inverse ? -std::sin(p * freq[i]) : std::sin(p * freq[i]));
    }
    for (int64_t g = 0; g < d.groups; ++g) {
      T* row = x + (g * d.len + r) * d.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const T a = row[i], b = row[i + half];
        row[i] = a * c[i] - b * s[i];
        row[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace dtensor::local
