#pragma once
// Counter-based random numbers: element i of a tensor filled with `seed` depends on
// (seed, i) alone, so every rank fills its block exactly as one rank fills the whole,
// and a GPU fills it as the host does. The same functions run on the host and in the
// device kernels (kernels/random.cuh): host-and-device functions under nvcc, plain
// inline functions elsewhere.
//
// Uniform values are integer hashing and one exact scaling: the same bits everywhere.
// Normal values (Box-Muller) take a log, a cosine and a square root: the host's libm
// and the host launcher agree bit for bit; CUDA's double log and cos are within 1 and
// 2 units in the last place of the correctly rounded value (CUDA Math API), so a GPU's
// normal values may differ from the host's in the last bit of a double (a float,
// rounded from that double, almost never).
#include <cmath>
#include <cstdint>

#include "dtensor/util/host_device.hpp"

namespace dtensor::detail {

DTENSOR_HOST_DEVICE constexpr uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
DTENSOR_HOST_DEVICE inline double uniform01(uint64_t seed, uint64_t i, uint64_t stream = 0) {
  return static_cast<double>(mix64(mix64(seed ^ (stream * 0xD1B54A32D192ED03ull)) + i) >> 11) * 0x1.0p-53;
}
template <class T>
DTENSOR_HOST_DEVICE T uniform_value(uint64_t seed, uint64_t i) {
  return static_cast<T>(uniform01(seed, i));
}
// A weight's initial value: uniform in [-bound, bound), element i drawn from (seed, i)
// alone. One type for every layer's draw (nn::Linear, Conv, attention...), so the fill
// of a block is compiled once per element type and rank, not once per layer class, as
// each layer's own lambda was. Host code: the factories fill such blocks on the host.
template <class T>
struct UniformDraw {
  uint64_t seed;
  T bound;
  T operator()(uint64_t i) const { return static_cast<T>((2 * uniform01(seed, i) - 1) * bound); }
};
template <class T>
DTENSOR_HOST_DEVICE T normal_value(uint64_t seed, uint64_t i) {
  const double u1 = 1.0 - uniform01(seed, i, 1), u2 = uniform01(seed, i, 2);  // u1 in (0, 1]
  return static_cast<T>(::sqrt(-2.0 * ::log(u1)) * ::cos(2.0 * 3.14159265358979323846 * u2));
}

}  // namespace dtensor::detail

namespace dtensor {

// The counter-based generator behind rand, randn and dropout, for a program's own
// fills (from_function): value i of the stream `seed` depends on (seed, i) alone, so
// any rank computes any element without drawing the ones before it. Uniform in
// [0, 1); standard normal (Box-Muller); hash64, the 64-bit mixer under both.
template <class T>
DTENSOR_HOST_DEVICE T uniform_at(uint64_t seed, uint64_t i) {
  return detail::uniform_value<T>(seed, i);
}
template <class T>
DTENSOR_HOST_DEVICE T normal_at(uint64_t seed, uint64_t i) {
  return detail::normal_value<T>(seed, i);
}
DTENSOR_HOST_DEVICE constexpr uint64_t hash64(uint64_t x) { return detail::mix64(x); }

// What a counter fill draws for global element i: a uniform [0, 1) or standard normal
// value (rand, randn), or dropout's kept-and-scaled mask (`scale` where the uniform
// draw of `stream` is at least p, else 0; nn/dropout.hpp).
struct CounterDraw {
  enum class Kind : std::uint8_t { Uniform, Normal, Keep };
  Kind kind = Kind::Uniform;
  uint64_t seed = 0;
  uint64_t stream = 0;  // Keep only (Uniform is stream 0, Normal takes streams 1 and 2)
  double p = 0, scale = 1;
};

template <class T>
DTENSOR_HOST_DEVICE T counter_value(const CounterDraw& d, uint64_t i) {
  switch (d.kind) {
    case CounterDraw::Kind::Normal: return detail::normal_value<T>(d.seed, i);
    case CounterDraw::Kind::Keep: return detail::uniform01(d.seed, i, d.stream) >= d.p ? static_cast<T>(d.scale) : T(0);
    default: return detail::uniform_value<T>(d.seed, i);
  }
}

// Where a rank's block sits in the global tensor, for a counter fill on a device:
// element e of the block (row-major over `extent`) is global element
// sum_d (offset[d] + index_d(e)) global_stride[d]. Up to kMaxRank dims.
struct CounterBox {
  static constexpr int kMaxRank = 8;
  int rank = 0;
  int64_t extent[kMaxRank] = {};
  int64_t offset[kMaxRank] = {};
  int64_t global_stride[kMaxRank] = {};

  DTENSOR_HOST_DEVICE int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= extent[d];
    return n;
  }
};

}  // namespace dtensor
