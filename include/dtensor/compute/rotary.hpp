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

#include "dtensor/compute/device_backend.hpp"
#include "dtensor/tensor/tensor.hpp"
#include "dtensor/util/error.hpp"
#include "dtensor/util/compiled_runtime.hpp"

namespace dtensor::compute {

struct RotaryDims {
  int64_t groups = 1, len = 0, head_dim = 0;
  int64_t first_position = 0;
  double base = 10000;
};

// cos and sin (-sin for the inverse) of row r's angles, [len, head_dim / 2] each.
template <class T>
void rotary_table(const RotaryDims& d, bool inverse, std::vector<T>& c, std::vector<T>& s) {
  DTENSOR_CHECK(d.head_dim % 2 == 0 && d.head_dim > 0, InvalidArgument, "rotary_embedding: head dim ", d.head_dim,
                " is not a positive even number (RoPE rotates pairs of features)");
  DTENSOR_CHECK(d.base > 0, InvalidArgument, "rotary_embedding: base ", d.base, " must be positive");
  const int64_t half = d.head_dim / 2;
  std::vector<double> freq(static_cast<std::size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    freq[i] = std::pow(d.base, -2.0 * static_cast<double>(i) / static_cast<double>(d.head_dim));
  c.resize(static_cast<std::size_t>(d.len * half));
  s.resize(c.size());
  for (int64_t r = 0; r < d.len; ++r) {
    const double p = static_cast<double>(d.first_position + r);
    for (int64_t i = 0; i < half; ++i) {
      c[r * half + i] = static_cast<T>(std::cos(p * freq[i]));
      s[r * half + i] = static_cast<T>(inverse ? -std::sin(p * freq[i]) : std::sin(p * freq[i]));
    }
  }
}

template <class T>
void rotary_embedding(const RotaryDims& d, T* x, bool inverse = false) {
  std::vector<T> c, s;
  rotary_table(d, inverse, c, s);
  const int64_t half = d.head_dim / 2;
  for (int64_t r = 0; r < d.len; ++r)
    for (int64_t g = 0; g < d.groups; ++g) {
      T* row = x + (g * d.len + r) * d.head_dim;
      const T* cr = c.data() + r * half;
      const T* sr = s.data() + r * half;
      for (int64_t i = 0; i < half; ++i) {
        const T a = row[i], b = row[i + half];
        row[i] = a * cr[i] - b * sr[i];
        row[i + half] = b * cr[i] + a * sr[i];
      }
    }
}

// The same on x's device. On a GPU: the table is worked on the host (angles in double,
// as above), uploaded once per call, and applied by the elementwise kernels to the two
// halves of every row, gathered and scattered by strided block copies.
template <class T>
void rotary_embedding(Device dev, const RotaryDims& d, T* x, bool inverse = false) {
  if (dev.is_host()) return rotary_embedding(d, x, inverse);
  std::vector<T> c, s;
  rotary_table(d, inverse, c, s);
  const int64_t half = d.head_dim / 2, rows = d.groups * d.len, n = rows * half;
  if (n == 0) return;
  const auto& be = dtensor::detail::device_backend(dev);
  const auto& move = dtensor::detail::device_movement(dev);
  const DType t = dtype_of<T>();
  const auto tensor = [&](int64_t m) { return Tensor<T, 1>::uninitialized({m}, dev); };
  const Tensor<T, 1> ct = Tensor<T, 1>({d.len * half}, std::move(c)).to(dev);
  const Tensor<T, 1> st = Tensor<T, 1>({d.len * half}, std::move(s)).to(dev);
  Tensor<T, 1> cg = tensor(n), sg = tensor(n), x1 = tensor(n), x2 = tensor(n), y1 = tensor(n), y2 = tensor(n);
  // the table repeated for every group (a source of stride 0), the halves gathered
  move.copy_block(ct.data(), StridedBlock{0, d.groups, 0, d.len * half}, cg.data(), StridedBlock::contiguous(0, n),
                  sizeof(T));
  move.copy_block(st.data(), StridedBlock{0, d.groups, 0, d.len * half}, sg.data(), StridedBlock::contiguous(0, n),
                  sizeof(T));
  move.copy_block(x, StridedBlock{0, rows, d.head_dim, half}, x1.data(), StridedBlock::contiguous(0, n), sizeof(T));
  move.copy_block(x, StridedBlock{half, rows, d.head_dim, half}, x2.data(), StridedBlock::contiguous(0, n), sizeof(T));
  // y1 = x1 c - x2 s, y2 = x2 c + x1 s
  be.binary(t, BinaryOp::Mul, x1.data(), cg.data(), y1.data(), n);
  be.binary(t, BinaryOp::Mul, x2.data(), cg.data(), y2.data(), n);
  be.binary(t, BinaryOp::Mul, x2.data(), sg.data(), x2.data(), n);
  be.binary(t, BinaryOp::Mul, x1.data(), sg.data(), x1.data(), n);
  be.binary(t, BinaryOp::Sub, y1.data(), x2.data(), y1.data(), n);
  be.binary(t, BinaryOp::Add, y2.data(), x1.data(), y2.data(), n);
  move.copy_block(y1.data(), StridedBlock::contiguous(0, n), x, StridedBlock{0, rows, d.head_dim, half}, sizeof(T));
  move.copy_block(y2.data(), StridedBlock::contiguous(0, n), x, StridedBlock{half, rows, d.head_dim, half}, sizeof(T));
}

#ifdef DTENSOR_KERNEL_INSTANCE  // compiled once in the compiled runtime (util/compiled_runtime.hpp)
#define DTENSOR_ROTARY_KERNELS(T) \
  DTENSOR_KERNEL_INSTANCE void rotary_embedding<T>(Device, const RotaryDims&, T*, bool);
DTENSOR_ROTARY_KERNELS(float)
DTENSOR_ROTARY_KERNELS(double)
#undef DTENSOR_ROTARY_KERNELS
#endif
}  // namespace dtensor::compute
