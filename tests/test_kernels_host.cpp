// The CUDA kernels of kernels/, built by the host compiler (kernels/portable.cuh) and
// run by the host launcher (host_launch/launcher.hpp), each against a plain host
// reference on awkward sizes (0, 1, 31, 33, 1023, 4097, strided and uneven blocks),
// with kernels.cu's launch configurations and with uneven ones (odd block sizes, grids
// smaller than the work, so that every grid-stride and block loop turns). Every case
// runs under both of the launcher's orders, so that a missing barrier gives a wrong
// result; every buffer is fenced by guards that ASan watches (scripts/test.sh runs this
// test under ASan) and that are checked in the other builds, so that an index out of
// range fails. No GPU is needed: this runs in every build.
#include <doctest/doctest.h>

#include <cmath>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention.cuh"
#include "block_copy.cuh"
#include "dtensor/core/block.hpp"
#include "elementwise.cuh"
#include "dtensor/compute/optimizer_update.hpp"
#include "host_launch/launcher.hpp"
#include "neighborhood_attention.cuh"
#include "dtensor/compute/neighborhood_attention.hpp"
#include "optimizer.cuh"
#include "random.cuh"
#include "reduce.cuh"
#include "row_stats.cuh"
#include "rows.cuh"
#include "softmax.cuh"
#include "spectral_mix.cuh"
#include "stencil.cuh"
#include "dtensor/compute/stencil_loops.hpp"
#include "dtensor/compute/fft_dims.hpp"

namespace {

namespace kd = dtensor::cuda::kernels::detail;
namespace hl = dtensor::test::host_launch;
using dtensor::StridedBlock;
using dtensor::RowTerms;
using dtensor::DType;
using hl::Dim3;
using hl::Order;
using kd::blockDim;
using kd::blockIdx;
using kd::gridDim;
using kd::threadIdx;
using Binary = dtensor::BinaryOp;
using Unary = dtensor::UnaryFn;
using Reduce = dtensor::ReduceOp;

constexpr int64_t kSizes[] = {0, 1, 31, 33, 1023, 4097};
constexpr Order kOrders[] = {Order::Forward, Order::Reverse};

template <class... T, class F>
void for_types(F&& f) {
  (f.template operator()<T>(), ...);
}

// Strings for INFO, which shows a const char* as a pointer.
std::string name(Order o) { return o == Order::Forward ? "forward" : "reverse"; }
template <class T>
std::string type_name() {
  return dtensor::name(dtensor::dtype_of<T>());
}

// --- buffers ---

// An array with guards on both sides: ASan reports any access to them, and guards_intact
// catches a write to them in a build without ASan.
template <class T>
class Buffer {
 public:
  static constexpr std::size_t kPad = 64;  // bytes, a multiple of every element's alignment
  static constexpr unsigned char kGuardByte = 0xeb;

  explicit Buffer(std::size_t n) : n_(n), raw_(new std::byte[n * sizeof(T) + 2 * kPad]) {
    std::memset(raw_, kGuardByte, n * sizeof(T) + 2 * kPad);
#ifdef DTENSOR_HOST_LAUNCH_ASAN
    ASAN_POISON_MEMORY_REGION(raw_, kPad);
    ASAN_POISON_MEMORY_REGION(raw_ + kPad + n * sizeof(T), kPad);
#endif
  }
  explicit Buffer(const std::vector<T>& v) : Buffer(v.size()) {
    if (!v.empty()) std::memcpy(data(), v.data(), v.size() * sizeof(T));
  }
  ~Buffer() {
#ifdef DTENSOR_HOST_LAUNCH_ASAN
    ASAN_UNPOISON_MEMORY_REGION(raw_, n_ * sizeof(T) + 2 * kPad);
#endif
    delete[] raw_;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  T* data() { return reinterpret_cast<T*>(raw_ + kPad); }
  std::vector<T> values() const {
    std::vector<T> v(n_);
    if (n_ != 0) std::memcpy(v.data(), raw_ + kPad, n_ * sizeof(T));
    return v;
  }
  bool guards_intact() const {
#ifdef DTENSOR_HOST_LAUNCH_ASAN
    return true;  // ASan has reported any access already
#else
    for (std::size_t i = 0; i < kPad; ++i)
      if (raw_[i] != std::byte{kGuardByte} || raw_[kPad + n_ * sizeof(T) + i] != std::byte{kGuardByte}) return false;
    return true;
#endif
  }

 private:
  std::size_t n_;
  std::byte* raw_;
};

template <class T>
std::vector<T> random_values(std::size_t n, double lo, double hi, unsigned seed) {
  if constexpr (std::is_unsigned_v<T>) lo = std::max(lo, 0.0);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// --- comparisons ---

template <class T>
std::string show(T v) {
  std::ostringstream s;
  s.precision(17);
  if constexpr (sizeof(T) == 1) s << static_cast<int>(v);
  else s << v;
  return s.str();
}

// Equal bit for bit, but any NaN equals any NaN.
template <class T>
bool same(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    return a == b && std::signbit(a) == std::signbit(b);
  } else {
    return a == b;
  }
}

// Within rel * max(1, |want|), NaN with NaN, infinities exactly; integers exactly.
template <class T>
bool close(T got, T want, double rel) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(got) || std::isnan(want) || std::isinf(got) || std::isinf(want)) return same(got, want);
    return std::abs(static_cast<double>(got) - want) <= rel * std::max(1.0, std::abs(static_cast<double>(want)));
  } else {
    return got == want;
  }
}

// "" if every element matches, else the first that does not.
template <class T, class Eq>
std::string mismatch(const std::vector<T>& got, const std::vector<T>& want, Eq eq) {
  if (got.size() != want.size()) return "sizes " + std::to_string(got.size()) + " and " + std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!eq(got[i], want[i]))
      return "element " + std::to_string(i) + ": got " + show(got[i]) + ", want " + show(want[i]);
  return "";
}
template <class T>
std::string mismatch(const std::vector<T>& got, const std::vector<T>& want) {
  return mismatch(got, want, [](T a, T b) { return same(a, b); });
}

template <class T>
double tolerance() {
  return std::is_same_v<T, float> ? 2e-5 : 1e-12;
}

// --- launch configurations ---

struct Config {
  Dim3 grid, block;
};
std::string show(const Config& c) {
  return "<<<" + std::to_string(c.grid.x) + ", " + std::to_string(c.block.x) + ">>>";
}

// For a grid-stride kernel over n items: kernels.cu's, then uneven ones (all of them,
// or only the first, for the kernels tested on many layouts).
std::vector<Config> stride_configs(int64_t n, bool all = true) {
  std::vector<Config> c = {{Dim3{n > 0 ? kd::blocks_for(n) : 1u}, Dim3{kd::kThreads}},
                           {Dim3{3}, Dim3{33}},
                           {Dim3{1}, Dim3{1024}},
                           {Dim3{2}, Dim3{1}}};
  if (!all) c.resize(2);
  return c;
}

// Runs f(config) for each configuration under each order.
template <class F>
void each_launch(const std::vector<Config>& configs, F&& f) {
  for (Order o : kOrders) {
    hl::ScopedOrder scoped(o);
    for (const Config& c : configs) {
      INFO("launch ", show(c), ", ", name(o), " order");
      f(c);
    }
  }
}

// --- references ---

template <Binary Op, class T>
T ref_binary(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    // In a wider type, then converted back: modulo 2^bits, as the kernels wrap.
    using W = std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>;
    const W x = a, y = b;
    if constexpr (Op == Binary::Add) return static_cast<T>(x + y);
    else if constexpr (Op == Binary::Sub) return static_cast<T>(x - y);
    else if constexpr (Op == Binary::Mul) return static_cast<T>(x * y);
    else return static_cast<T>(x / y);
  } else {
    if constexpr (Op == Binary::Add) return a + b;
    else if constexpr (Op == Binary::Sub) return a - b;
    else if constexpr (Op == Binary::Mul) return a * b;
    else return a / b;
  }
}

template <Unary F, class T>
T ref_unary(T x) {
  if constexpr (F == Unary::Neg) {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(-static_cast<long long>(x));
    else return -x;
  } else if constexpr (F == Unary::Abs) {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(x < 0 ? -static_cast<long long>(x) : x);
    else return std::abs(x);
  } else if constexpr (F == Unary::Relu) {
    return x < T(0) ? T(0) : x;
  } else if constexpr (F == Unary::Exp) {
    return std::exp(x);
  } else if constexpr (F == Unary::Log) {
    return std::log(x);
  } else if constexpr (F == Unary::Sqrt) {
    return std::sqrt(x);
  } else if constexpr (F == Unary::Tanh) {
    return std::tanh(x);
  } else {
    return T(1) / (T(1) + std::exp(-x));
  }
}

// Values that test the edges of a type first, then random ones.
template <class T>
std::vector<T> edgy_values(std::size_t n, unsigned seed) {
  std::vector<T> v = random_values<T>(n, -100, 100, seed);
  using L = std::numeric_limits<T>;
  std::vector<T> edges = {L::lowest(), L::max(), T(0), T(1)};
  if constexpr (std::is_signed_v<T>) edges.push_back(T(-1));
  if constexpr (std::is_floating_point_v<T>)
    edges.insert(edges.end(), {L::quiet_NaN(), -T(0), L::infinity(), -L::infinity(), L::denorm_min(), T(-0.5)});
  for (std::size_t i = 0; i < std::min(n, edges.size()); ++i) v[i] = edges[i];
  return v;
}

// ======================================================================================
// The launcher itself: the execution model the kernels rely on.
// ======================================================================================

DTENSOR_KERNEL void indices_kernel(unsigned* out) {
  const unsigned block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const unsigned thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  unsigned* o = out + 4 * (block * threads + thread);
  o[0] += 1;  // each slot exactly once
  o[1] = blockIdx.x + 100 * blockIdx.y + 10000 * blockIdx.z;
  o[2] = threadIdx.x + 100 * threadIdx.y + 10000 * threadIdx.z;
  o[3] = gridDim.x + 10 * gridDim.y + 100 * gridDim.z + 1000 * blockDim.x + 100000 * blockDim.y + 10000000 * blockDim.z;
}

// Each thread gets its own copy of the arguments.
DTENSOR_KERNEL void params_kernel(int n, int* out) {
  n += static_cast<int>(threadIdx.x);
  out[threadIdx.x] = n;
}

// Reverses each block's slice through dynamic shared memory.
DTENSOR_KERNEL void reverse_kernel(const int* in, int* out) {
  DTENSOR_DYNAMIC_SHARED(int, s);
  const unsigned t = threadIdx.x, base = blockIdx.x * blockDim.x;
  s[t] = in[base + t];
  DTENSOR_SYNCTHREADS();
  out[base + t] = s[blockDim.x - 1 - t];
}

// A block sum with its first barrier missing: what the launcher must expose.
DTENSOR_KERNEL void racy_sum_kernel(const unsigned* in, unsigned* out) {
  DTENSOR_SHARED(unsigned, buf, [kd::kThreads]);
  const unsigned t = threadIdx.x;
  buf[t] = in[t];
  for (unsigned half = kd::kThreads / 2; half > 0; half /= 2) {
    if (t < half) buf[t] += buf[t + half];
    DTENSOR_SYNCTHREADS();
  }
  if (t == 0) *out = buf[0];
}

DTENSOR_KERNEL void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 5) DTENSOR_SYNCTHREADS();
  out[threadIdx.x] = 1;
}

DTENSOR_KERNEL void two_barriers_kernel(int* out) {
  if (threadIdx.x % 2 == 0) DTENSOR_SYNCTHREADS();
  else DTENSOR_SYNCTHREADS();
  out[threadIdx.x] = 1;
}

DTENSOR_KERNEL void big_shared_kernel(double* out) {
  DTENSOR_SHARED(double, big, [7000]);  // 56000 bytes: past the 48 KiB of a block
  big[threadIdx.x] = 1;
  out[threadIdx.x] = big[threadIdx.x];
}

#ifndef DTENSOR_HOST_LAUNCH_ASAN  // under ASan the overrun is reported, and the process ends
DTENSOR_KERNEL void shared_overrun_kernel(int* out) {
  DTENSOR_SHARED(int, small, [4]);
  small[threadIdx.x] = 1;  // launched with 5 threads
  out[threadIdx.x] = 1;
}
#endif

TEST_CASE("host launcher: indices of a 3-D grid of 3-D blocks") {
  const Dim3 grid{3, 2, 2}, block{5, 3, 2};
  const unsigned blocks = 12, threads = 30;
  for (Order o : kOrders) {
    hl::ScopedOrder scoped(o);
    Buffer<unsigned> out(std::vector<unsigned>(4 * blocks * threads, 0));
    hl::launch(grid, block, 0, indices_kernel, out.data());
    const std::vector<unsigned> v = out.values();
    bool ok = true;
    for (unsigned b = 0; b < blocks; ++b)
      for (unsigned t = 0; t < threads; ++t) {
        const unsigned* s = &v[4 * (b * threads + t)];
        const unsigned bx = b % 3, by = b / 3 % 2, bz = b / 6, tx = t % 5, ty = t / 5 % 3, tz = t / 15;
        ok = ok && s[0] == 1 && s[1] == bx + 100 * by + 10000 * bz && s[2] == tx + 100 * ty + 10000 * tz &&
             s[3] == 3 + 20 + 200 + 5000 + 300000 + 20000000;
      }
    CHECK(ok);
    CHECK(out.guards_intact());
  }
}

TEST_CASE("host launcher: arguments, dynamic shared memory") {
  Buffer<int> out(std::vector<int>(64, 0));
  hl::launch(Dim3{1}, Dim3{64}, 0, params_kernel, 7, out.data());
  std::vector<int> want(64);
  for (int t = 0; t < 64; ++t) want[t] = 7 + t;
  CHECK(mismatch(out.values(), want) == "");

  for (Order o : kOrders) {
    hl::ScopedOrder scoped(o);
    std::vector<int> in(3 * 97);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>(i);
    Buffer<int> a(in), b(std::vector<int>(in.size(), -1));
    hl::launch(Dim3{3}, Dim3{97}, 97 * sizeof(int), reverse_kernel, a.data(), b.data());
    std::vector<int> reversed(in.size());
    for (int blk = 0; blk < 3; ++blk)
      for (int t = 0; t < 97; ++t) reversed[blk * 97 + t] = blk * 97 + 96 - t;
    CHECK(mismatch(b.values(), reversed) == "");
    CHECK(b.guards_intact());
  }
}

TEST_CASE("host launcher: a missing barrier gives a wrong result in one of the orders") {
  std::vector<unsigned> in(kd::kThreads);
  for (unsigned i = 0; i < kd::kThreads; ++i) in[i] = i + 1;
  const unsigned want = kd::kThreads * (kd::kThreads + 1) / 2;
  bool wrong = false;
  for (Order o : kOrders) {
    hl::ScopedOrder scoped(o);
    Buffer<unsigned> a(in), out(std::vector<unsigned>(1, 0));
    hl::launch(Dim3{1}, Dim3{kd::kThreads}, 0, racy_sum_kernel, a.data(), out.data());
    wrong = wrong || out.values()[0] != want;
  }
  CHECK(wrong);
}

TEST_CASE("host launcher: what a GPU rejects or leaves undefined fails the launch") {
  Buffer<int> out(std::vector<int>(1024, 0));
  Buffer<double> dout(std::vector<double>(64, 0));
  CHECK_THROWS_WITH_AS(hl::launch(Dim3{1}, Dim3{64}, 0, divergent_barrier_kernel, out.data()),
                       doctest::Contains("5 of the block's 64 threads wait at the barrier"), hl::LaunchError);
  CHECK_THROWS_WITH_AS(hl::launch(Dim3{2}, Dim3{64}, 0, two_barriers_kernel, out.data()),
                       doctest::Contains("wait at different barriers"), hl::LaunchError);
  CHECK_THROWS_WITH_AS(hl::launch(Dim3{1}, Dim3{64}, 0, big_shared_kernel, dout.data()),
                       doctest::Contains("bytes of shared memory in a block"), hl::LaunchError);
  CHECK_THROWS_AS(hl::launch(Dim3{1}, Dim3{1025}, 0, params_kernel, 0, out.data()), hl::LaunchError);
  CHECK_THROWS_AS(hl::launch(Dim3{1}, Dim3{32, 32, 2}, 0, params_kernel, 0, out.data()), hl::LaunchError);
  CHECK_THROWS_AS(hl::launch(Dim3{0}, Dim3{1}, 0, params_kernel, 0, out.data()), hl::LaunchError);
  CHECK_THROWS_AS(hl::launch(Dim3{1, 1, 65536}, Dim3{1}, 0, params_kernel, 0, out.data()), hl::LaunchError);
  CHECK_THROWS_AS(hl::launch(Dim3{1}, Dim3{1}, 49153, reverse_kernel, out.data(), out.data()), hl::LaunchError);
#ifndef DTENSOR_HOST_LAUNCH_ASAN
  CHECK_THROWS_WITH_AS(hl::launch(Dim3{1}, Dim3{5}, 0, shared_overrun_kernel, out.data()),
                       doctest::Contains("wrote past __shared__ small"), hl::LaunchError);
#endif
  // The launcher recovers from a launch abandoned mid-block.
  hl::launch(Dim3{1}, Dim3{64}, 0, params_kernel, 1, out.data());
  CHECK(out.values()[63] == 64);
  CHECK(out.guards_intact());
  CHECK(dout.guards_intact());
}

// ======================================================================================
// The kernels.
// ======================================================================================

TEST_CASE("kernels on the host: fill") {
  for_types<float, double, int8_t, uint8_t, int32_t, int64_t>([]<class T>() {
    for (int64_t n : kSizes) {
      INFO("n = ", n, ", ", type_name<T>());
      const T v = std::is_signed_v<T> ? T(-3) : T(7);
      each_launch(stride_configs(n), [&](const Config& c) {
        Buffer<T> out(std::vector<T>(static_cast<std::size_t>(n), T(1)));
        hl::launch(c.grid, c.block, 0, kd::fill_kernel<T>, out.data(), v, n);
        CHECK(mismatch(out.values(), std::vector<T>(static_cast<std::size_t>(n), v)) == "");
        CHECK(out.guards_intact());
      });
    }
  });
}

template <class T, Binary Op>
void check_binary(int64_t n) {
  const auto size = static_cast<std::size_t>(n);
  const std::vector<T> a = random_values<T>(size, -100, 100, 1);
  std::vector<T> b = random_values<T>(size, -100, 100, 2);
  if constexpr (Op == Binary::Div && std::is_integral_v<T>)
    for (auto& x : b) x = x == T(0) ? T(3) : x;
  const T s = Op == Binary::Div ? T(7) : T(-9);
  std::vector<T> want(size), want_s(size);
  for (std::size_t i = 0; i < size; ++i) want[i] = ref_binary<Op>(a[i], b[i]), want_s[i] = ref_binary<Op>(a[i], s);
  each_launch(stride_configs(n), [&](const Config& c) {
    Buffer<T> x(a), y(b), out(size);
    hl::launch(c.grid, c.block, 0, kd::binary_kernel<T, Op>, x.data(), y.data(), out.data(), n);
    CHECK(mismatch(out.values(), want) == "");
    hl::launch(c.grid, c.block, 0, kd::binary_scalar_kernel<T, Op>, x.data(), s, out.data(), n);
    CHECK(mismatch(out.values(), want_s) == "");
    hl::launch(c.grid, c.block, 0, kd::binary_kernel<T, Op>, x.data(), y.data(), x.data(), n);  // out aliases a
    CHECK(mismatch(x.values(), want) == "");
    CHECK((x.guards_intact() && y.guards_intact() && out.guards_intact()));
  });
}

TEST_CASE("kernels on the host: binary and binary_scalar") {
  for_types<float, double, int8_t, uint8_t, int32_t>([]<class T>() {
    for (int64_t n : kSizes) {
      INFO("n = ", n, ", ", type_name<T>());
      check_binary<T, Binary::Add>(n);
      check_binary<T, Binary::Sub>(n);
      check_binary<T, Binary::Mul>(n);
      check_binary<T, Binary::Div>(n);
    }
  });
}

template <class T, Unary F>
void check_unary(int64_t n) {
  INFO("unary function ", static_cast<int>(F));
  const auto size = static_cast<std::size_t>(n);
  const std::vector<T> a = edgy_values<T>(size, 3);
  std::vector<T> want(size);
  for (std::size_t i = 0; i < size; ++i) want[i] = ref_unary<F>(a[i]);
  each_launch(stride_configs(n), [&](const Config& c) {
    Buffer<T> x(a), out(size);
    hl::launch(c.grid, c.block, 0, kd::unary_kernel<T, F>, x.data(), out.data(), n);
    CHECK(mismatch(out.values(), want) == "");
    CHECK((x.guards_intact() && out.guards_intact()));
  });
}

TEST_CASE("kernels on the host: unary") {
  for_types<float, double, int8_t, uint8_t, int32_t>([]<class T>() {
    for (int64_t n : kSizes) {
      INFO("n = ", n, ", ", type_name<T>());
      check_unary<T, Unary::Neg>(n);
      check_unary<T, Unary::Abs>(n);
      check_unary<T, Unary::Relu>(n);
      if constexpr (std::is_floating_point_v<T>) {
        check_unary<T, Unary::Exp>(n);
        check_unary<T, Unary::Log>(n);
        check_unary<T, Unary::Sqrt>(n);
        check_unary<T, Unary::Tanh>(n);
        check_unary<T, Unary::Sigmoid>(n);
      }
    }
  });
}

// The activations added with the layers, and every derivative: against closed forms
// written here in double (not the library's table), within rounding, on edge values
// (NaN, infinities, the largest magnitudes) and random ones.
double ref_value(Unary f, double x) {
  switch (f) {
    case Unary::Gelu: return x * 0.5 * std::erfc(-x / std::sqrt(2.0));
    case Unary::GeluTanh: return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case Unary::Silu: return x / (1 + std::exp(-x));
    default: return 0;
  }
}
double ref_derivative(Unary f, double x) {
  const double c = std::cosh(x), e = std::exp(-x);
  switch (f) {
    case Unary::Neg: return -1;
    case Unary::Exp: return std::exp(x);
    case Unary::Log: return 1 / x;
    case Unary::Sqrt: return 1 / (2 * std::sqrt(x));
    case Unary::Abs: return x > 0 ? 1 : x < 0 ? -1 : 0;
    case Unary::Relu: return x > 0 ? 1 : 0;
    case Unary::Tanh: return 1 / (c * c);
    case Unary::Sigmoid: return e / ((1 + e) * (1 + e));
    case Unary::Gelu: return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-x * x / 2) / std::sqrt(2 * M_PI);
    case Unary::GeluTanh: {
      const double k = std::sqrt(2 / M_PI), u = k * (x + 0.044715 * x * x * x), cu = std::cosh(u);
      return 0.5 * (1 + std::tanh(u)) + 0.5 * x * k * (1 + 3 * 0.044715 * x * x) / (cu * cu);
    }
    case Unary::Silu: return (1 + e + x * e) / ((1 + e) * (1 + e));
  }
  return 0;
}

template <class T, Unary F>
void check_activation(int64_t n) {
  INFO("activation ", dtensor::name(F));
  const auto size = static_cast<std::size_t>(n);
  const std::vector<T> a = edgy_values<T>(size, 5);
  std::vector<T> want(size);
  for (std::size_t i = 0; i < size; ++i) want[i] = static_cast<T>(ref_value(F, static_cast<double>(a[i])));
  const auto eq = [](T got, T w) { return close(got, w, 4 * tolerance<T>()); };
  each_launch(stride_configs(n), [&](const Config& c) {
    Buffer<T> x(a), out(size);
    hl::launch(c.grid, c.block, 0, kd::unary_kernel<T, F>, x.data(), out.data(), n);
    CHECK(mismatch(out.values(), want, eq) == "");
    CHECK((x.guards_intact() && out.guards_intact()));
  });
}

template <class T, Unary F>
void check_unary_backward(int64_t n) {
  INFO("derivative of ", dtensor::name(F));
  const auto size = static_cast<std::size_t>(n);
  const bool positive = F == Unary::Log || F == Unary::Sqrt;
  const std::vector<T> a = random_values<T>(size, positive ? 0.05 : -6, 6, 8);
  const std::vector<T> g = random_values<T>(size, -2, 2, 9);
  std::vector<T> want(size);
  for (std::size_t i = 0; i < size; ++i)
    want[i] = static_cast<T>(ref_derivative(F, static_cast<double>(a[i])) * static_cast<double>(g[i]));
  // A derivative's rounding scales with the terms it adds (1/x near 0.05 reaches 20).
  const auto eq = [](T got, T w) { return close(got, w, 8 * tolerance<T>()); };
  each_launch(stride_configs(n, false), [&](const Config& c) {
    Buffer<T> x(a), dy(g), dx(size);
    hl::launch(c.grid, c.block, 0, kd::unary_backward_kernel<T, F>, x.data(), dy.data(), dx.data(), n);
    CHECK(mismatch(dx.values(), want, eq) == "");
    hl::launch(c.grid, c.block, 0, kd::unary_backward_kernel<T, F>, x.data(), dy.data(), dy.data(), n);  // in place
    CHECK(mismatch(dy.values(), dx.values()) == "");
    CHECK((x.guards_intact() && dy.guards_intact() && dx.guards_intact()));
  });
}

TEST_CASE("kernels on the host: gelu (exact and tanh), silu, and every derivative") {
  for_types<float, double>([]<class T>() {
    for (int64_t n : kSizes) {
      INFO("n = ", n, ", ", type_name<T>());
      check_activation<T, Unary::Gelu>(n);
      check_activation<T, Unary::GeluTanh>(n);
      check_activation<T, Unary::Silu>(n);
      [&]<int... I>(std::integer_sequence<int, I...>) {
        (check_unary_backward<T, static_cast<Unary>(I)>(n), ...);
      }(std::make_integer_sequence<int, dtensor::kUnaryFunctions>{});
    }
  });
}

// --- rows picked by index ---

// Indices of a table's rows [lo, lo + rows): inside, duplicated, outside on both sides
// (another rank's rows) and negative (an ignored target).
std::vector<int64_t> mixed_indices(std::size_t n, int64_t lo, int64_t extent, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(lo - 3, lo + extent + 2);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = dist(gen);
  if (n > 2) v[0] = -100, v[1] = lo, v[2] = lo;
  return v;
}

template <class T>
void check_rows(int64_t rows, int64_t table_rows, int64_t cols) {
  INFO("rows ", rows, ", table rows ", table_rows, ", cols ", cols, ", ", type_name<T>());
  const int64_t lo = 5;
  const auto idx = mixed_indices(static_cast<std::size_t>(rows), lo, table_rows, 21);
  const auto table = random_values<T>(static_cast<std::size_t>(table_rows * cols), -9, 9, 22);
  const auto dy = random_values<T>(static_cast<std::size_t>(rows * cols), -9, 9, 23);
  std::vector<T> gathered(static_cast<std::size_t>(rows * cols)), grad(table.size(), T(1));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const bool in = idx[i] >= lo && idx[i] < lo + table_rows;
      gathered[i * cols + j] = in ? table[(idx[i] - lo) * cols + j] : T(0);
      if (in)
        grad[(idx[i] - lo) * cols + j] = ref_binary<Binary::Add>(grad[(idx[i] - lo) * cols + j], dy[i * cols + j]);
    }
  const int64_t n = rows * cols;
  each_launch(stride_configs(n, false), [&](const Config& c) {
    Buffer<int64_t> ix(idx);
    Buffer<T> t(table), out(static_cast<std::size_t>(n));
    hl::launch(c.grid, c.block, 0, kd::gather_rows_kernel<T>, t.data(), table_rows, cols,
               static_cast<const int64_t*>(ix.data()), lo, out.data(), n);
    CHECK(mismatch(out.values(), gathered) == "");
    CHECK((ix.guards_intact() && t.guards_intact() && out.guards_intact()));
  });
  if (table_rows == 0 || cols == 0) return;  // the launcher returns before scatter_add_rows
  // The launcher's chunking, and chunks of one row and of the whole table. The sum
  // runs over i in order in every case: bit for bit the host's.
  for (int64_t chunk : {kd::scatter_chunk(table_rows, cols), int64_t{1}, table_rows}) {
    const int64_t items = (table_rows + chunk - 1) / chunk * cols;
    INFO("chunk ", chunk);
    each_launch(stride_configs(items, false), [&](const Config& c) {
      Buffer<int64_t> ix(idx);
      Buffer<T> g(dy), tg(std::vector<T>(table.size(), T(1)));
      hl::launch(c.grid, c.block, 0, kd::scatter_add_rows_kernel<T>, static_cast<const T*>(g.data()),
                 static_cast<const int64_t*>(ix.data()), rows, cols, lo, tg.data(), table_rows, chunk, items);
      CHECK(mismatch(tg.values(), grad) == "");
      CHECK((ix.guards_intact() && g.guards_intact() && tg.guards_intact()));
    });
  }
}

template <class T>
void check_along_last(int64_t rows, int64_t cols) {
  INFO("rows ", rows, ", cols ", cols, ", ", type_name<T>());
  const int64_t lo = 7;
  const auto target = mixed_indices(static_cast<std::size_t>(rows), lo, cols, 31);
  const auto x = random_values<T>(static_cast<std::size_t>(rows * cols), -9, 9, 32);
  const auto gv = random_values<T>(static_cast<std::size_t>(rows), -9, 9, 33);
  std::vector<T> picked(static_cast<std::size_t>(rows)), added = x;
  for (int64_t i = 0; i < rows; ++i) {
    const bool in = target[i] >= lo && target[i] < lo + cols;
    picked[i] = in ? x[i * cols + target[i] - lo] : T(0);
    if (in) added[i * cols + target[i] - lo] = ref_binary<Binary::Add>(added[i * cols + target[i] - lo], gv[i]);
  }
  each_launch(stride_configs(rows, false), [&](const Config& c) {
    Buffer<int64_t> t(target);
    Buffer<T> xb(x), out(static_cast<std::size_t>(rows)), g(gv);
    hl::launch(c.grid, c.block, 0, kd::take_along_last_kernel<T>, static_cast<const T*>(xb.data()), rows, cols,
               static_cast<const int64_t*>(t.data()), lo, out.data());
    CHECK(mismatch(out.values(), picked) == "");
    hl::launch(c.grid, c.block, 0, kd::add_along_last_kernel<T>, static_cast<const T*>(g.data()),
               static_cast<const int64_t*>(t.data()), lo, xb.data(), rows, cols);
    CHECK(mismatch(xb.values(), added) == "");
    CHECK((t.guards_intact() && xb.guards_intact() && out.guards_intact() && g.guards_intact()));
  });
}

TEST_CASE("kernels on the host: gather_rows, scatter_add_rows, take_along_last, add_along_last") {
  for_types<float, double, int32_t>([]<class T>() {
    for (int64_t rows : {0, 1, 33, 300})
      for (int64_t table_rows : {0, 1, 7, 40})
        for (int64_t cols : {0, 1, 3, 33}) check_rows<T>(rows, table_rows, cols);
    for (int64_t rows : {0, 1, 33, 1023})
      for (int64_t cols : {0, 1, 5, 33}) check_along_last<T>(rows, cols);
  });
}

TEST_CASE("kernels on the host: add_bias") {
  const std::pair<int64_t, int64_t> shapes[] = {{0, 7},   {7, 0},    {1, 1},    {31, 33},
                                                {33, 31}, {1, 4097}, {4097, 1}, {3, 1023}};
  for_types<float, int8_t, int32_t>([&]<class T>() {
    for (const auto& shape : shapes) {
      const int64_t rows = shape.first, cols = shape.second;  // not a structured binding: lambdas capture them
      for (bool along_rows : {true, false}) {
        INFO(rows, " x ", cols, std::string(along_rows ? ", along rows, " : ", along columns, "), type_name<T>());
        const int64_t n = rows * cols;
        const auto size = static_cast<std::size_t>(n);
        const std::vector<T> m = random_values<T>(size, -100, 100, 4);
        const std::vector<T> v = random_values<T>(static_cast<std::size_t>(along_rows ? cols : rows), -100, 100, 5);
        std::vector<T> want(size);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c)
            want[r * cols + c] = ref_binary<Binary::Add>(m[r * cols + c], v[along_rows ? c : r]);
        each_launch(stride_configs(n), [&](const Config& c) {
          Buffer<T> x(m), b(v), out(size);
          if (along_rows) {
            hl::launch(c.grid, c.block, 0, kd::add_bias_kernel<T, true>, x.data(), b.data(), out.data(), cols, n);
            hl::launch(c.grid, c.block, 0, kd::add_bias_kernel<T, true>, x.data(), b.data(), x.data(), cols, n);
          } else {
            hl::launch(c.grid, c.block, 0, kd::add_bias_kernel<T, false>, x.data(), b.data(), out.data(), cols, n);
            hl::launch(c.grid, c.block, 0, kd::add_bias_kernel<T, false>, x.data(), b.data(), x.data(), cols, n);
          }
          CHECK(mismatch(out.values(), want) == "");
          CHECK(mismatch(x.values(), want) == "");  // in place
          CHECK((x.guards_intact() && b.guards_intact() && out.guards_intact()));
        });
      }
    }
  });
}

TEST_CASE("kernels on the host: transpose") {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},   {1, 33},  {33, 1},   {31, 33},  {33, 31},
                                                {32, 32}, {64, 96}, {1023, 5}, {5, 1023}, {4097, 3}};
  for_types<uint8_t, uint16_t, uint32_t, uint64_t>([&]<class W>() {
    for (const auto& shape : shapes) {
      const int64_t rows = shape.first, cols = shape.second;
      INFO(rows, " x ", cols, ", ", sizeof(W), "-byte words");
      const auto size = static_cast<std::size_t>(rows * cols);
      const std::vector<W> in = random_values<W>(size, 0, 250, 6);
      std::vector<W> want(size);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) want[c * rows + r] = in[r * cols + c];
      const int64_t tiles_c = (cols + kd::kTile - 1) / kd::kTile;
      const int64_t tiles = (rows + kd::kTile - 1) / kd::kTile * tiles_c;
      const Dim3 block{kd::kTile, kd::kTileRows};
      // kernels.cu's grid, and grids smaller than the tiles, so that blocks loop over them.
      const std::vector<Config> configs = {{Dim3{static_cast<unsigned>(std::min(tiles, kd::kMaxBlocks))}, block},
                                           {Dim3{3}, block},
                                           {Dim3{1}, block}};
      each_launch(configs, [&](const Config& c) {
        Buffer<W> x(in), out(size);
        hl::launch(c.grid, c.block, 0, kd::transpose_kernel<W>, x.data(), out.data(), rows, cols, tiles_c, tiles);
        CHECK(mismatch(out.values(), want) == "");
        CHECK((x.guards_intact() && out.guards_intact()));
      });
    }
  });
}

// --- blocks: copies, reductions and divisions between strided blocks ---

// Blocks of n elements: contiguous, and strided with every few ways of cutting n into
// runs (uneven run counts and lengths), with gaps between the runs or none.
std::vector<StridedBlock> layouts(int64_t n) {
  std::vector<StridedBlock> out = {StridedBlock::contiguous(3, n)};
  if (n == 0) {
    out.push_back(StridedBlock{2, 3, 5, 0});
    out.push_back(StridedBlock{1, 0, 4, 7});
    return out;
  }
  std::vector<int64_t> lens;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) lens.push_back(d);
  if (lens.size() > 4) lens = {lens[0], lens[1], lens[lens.size() - 2], lens.back()};
  int64_t gap = 0;
  for (int64_t len : lens) {
    out.push_back(StridedBlock{gap + 1, n / len, len + gap, len});
    gap = gap == 0 ? 3 : gap == 3 ? 1 : 0;
  }
  return out;
}
int64_t extent(const StridedBlock& b) {  // the elements a buffer needs to hold the block
  return b.numel() == 0 ? b.offset : b.offset + (b.count - 1) * b.stride + b.len;
}
std::string show(const StridedBlock& b) {
  return "{offset " + std::to_string(b.offset) + ", " + std::to_string(b.count) + " runs of " +
         std::to_string(b.len) + ", stride " + std::to_string(b.stride) + "}";
}

// (source, destination) pairs of n elements: each layout with the next.
std::vector<std::pair<StridedBlock, StridedBlock>> block_pairs(int64_t n) {
  const std::vector<StridedBlock> l = layouts(n);
  std::vector<std::pair<StridedBlock, StridedBlock>> out;
  for (std::size_t i = 0; i < l.size(); ++i) out.emplace_back(l[i], l[(i + 1) % l.size()]);
  out.emplace_back(l.back(), l.back());
  return out;
}

template <class W>
void launch_copy(const Config& c, const std::byte* src, const kd::WordCopy& w, std::byte* dst) {
  hl::launch(c.grid, c.block, 0, kd::copy_runs<W>, reinterpret_cast<const W*>(src), w.src, reinterpret_cast<W*>(dst),
             w.dst, w.words);
}

TEST_CASE("kernels on the host: copy_runs between strided blocks (word_copy's plan)") {
  for (int64_t n : kSizes) {
    for (const auto& pair : block_pairs(n)) {
      const StridedBlock sb = pair.first, db = pair.second;
      for (int64_t size : {1, 2, 4, 8, 12}) {
        for (int64_t shift : {0, 1}) {  // a base address aligned to the element only
          INFO("n = ", n, ", ", show(sb), " -> ", show(db), ", ", size, "-byte elements, base + ", shift);
          const auto src_bytes = static_cast<std::size_t>((extent(sb) + shift) * size);
          const auto dst_bytes = static_cast<std::size_t>((extent(db) + shift) * size);
          const std::vector<uint8_t> s = random_values<uint8_t>(src_bytes, 0, 255, 7);
          const std::vector<uint8_t> d = random_values<uint8_t>(dst_bytes, 0, 255, 8);
          std::vector<uint8_t> want = d;
          dtensor::detail::copy_block(s.data() + shift * size, sb, want.data() + shift * size, db,
                                      static_cast<std::size_t>(size));
          Buffer<uint8_t> x(s);
          const std::byte* src = reinterpret_cast<const std::byte*>(x.data()) + shift * size;
          const kd::WordCopy w = kd::word_copy(src, sb, src, db, size);  // dst is aligned like src
          CHECK(w.words * w.width == n * size);
          each_launch(stride_configs(w.words, false), [&](const Config& c) {
            Buffer<uint8_t> y(d);
            std::byte* dst = reinterpret_cast<std::byte*>(y.data()) + shift * size;
            REQUIRE(kd::word_copy(src, sb, dst, db, size).width == w.width);
            switch (w.width) {
              case 1: launch_copy<uint8_t>(c, src, w, dst); break;
              case 2: launch_copy<uint16_t>(c, src, w, dst); break;
              case 4: launch_copy<uint32_t>(c, src, w, dst); break;
              default: launch_copy<uint64_t>(c, src, w, dst); break;
            }
            CHECK(mismatch(y.values(), want) == "");
            CHECK((x.guards_intact() && y.guards_intact()));
          });
        }
      }
    }
  }
}

template <class T, dtensor::ReduceOp Op>
void check_reduce_runs(int64_t n, const StridedBlock& sb, const StridedBlock& db) {
  INFO("op ", std::string(dtensor::name(Op)));
  const std::vector<T> s = random_values<T>(static_cast<std::size_t>(extent(sb)), -50, 50, 9);
  const std::vector<T> d = random_values<T>(static_cast<std::size_t>(extent(db)), -50, 50, 10);
  std::vector<T> want = d;
  dtensor::detail::reduce_block(dtensor::dtype_of<T>(), Op, s.data(), sb, want.data(), db);
  const kd::Runs rs = kd::runs_of(sb), rd = kd::runs_of(db);
  const bool contiguous = sb.is_contiguous() && db.is_contiguous();  // kernels.cu's choice
  each_launch(stride_configs(n, false), [&](const Config& c) {
    for (bool strided : {false, true}) {
      if (!strided && !contiguous) continue;
      Buffer<T> x(s), y(d);
      if (strided)
        hl::launch(c.grid, c.block, 0, kd::reduce_runs<T, Op, kd::Layout::Strided>, x.data(), rs, y.data(), rd, n);
      else
        hl::launch(c.grid, c.block, 0, kd::reduce_runs<T, Op, kd::Layout::Contiguous>, x.data(), rs, y.data(), rd, n);
      CHECK(mismatch(y.values(), want) == "");
      CHECK((x.guards_intact() && y.guards_intact()));
    }
  });
}

TEST_CASE("kernels on the host: reduce_runs and divide_runs between strided blocks") {
  for_types<float, double, uint8_t, int32_t>([]<class T>() {
    for (int64_t n : kSizes) {
      for (const auto& pair : block_pairs(n)) {
        const StridedBlock sb = pair.first, db = pair.second;
        INFO("n = ", n, ", ", show(sb), " -> ", show(db), ", ", type_name<T>());
        check_reduce_runs<T, dtensor::ReduceOp::Sum>(n, sb, db);
        check_reduce_runs<T, dtensor::ReduceOp::Max>(n, sb, db);
        check_reduce_runs<T, dtensor::ReduceOp::Min>(n, sb, db);

        const std::vector<T> d = random_values<T>(static_cast<std::size_t>(extent(db)), -50, 50, 11);
        std::vector<T> want = d;
        dtensor::detail::divide_block(dtensor::dtype_of<T>(), want.data(), db, 3);
        const kd::Runs rd = kd::runs_of(db);
        each_launch(stride_configs(n, false), [&](const Config& c) {
          Buffer<T> y(d);
          if (db.is_contiguous())
            hl::launch(c.grid, c.block, 0, kd::divide_runs<T, kd::Layout::Contiguous>, y.data(), rd, T(3), n);
          else hl::launch(c.grid, c.block, 0, kd::divide_runs<T, kd::Layout::Strided>, y.data(), rd, T(3), n);
          CHECK(mismatch(y.values(), want) == "");
          CHECK(y.guards_intact());
        });
      }
    }
  });
}

// --- reductions ---

struct Shape {
  int64_t outer, len, inner;
};
std::string show(const Shape& s) {
  return "[" + std::to_string(s.outer) + ", " + std::to_string(s.len) + ", " + std::to_string(s.inner) + "]";
}
constexpr Shape kShapes[] = {{2, 0, 3},  {1, 1, 1},    {1, 31, 1},   {3, 33, 1},  {2, 33, 5},  {1, 1023, 1},
                             {1, 4097, 1}, {2, 4097, 3}, {4, 31, 33}, {1, 1, 4097}, {0, 5, 3}};

// reduce_rows costs a block-wide reduction per output: the launcher runs those for
// shapes of up to this many outputs.
constexpr int64_t kMaxRowOutputs = 128;

template <class T, class Op>
void check_reduce_dim(const Shape& sh, Reduce r, Op op) {
  INFO("reduction ", std::string(r == Reduce::Sum ? "sum" : r == Reduce::Max ? "max" : "min"));
  const int64_t outs = sh.outer * sh.inner;
  const std::vector<T> in = random_values<T>(static_cast<std::size_t>(sh.outer * sh.len * sh.inner), -20, 20, 12);
  const T init = kd::identity<T>(r);
  std::vector<T> want(static_cast<std::size_t>(outs));
  double magnitude = 1;  // the largest sum of |x| of an output: the scale of the sums' rounding
  for (int64_t o = 0; o < sh.outer; ++o)
    for (int64_t i = 0; i < sh.inner; ++i) {
      T acc = init;
      double sum = 0, abs_sum = 0;  // floating-point sums in double
      for (int64_t j = 0; j < sh.len; ++j) {
        const T x = in[(o * sh.len + j) * sh.inner + i];
        if (r == Reduce::Sum) acc = ref_binary<Binary::Add>(acc, x);
        else if (r == Reduce::Max) acc = std::max(acc, x);
        else acc = std::min(acc, x);
        sum += static_cast<double>(x);
        abs_sum += std::abs(static_cast<double>(x));
      }
      if (std::is_floating_point_v<T> && r == Reduce::Sum) acc = static_cast<T>(sum);
      magnitude = std::max(magnitude, abs_sum);
      want[o * sh.inner + i] = acc;
    }
  // Rounding differs with the order of the sum; anything else (a missed element, a
  // value read before it was written) is far off.
  const double tol = (std::is_same_v<T, float> ? 1e-6 : 1e-14) * magnitude;
  const auto eq = [&](T a, T b) {
    if constexpr (std::is_floating_point_v<T>)
      return std::isnan(a) == std::isnan(b) && (std::abs(a - b) <= tol || a == b);
    else
      return a == b;
  };
  std::vector<Config> rows;
  if (outs > 0 && outs <= kMaxRowOutputs) {
    rows.push_back({Dim3{static_cast<unsigned>(std::min(outs, kd::kMaxBlocks))}, Dim3{kd::kThreads}});
    rows.push_back({Dim3{static_cast<unsigned>(std::min<int64_t>(outs, 3))}, Dim3{kd::kThreads}});
  }
  each_launch(rows, [&](const Config& c) {
    Buffer<T> x(in), out(static_cast<std::size_t>(outs));
    hl::launch(c.grid, c.block, 0, kd::reduce_rows<T, Op>, x.data(), out.data(), sh.len, sh.inner, outs, init, op,
               T(1));
    CHECK(mismatch(out.values(), want, eq) == "");
    CHECK((x.guards_intact() && out.guards_intact()));
  });
  each_launch(stride_configs(outs), [&](const Config& c) {
    Buffer<T> x(in), out(static_cast<std::size_t>(outs));
    hl::launch(c.grid, c.block, 0, kd::reduce_columns<T, Op>, x.data(), out.data(), sh.len, sh.inner, outs, init, op,
               T(1));
    CHECK(mismatch(out.values(), want, eq) == "");
    CHECK((x.guards_intact() && out.guards_intact()));
  });
}

TEST_CASE("kernels on the host: reduce_rows and reduce_columns") {
  for_types<float, double, uint8_t, int32_t>([]<class T>() {
    for (const Shape& sh : kShapes) {
      INFO(show(sh), ", ", type_name<T>());
      check_reduce_dim<T>(sh, Reduce::Sum, kd::SumOp{});
      check_reduce_dim<T>(sh, Reduce::Max, kd::MaxOp{});
      check_reduce_dim<T>(sh, Reduce::Min, kd::MinOp{});
    }
  });
}

// Each thread writes the block's sums and maximum as block_reduce returns them to it,
// calling it again right away, as its comment allows: with the same operator (the same
// __shared__ array, which the first call must release before returning), then with
// another.
template <class T>
DTENSOR_KERNEL void block_reduce_twice(const T* in, T* sums, T* twice, T* maxes) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  sums[i] = kd::block_reduce(in[i], kd::SumOp{});
  twice[i] = kd::block_reduce(kd::SumOp{}(in[i], in[i]), kd::SumOp{});
  maxes[i] = kd::block_reduce(in[i], kd::MaxOp{});
}

TEST_CASE("kernels on the host: block_reduce gives every thread the block's value") {
  for_types<float, int32_t, uint8_t>([]<class T>() {
    const unsigned blocks = 3;
    const auto size = std::size_t{blocks} * kd::kThreads;
    std::vector<T> in = random_values<T>(size, -100, 100, 13);
    for (T& x : in) x = static_cast<T>(std::round(x));  // float sums of small integers are exact
    std::vector<T> sums(size), twice(size), maxes(size);
    for (unsigned b = 0; b < blocks; ++b) {
      T s = 0, s2 = 0, m = std::numeric_limits<T>::lowest();
      for (int t = 0; t < kd::kThreads; ++t) {
        const T x = in[b * kd::kThreads + t];
        s = ref_binary<Binary::Add>(s, x);
        s2 = ref_binary<Binary::Add>(s2, ref_binary<Binary::Add>(x, x));
        m = std::max(m, x);
      }
      for (int t = 0; t < kd::kThreads; ++t) {
        const unsigned i = b * kd::kThreads + t;
        sums[i] = s, twice[i] = s2, maxes[i] = m;
      }
    }
    each_launch({{Dim3{blocks}, Dim3{kd::kThreads}}}, [&](const Config& c) {
      Buffer<T> x(in), s(size), s2(size), m(size);
      hl::launch(c.grid, c.block, 0, block_reduce_twice<T>, x.data(), s.data(), s2.data(), m.data());
      CHECK(mismatch(s.values(), sums) == "");
      CHECK(mismatch(s2.values(), twice) == "");
      CHECK(mismatch(m.values(), maxes) == "");
      CHECK((x.guards_intact() && s.guards_intact() && s2.guards_intact() && m.guards_intact()));
    });
  });
}

// sum_squares and max_abs as kernels.cu launches them (reduce_to_scalar): one block
// straight into the result, or partial results per block and finish_all; then with a
// grid of 3 blocks.
template <class T, class Acc, class Map, class Op>
T reduce_to_scalar(const Config& c, bool production, T* a, int64_t n, Acc init, Map map, Op op) {
  Buffer<T> out(std::vector<T>(1, T(42)));
  const unsigned blocks = production ? kd::partial_blocks(n) : c.grid.x;
  if (blocks == 1) {
    hl::launch(Dim3{1}, c.block, 0, kd::reduce_all<T, Acc, T, Map, Op>, a, n, out.data(), init, map, op);
  } else {
    Buffer<Acc> partials(blocks);
    hl::launch(Dim3{blocks}, c.block, 0, kd::reduce_all<T, Acc, Acc, Map, Op>, a, n, partials.data(), init, map, op);
    hl::launch(Dim3{1}, c.block, 0, kd::finish_all<Acc, T, Op>, static_cast<const Acc*>(partials.data()),
               static_cast<int64_t>(blocks), out.data(), init, op);
    CHECK(partials.guards_intact());
  }
  CHECK(out.guards_intact());
  return out.values()[0];
}

TEST_CASE("kernels on the host: reduce_all and finish_all (sum_squares, max_abs)") {
  for_types<float, double, int8_t, int32_t>([]<class T>() {
    std::vector<int64_t> sizes = {1, 31, 33, 1023, 4097};
    if (std::is_same_v<T, float>) sizes.push_back(int64_t{kd::kMaxPartials} * kd::kThreads + 33);  // past the cap
    for (int64_t n : sizes) {
      for (bool with_nan : {false, true}) {
        if (with_nan && !std::is_floating_point_v<T>) continue;
        INFO("n = ", n, ", ", type_name<T>(), std::string(with_nan ? ", with a NaN" : ""));
        std::vector<T> in = random_values<T>(static_cast<std::size_t>(n), -100, 100, 14);
        if constexpr (std::is_floating_point_v<T>)
          if (with_nan) in[static_cast<std::size_t>(n / 2)] = std::numeric_limits<T>::quiet_NaN();
        using Acc = std::conditional_t<std::is_same_v<T, float>, double, kd::wrap_t<T>>;
        Acc squares = 0;
        T max_abs = 0;
        bool nan = false;
        for (T x : in) {
          squares = static_cast<Acc>(squares + static_cast<Acc>(static_cast<Acc>(x) * static_cast<Acc>(x)));
          const T m =
              std::is_signed_v<T> && x < 0 ? static_cast<T>(kd::wrap_t<T>(0) - static_cast<kd::wrap_t<T>>(x)) : x;
          nan = nan || m != m;
          max_abs = std::max(max_abs, m);
        }
        if (nan) max_abs = std::numeric_limits<T>::quiet_NaN();
        const double tol = tolerance<T>() * 10;
        const std::vector<Config> configs = {{Dim3{1}, Dim3{kd::kThreads}}, {Dim3{3}, Dim3{kd::kThreads}}};
        for (Order o : kOrders) {
          if (n > 5000 && (o == Order::Reverse || with_nan)) continue;  // the large case once
          hl::ScopedOrder scoped(o);
          for (bool production : {true, false}) {
            INFO(std::string(production ? "kernels.cu's grid" : "3 blocks"), ", ", name(o), " order");
            const Config& c = configs[production ? 0 : 1];
            Buffer<T> x(in);
            const T sq = reduce_to_scalar(c, production, x.data(), n, Acc(0), kd::Square<Acc>{}, kd::SumOp{});
            CHECK(close(sq, static_cast<T>(squares), tol));
            const T ma = reduce_to_scalar(c, production, x.data(), n, T(0), kd::Magnitude{}, kd::MaxNanOp{});
            CHECK(same(ma, max_abs));
            CHECK(x.guards_intact());
          }
        }
      }
    }
  });
}

// --- softmax ---

template <class T, bool Log>
void check_softmax(const Shape& sh) {
  INFO(std::string(Log ? "log_softmax" : "softmax"));
  const int64_t outs = sh.outer * sh.inner, n = outs * sh.len;
  const auto size = static_cast<std::size_t>(n);
  const std::vector<T> x0 = random_values<T>(size, -5, 5, 15);
  std::vector<T> max(static_cast<std::size_t>(outs), -std::numeric_limits<T>::infinity());
  for (int64_t o = 0; o < sh.outer; ++o)
    for (int64_t j = 0; j < sh.len; ++j)
      for (int64_t i = 0; i < sh.inner; ++i) {
        T& m = max[o * sh.inner + i];
        m = std::max(m, x0[(o * sh.len + j) * sh.inner + i]);
      }
  // The shifted values, the sums, and the result.
  std::vector<T> shifted(size), result(size);
  std::vector<double> exact_sums(static_cast<std::size_t>(outs), 0);
  for (int64_t o = 0; o < sh.outer; ++o)
    for (int64_t j = 0; j < sh.len; ++j)
      for (int64_t i = 0; i < sh.inner; ++i) {
        const int64_t e = (o * sh.len + j) * sh.inner + i, k = o * sh.inner + i;
        const T d = x0[e] - max[k];  // in T, as the kernels compute it: exactly
        shifted[e] = Log ? d : std::exp(d);
        exact_sums[k] += static_cast<double>(std::exp(d));
      }
  std::vector<T> sums(exact_sums.begin(), exact_sums.end());
  for (int64_t e = 0; e < n; ++e) {
    const int64_t k = e / (sh.len * sh.inner) * sh.inner + e % sh.inner;
    result[e] = Log ? static_cast<T>(shifted[e] - std::log(exact_sums[k])) : static_cast<T>(shifted[e] / exact_sums[k]);
  }
  // Sums of positive terms: relative rounding of a few units per doubling of the length.
  const auto eq = [](T a, T b) { return close(a, b, tolerance<T>()); };

  std::vector<Config> shift_configs = stride_configs(outs);  // softmax_shift_columns
  std::vector<bool> by_rows(shift_configs.size(), false);
  if (outs > 0 && outs <= kMaxRowOutputs) {
    shift_configs.push_back({Dim3{static_cast<unsigned>(std::min(outs, kd::kMaxBlocks))}, Dim3{kd::kThreads}});
    shift_configs.push_back({Dim3{static_cast<unsigned>(std::min<int64_t>(outs, 3))}, Dim3{kd::kThreads}});
    by_rows.resize(shift_configs.size(), true);
  }
  for (Order o : kOrders) {
    hl::ScopedOrder scoped(o);
    for (std::size_t k = 0; k < shift_configs.size(); ++k) {
      const Config& c = shift_configs[k];
      INFO(std::string(by_rows[k] ? "softmax_shift_rows " : "softmax_shift_columns "), show(c), ", ", name(o),
           " order");
      Buffer<T> x(x0), m(max), s(static_cast<std::size_t>(outs));
      if (by_rows[k])
        hl::launch(c.grid, c.block, 0, kd::softmax_shift_rows<T, Log>, x.data(), m.data(), s.data(), sh.len,
                   sh.inner, outs);
      else
        hl::launch(c.grid, c.block, 0, kd::softmax_shift_columns<T, Log>, x.data(), m.data(), s.data(), sh.len,
                   sh.inner, outs);
      CHECK(mismatch(x.values(), shifted) == "");
      CHECK(mismatch(s.values(), sums, eq) == "");
      const Config f = stride_configs(n)[k % 4];
      INFO("softmax_finish_kernel ", show(f));
      hl::launch(f.grid, f.block, 0, kd::softmax_finish_kernel<T, Log>, x.data(), static_cast<const T*>(s.data()),
                 sh.len, sh.inner, n);
      CHECK(mismatch(x.values(), result, eq) == "");
      CHECK((x.guards_intact() && m.guards_intact() && s.guards_intact()));
    }
  }
}

TEST_CASE("kernels on the host: softmax_shift and softmax_finish") {
  for_types<float, double>([]<class T>() {
    for (const Shape& sh : kShapes) {
      INFO(show(sh), ", ", type_name<T>());
      check_softmax<T, false>(sh);
      check_softmax<T, true>(sh);
    }
  });
}

// --- where_equal (kernels/reduce.cuh: the backward of max and min over a dim) ---

template <class T>
void check_where_equal(const Shape& sh) {
  INFO(show(sh), ", ", type_name<T>());
  const int64_t lines = sh.outer * sh.inner, n = lines * sh.len;
  // Small integers so that many elements equal their line's value.
  std::vector<T> x(static_cast<std::size_t>(n)), y(static_cast<std::size_t>(lines)), v(y.size());
  for (int64_t e = 0; e < n; ++e) x[e] = static_cast<T>((e * 7) % 3);
  for (int64_t l = 0; l < lines; ++l) y[l] = static_cast<T>(l % 3), v[l] = static_cast<T>(l + 1);
  std::vector<T> want(x.size());
  for (int64_t o = 0; o < sh.outer; ++o)
    for (int64_t j = 0; j < sh.len; ++j)
      for (int64_t i = 0; i < sh.inner; ++i) {
        const int64_t e = (o * sh.len + j) * sh.inner + i, l = o * sh.inner + i;
        want[e] = x[e] == y[l] ? v[l] : T(0);
      }
  each_launch(stride_configs(n, false), [&](const Config& c) {
    Buffer<T> xb(x), yb(y), vb(v), out(x.size());
    hl::launch(c.grid, c.block, 0, kd::where_equal_kernel<T>, static_cast<const T*>(xb.data()),
               static_cast<const T*>(yb.data()), static_cast<const T*>(vb.data()), out.data(), sh.len, sh.inner, n);
    CHECK(mismatch(out.values(), want) == "");
    CHECK((xb.guards_intact() && yb.guards_intact() && vb.guards_intact() && out.guards_intact()));
  });
}

TEST_CASE("kernels on the host: where_equal") {
  for_types<float, double, int32_t>([]<class T>() {
    for (const Shape& sh : kShapes) check_where_equal<T>(sh);
  });
}

// --- per-row statistics and affine maps (kernels/row_stats.cuh) ---

// row_moments_kernel against sums in long double, with and without a shift and a
// second block; blocks of kThreads (block_reduce's size), grids of one block, two, and
// one per row, so that the row loop and the column loop both turn.
template <class T>
void check_row_moments(int64_t rows, int64_t cols) {
  INFO("rows ", rows, ", cols ", cols, ", ", type_name<T>());
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  const auto a = random_values<T>(n, -3, 5, 41);
  const auto b = random_values<T>(n, -2, 2, 42);
  const auto shift = random_values<double>(static_cast<std::size_t>(rows), 0, 2, 43);
  for (int mode = 0; mode < 3; ++mode) {  // 0: plain, 1: shifted, 2: with b
    INFO("mode ", mode);
    std::vector<double> want(static_cast<std::size_t>(2 * rows)), scale(want.size());
    for (int64_t r = 0; r < rows; ++r) {
      long double s1 = 0, s2 = 0, m1 = 0, m2 = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const long double x = a[r * cols + j] - (mode == 1 ? shift[r] : 0.0);
        const long double y = mode == 2 ? static_cast<long double>(b[r * cols + j]) : x;
        s1 += x, s2 += x * y, m1 += std::abs(x), m2 += std::abs(x * y);
      }
      want[r] = static_cast<double>(s1), want[rows + r] = static_cast<double>(s2);
      scale[r] = static_cast<double>(m1), scale[rows + r] = static_cast<double>(m2);
    }
    const unsigned per_row = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(rows, kd::kMaxBlocks)));
    each_launch({{Dim3{per_row}, Dim3{kd::kThreads}}, {Dim3{1}, Dim3{kd::kThreads}}, {Dim3{2}, Dim3{kd::kThreads}}},
                [&](const Config& c) {
                  Buffer<T> ab(a), bb(b);
                  Buffer<double> sb(shift), out(want.size());
                  hl::launch(c.grid, c.block, 0, kd::row_moments_kernel<T>, static_cast<const T*>(ab.data()),
                             mode == 2 ? static_cast<const T*>(bb.data()) : nullptr,
                             mode == 1 ? static_cast<const double*>(sb.data()) : nullptr, rows, cols, out.data());
                  const auto got = out.values();
                  for (std::size_t i = 0; i < want.size(); ++i)
                    REQUIRE_MESSAGE(std::abs(got[i] - want[i]) <= 1e-14 * (1 + scale[i]), "sum ", i, ": got ",
                                    show(got[i]), ", want ", show(want[i]));
                  CHECK((ab.guards_intact() && bb.guards_intact() && sb.guards_intact() && out.guards_intact()));
                });
  }
}

TEST_CASE("kernels on the host: row_moments") {
  for_types<float, double>([]<class T>() {
    for (int64_t rows : {0, 1, 3, 33})
      for (int64_t cols : {0, 1, 31, 33, 1023, 4097}) check_row_moments<T>(rows, cols);
  });
}

// row_affine_kernel: the formula of compute/row_terms.hpp in the same order, so bit
// for bit; every row and column term present and absent, and in place (out = a).
template <class T>
void check_row_affine(int64_t rows, int64_t cols) {
  INFO("rows ", rows, ", cols ", cols, ", ", type_name<T>());
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  const auto a = random_values<T>(n, -3, 5, 51);
  const auto b = random_values<T>(n, -2, 2, 52);
  const auto k = static_cast<std::size_t>(rows);
  const auto center = random_values<double>(k, -1, 1, 53), scale = random_values<double>(k, -2, 2, 54);
  const auto b_scale = random_values<double>(k, -2, 2, 55), offset = random_values<double>(k, -1, 1, 56);
  const auto col_scale = random_values<double>(static_cast<std::size_t>(cols), -2, 2, 57);
  const auto col_offset = random_values<double>(static_cast<std::size_t>(cols), -1, 1, 58);
  // bit 0: center, 1: b, 2: offset, 3: col_scale, 4: col_offset, 5: no scale (a factor of 1)
  for (int mask = 0; mask < 64; ++mask) {
    const bool has_center = mask & 1, has_b = mask & 2, has_offset = mask & 4;
    const bool has_col_scale = mask & 8, has_col_offset = mask & 16, has_scale = !(mask & 32);
    INFO("center ", has_center, ", b ", has_b, ", offset ", has_offset, ", col_scale ", has_col_scale,
         ", col_offset ", has_col_offset, ", scale ", has_scale);
    std::vector<T> want(n);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t e = r * cols + j;
        double v = static_cast<double>(a[e]);
        if (has_center) v -= center[r];
        if (has_scale) v *= scale[r];
        if (has_b) v += static_cast<double>(b[e]) * b_scale[r];
        if (has_offset) v += offset[r];
        if (has_col_scale) v *= col_scale[j];
        if (has_col_offset) v += col_offset[j];
        want[e] = static_cast<T>(v);
      }
    for (bool in_place : {false, true})
      each_launch(stride_configs(static_cast<int64_t>(n), false), [&](const Config& c) {
        Buffer<T> ab(a), bb(b), out(n);
        Buffer<double> cb(center), sb(scale), bsb(b_scale), ob(offset), csb(col_scale), cob(col_offset);
        const RowTerms terms{has_center ? cb.data() : nullptr,          has_scale ? sb.data() : nullptr,
                             has_b ? bsb.data() : nullptr,              has_offset ? ob.data() : nullptr,
                             has_col_scale ? csb.data() : nullptr,      has_col_offset ? cob.data() : nullptr};
        T* dst = in_place ? ab.data() : out.data();
        hl::launch(c.grid, c.block, 0, kd::row_affine_kernel<T>, static_cast<const T*>(ab.data()),
                   has_b ? static_cast<const T*>(bb.data()) : nullptr, terms, cols, dst, static_cast<int64_t>(n));
        CHECK(mismatch(in_place ? ab.values() : out.values(), want) == "");
        CHECK((ab.guards_intact() && bb.guards_intact() && out.guards_intact() && cb.guards_intact() &&
               sb.guards_intact() && bsb.guards_intact() && ob.guards_intact() && csb.guards_intact() &&
               cob.guards_intact()));
      });
  }
}

TEST_CASE("kernels on the host: row_affine") {
  for_types<float, double>([]<class T>() {
    for (int64_t rows : {0, 1, 3, 33})
      for (int64_t cols : {0, 1, 31, 33, 1023}) check_row_affine<T>(rows, cols);
  });
}

// --- optimizer updates (kernels/optimizer.cuh) against the host's Eigen update ---

template <class T>
void check_optimizers(int64_t n) {
  INFO("n ", n, ", ", type_name<T>());
  const auto w0 = random_values<T>(static_cast<std::size_t>(n), -1, 1, 61);
  const auto g = random_values<T>(static_cast<std::size_t>(n), -1, 1, 62);
  const auto b0 = random_values<T>(static_cast<std::size_t>(n), -1, 1, 63);
  const auto v0 = random_values<T>(static_cast<std::size_t>(n), 0, 1, 64);
  const dtensor::Device host = dtensor::Device::host();
  for (double momentum : {0.0, 0.9})
    for (bool nesterov : {false, true})
      for (bool first : {false, true}) {
        const dtensor::SgdStep s{.lr = 0.1, .momentum = momentum, .weight_decay = 0.01, .nesterov = nesterov,
                                 .first = first};
        INFO("sgd momentum ", momentum, ", nesterov ", nesterov, ", first ", first);
        std::vector<T> w = w0, b = b0;
        dtensor::compute::sgd_update(host, w.data(), g.data(), b.data(), n, s);
        each_launch(stride_configs(n, false), [&](const Config& c) {
          Buffer<T> wb(w0), gb(g), bb(b0);
          hl::launch(c.grid, c.block, 0, kd::sgd_update_kernel<T>, wb.data(), static_cast<const T*>(gb.data()),
                     momentum != 0 ? bb.data() : nullptr, n, static_cast<T>(s.lr), static_cast<T>(s.momentum),
                     static_cast<T>(s.weight_decay), s.nesterov, s.first);
          CHECK(mismatch(wb.values(), w, [](T x, T y) { return close(x, y, tolerance<T>()); }) == "");
          if (momentum != 0)
            CHECK(mismatch(bb.values(), b, [](T x, T y) { return close(x, y, tolerance<T>()); }) == "");
          CHECK((wb.guards_intact() && gb.guards_intact() && bb.guards_intact()));
        });
      }
  const dtensor::AdamWStep s{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                             .bias_correction1 = 1 - 0.9 * 0.9, .bias_correction2 = 1 - 0.999 * 0.999};
  std::vector<T> w = w0, m = b0, v = v0;
  dtensor::compute::adamw_update(host, w.data(), g.data(), m.data(), v.data(), n, s);
  each_launch(stride_configs(n, false), [&](const Config& c) {
    Buffer<T> wb(w0), gb(g), mb(b0), vb(v0);
    hl::launch(c.grid, c.block, 0, kd::adamw_update_kernel<T>, wb.data(), static_cast<const T*>(gb.data()), mb.data(),
               vb.data(), n, static_cast<T>(s.lr), static_cast<T>(s.beta1), static_cast<T>(s.beta2),
               static_cast<T>(s.eps), static_cast<T>(s.weight_decay), static_cast<T>(s.bias_correction1),
               static_cast<T>(s.bias_correction2));
    auto near = [](T x, T y) { return close(x, y, tolerance<T>()); };
    CHECK(mismatch(wb.values(), w, near) == "");
    CHECK(mismatch(mb.values(), m, near) == "");
    CHECK(mismatch(vb.values(), v, near) == "");
    CHECK((wb.guards_intact() && gb.guards_intact() && mb.guards_intact() && vb.guards_intact()));
  });
}

TEST_CASE("kernels on the host: sgd_update and adamw_update equal the host's update") {
  for_types<float, double>([]<class T>() {
    for (int64_t n : kSizes) check_optimizers<T>(n);
  });
}

// --- counter-based fills (kernels/random.cuh) ---

// random_fill_kernel writes, for each element of a block, the host's draw for its
// global index: bit for bit, on boxes of 1 to 3 dims placed inside larger tensors.
template <class T>
void check_random_fill(const dtensor::CounterDraw& d, const std::vector<int64_t>& global,
                       const std::vector<int64_t>& offset, const std::vector<int64_t>& extent) {
  INFO("global ", global.size(), "-D, box ", extent.size() > 0 ? extent[0] : 0, ", ", type_name<T>(), ", kind ",
       static_cast<int>(d.kind));
  dtensor::CounterBox box;
  box.rank = static_cast<int>(global.size());
  int64_t stride = 1;
  for (int k = box.rank - 1; k >= 0; --k) {
    box.extent[k] = extent[k], box.offset[k] = offset[k], box.global_stride[k] = stride;
    stride *= global[k];
  }
  const int64_t n = box.numel();
  std::vector<T> want;
  // Reference: every global index, kept where it falls in the box; the draws written
  // out here rather than through counter_value.
  for (int64_t g = 0; g < stride; ++g) {
    bool inside = true;
    int64_t rest = g;
    for (int k = box.rank - 1; k >= 0; --k) {
      const int64_t i = rest % global[k];
      rest /= global[k];
      inside = inside && i >= offset[k] && i < offset[k] + extent[k];
    }
    if (!inside) continue;
    const auto i = static_cast<uint64_t>(g);
    using Kind = dtensor::CounterDraw::Kind;
    if (d.kind == Kind::Uniform) want.push_back(dtensor::detail::uniform_value<T>(d.seed, i));
    else if (d.kind == Kind::Normal) want.push_back(dtensor::detail::normal_value<T>(d.seed, i));
    else want.push_back(dtensor::detail::uniform01(d.seed, i, d.stream) >= d.p ? static_cast<T>(d.scale) : T(0));
  }
  REQUIRE(static_cast<int64_t>(want.size()) == n);
  each_launch(stride_configs(n, false), [&](const Config& c) {
    Buffer<T> out(static_cast<std::size_t>(n));
    hl::launch(c.grid, c.block, 0, kd::random_fill_kernel<T>, out.data(), box, d, n);
    CHECK(mismatch(out.values(), want) == "");
    CHECK(out.guards_intact());
  });
}

TEST_CASE("kernels on the host: random_fill gives the host's counter-based draws") {
  using Kind = dtensor::CounterDraw::Kind;
  const dtensor::CounterDraw uniform{.kind = Kind::Uniform, .seed = 7}, normal{.kind = Kind::Normal, .seed = 7};
  const dtensor::CounterDraw keep{.kind = Kind::Keep, .seed = 7, .stream = 3, .p = 0.3, .scale = 1 / 0.7};
  for_types<float, double>([&]<class T>() {
    for (int64_t n : kSizes)
      for (const auto& d : {uniform, normal, keep}) check_random_fill<T>(d, {n + 5}, {3}, {n});
    check_random_fill<T>(normal, {7, 9}, {2, 4}, {5, 3});
    check_random_fill<T>(keep, {7, 9}, {0, 1}, {7, 8});
    check_random_fill<T>(uniform, {4, 33, 5}, {1, 0, 2}, {3, 33, 2});
    check_random_fill<T>(normal, {4, 33, 5}, {0, 7, 0}, {4, 0, 5});  // an empty box
  });
}

}  // namespace

// --- attention (kernels/attention.cuh) against the host's tiled core ---

struct AttentionCase {
  const char* what;
  dtensor::compute::AttentionDims dims;
  bool mask = false;
};

template <class T>
void check_attention_kernels(const AttentionCase& c, int64_t tile) {
  using dtensor::compute::AttentionDims;
  AttentionDims d = c.dims;
  d.tile = 5;  // the host reference's tiles, unlike the kernels'
  const int64_t D = d.head_dim, nq = d.batch * d.heads * d.q_len * D, nkv = d.batch * d.kv_heads * d.kv_len * D;
  const int64_t rows = d.batch * d.heads * d.q_len;
  const auto sz = [](int64_t n) { return static_cast<std::size_t>(n); };
  const std::vector<T> q = random_values<T>(sz(nq), -1, 1, 21), k = random_values<T>(sz(nkv), -1, 1, 22),
                       v = random_values<T>(sz(nkv), -1, 1, 23), dout = random_values<T>(sz(nq), -1, 1, 24);
  const std::vector<T> mask = c.mask ? random_values<T>(sz(d.q_len * d.kv_len), -2, 2, 25) : std::vector<T>{};
  const T* mask_ptr = c.mask ? mask.data() : nullptr;
  std::vector<T> o(sz(nq)), lse(sz(rows)), dq(sz(nq)), dk(sz(nkv)), dv(sz(nkv));
  dtensor::compute::attention_forward(d, q.data(), k.data(), v.data(), mask_ptr, o.data(), lse.data());
  dtensor::compute::attention_backward(d, q.data(), k.data(), v.data(), mask_ptr, o.data(), lse.data(), dout.data(),
                                       dq.data(), dk.data(), dv.data());
  AttentionDims kdims = d;
  kdims.scale = d.softmax_scale();  // as the launcher resolves it
  const auto eq = [](T a, T b) { return close(a, b, 5 * tolerance<T>()); };
  const auto bytes = [&](int rows_, int pairs, int scalars) {
    return static_cast<std::size_t>(kd::attention_shared_elems(tile, D, rows_, pairs, scalars)) * sizeof(T);
  };
  const int64_t q_jobs = d.batch * d.heads * ((d.q_len + tile - 1) / tile);
  const int64_t kv_jobs = d.batch * d.kv_heads * ((d.kv_len + tile - 1) / tile);
  // One block per job and fewer blocks than jobs (each loops), whole and odd blocks of threads.
  const std::vector<Config> configs = {{Dim3{static_cast<unsigned>(std::max<int64_t>(q_jobs, 1))}, Dim3{kd::kThreads}},
                                       {Dim3{2}, Dim3{33}}};
  each_launch(configs, [&](const Config& cfg) {
    INFO(c.what, ", ", type_name<T>(), ", tile ", tile);
    Buffer<T> qb(q), kb(k), vb(v), mb(mask), ob(sz(nq)), lb(sz(rows)), dob(dout);
    Buffer<T> dqb(sz(nq)), dkb(sz(nkv)), dvb(sz(nkv));
    const T* mp = c.mask ? static_cast<const T*>(mb.data()) : nullptr;
    if (q_jobs > 0)
      hl::launch(cfg.grid, cfg.block, bytes(kd::kForwardRows, kd::kForwardPairs, kd::kForwardScalars),
                 kd::attention_forward_kernel<T>, kdims, static_cast<const T*>(qb.data()),
                 static_cast<const T*>(kb.data()), static_cast<const T*>(vb.data()), mp, ob.data(), lb.data(), tile);
    CHECK(mismatch(ob.values(), o, eq) == "");
    CHECK(mismatch(lb.values(), lse, eq) == "");
    // The backward from the reference's o and lse, so that it is checked on its own.
    Buffer<T> orf(o), lrf(lse);
    if (q_jobs > 0)
      hl::launch(cfg.grid, cfg.block, bytes(kd::kDqRows, kd::kBackwardPairs, kd::kBackwardScalars),
                 kd::attention_dq_kernel<T>, kdims, static_cast<const T*>(qb.data()), static_cast<const T*>(kb.data()),
                 static_cast<const T*>(vb.data()), mp, static_cast<const T*>(orf.data()),
                 static_cast<const T*>(lrf.data()), static_cast<const T*>(dob.data()), dqb.data(), tile);
    if (kv_jobs > 0)
      hl::launch(Dim3{std::min(cfg.grid.x, static_cast<unsigned>(kv_jobs))}, cfg.block,
                 bytes(kd::kDkvRows, kd::kBackwardPairs, kd::kBackwardScalars), kd::attention_dkv_kernel<T>, kdims,
                 static_cast<const T*>(qb.data()), static_cast<const T*>(kb.data()), static_cast<const T*>(vb.data()),
                 mp, static_cast<const T*>(orf.data()), static_cast<const T*>(lrf.data()),
                 static_cast<const T*>(dob.data()), dkb.data(), dvb.data(), tile);
    CHECK(mismatch(dqb.values(), dq, eq) == "");
    CHECK(mismatch(dkb.values(), dk, eq) == "");
    CHECK(mismatch(dvb.values(), dv, eq) == "");
    CHECK((qb.guards_intact() && kb.guards_intact() && vb.guards_intact() && mb.guards_intact() &&
           ob.guards_intact() && lb.guards_intact() && dqb.guards_intact() && dkb.guards_intact() &&
           dvb.guards_intact()));
  });
}

TEST_CASE("kernels on the host: attention forward, dq and dk/dv equal the host's tiled core") {
  using dtensor::compute::AttentionDims;
  const AttentionCase cases[] = {
      {"grouped heads, uneven lengths",
       AttentionDims{.batch = 2, .heads = 4, .kv_heads = 2, .q_len = 11, .kv_len = 9, .head_dim = 6}},
      // rows 0-3 see no key: o and the gradients 0, lse -inf
      {"causal, keys after the queries",
       AttentionDims{.batch = 1, .heads = 2, .kv_heads = 1, .q_len = 10, .kv_len = 13, .head_dim = 5, .causal = true,
                     .q_offset = 0, .kv_offset = 4}},
      {"causal block of a longer sequence, additive mask",
       AttentionDims{.batch = 1, .heads = 3, .kv_heads = 3, .q_len = 9, .kv_len = 12, .head_dim = 4, .causal = true,
                     .q_offset = 7, .kv_offset = 2},
       true},
      {"dropout 0.3 on a block of the heads and the sequence",
       AttentionDims{.batch = 2, .heads = 2, .kv_heads = 1, .q_len = 7, .kv_len = 10, .head_dim = 3, .causal = true,
                     .q_offset = 5, .kv_offset = 0,
                     .dropout = {.p = 0.3, .seed = 9, .stream = 4, .batch_offset = 1, .head_offset = 2,
                                 .heads_total = 6, .q_total = 20, .kv_total = 20}}},
      {"no queries", AttentionDims{.batch = 1, .heads = 2, .kv_heads = 2, .q_len = 0, .kv_len = 5, .head_dim = 4}},
      {"no keys", AttentionDims{.batch = 1, .heads = 2, .kv_heads = 1, .q_len = 4, .kv_len = 0, .head_dim = 4}},
  };
  for_types<float, double>([&]<class T>() {
    for (const AttentionCase& c : cases) {
      check_attention_kernels<T>(c, 4);  // several tiles each way, the last ones partial
      check_attention_kernels<T>(c, kd::attention_tile(c.dims.head_dim, sizeof(T), kd::kDkvRows,
                                                       kd::kBackwardPairs, kd::kBackwardScalars));
    }
  });
  // The launchers' tiles fit a block's 48 KiB, and a head dim that fits no tile is refused.
  CHECK(kd::attention_tile(64, 4, kd::kForwardRows, kd::kForwardPairs, kd::kForwardScalars) == 32);
  CHECK(kd::attention_tile(128, 8, kd::kDkvRows, kd::kBackwardPairs, kd::kBackwardScalars) == 4);
  CHECK(kd::attention_tile(1 << 20, 4, kd::kDkvRows, kd::kBackwardPairs, kd::kBackwardScalars) == 0);
}

// --- neighborhood attention (kernels/neighborhood_attention.cuh) against the host's loops ---

struct NeighborhoodCase {
  const char* what;
  dtensor::compute::NeighborhoodDims dims;
};

template <class T>
void check_neighborhood_kernels(const NeighborhoodCase& c) {
  const dtensor::compute::NeighborhoodDims& d = c.dims;
  const int64_t H = d.heads, D = d.head_dim;
  const int64_t queries = d.batch * d.q_len[0] * d.q_len[1], keys = d.batch * d.kv_len[0] * d.kv_len[1];
  const auto sz = [](int64_t n) { return static_cast<std::size_t>(n); };
  const std::vector<T> q = random_values<T>(sz(queries * H * D), -1, 1, 31),
                       k = random_values<T>(sz(keys * H * D), -1, 1, 32),
                       v = random_values<T>(sz(keys * H * D), -1, 1, 33),
                       dout = random_values<T>(sz(queries * H * D), -1, 1, 34);
  std::vector<T> o(sz(queries * H * D)), dq(o.size()), dk(k.size()), dv(k.size());  // dk, dv zero: the loops add
  dtensor::compute::neighborhood_attention_forward(d, q.data(), k.data(), v.data(), o.data());
  dtensor::compute::neighborhood_attention_backward(d, q.data(), k.data(), v.data(), dout.data(), dq.data(), dk.data(),
                                                    dv.data());
  const kd::NeighborhoodGeo g = kd::neighborhood_geo(d);
  const auto eq = [](T a, T b) { return close(a, b, 8 * tolerance<T>()); };
  each_launch(stride_configs(std::max<int64_t>(queries, keys) * H), [&](const Config& cfg) {
    INFO(c.what, ", ", type_name<T>());
    Buffer<T> qb(q), kb(k), vb(v), dob(dout), ob(o.size()), dqb(o.size()), dkb(k.size()), dvb(k.size());
    Buffer<T> stats(sz(2 * queries * H));
    const auto* qp = static_cast<const T*>(qb.data());
    const auto* kp = static_cast<const T*>(kb.data());
    const auto* vp = static_cast<const T*>(vb.data());
    const auto* dop = static_cast<const T*>(dob.data());
    if (queries > 0) {
      hl::launch(cfg.grid, cfg.block, 0, kd::neighborhood_forward_kernel<T>, g, qp, kp, vp, ob.data());
      hl::launch(cfg.grid, cfg.block, 0, kd::neighborhood_dq_kernel<T>, g, qp, kp, vp, dop, stats.data(), dqb.data());
    }
    if (keys > 0)  // every key written, those no window holds with zeros (the buffers start as guard bytes)
      hl::launch(cfg.grid, cfg.block, 0, kd::neighborhood_dkv_kernel<T>, g, qp, kp, vp, dop,
                 static_cast<const T*>(stats.data()), dkb.data(), dvb.data());
    CHECK(mismatch(ob.values(), o, eq) == "");
    CHECK(mismatch(dqb.values(), dq, eq) == "");
    CHECK(mismatch(dkb.values(), dk, eq) == "");
    CHECK(mismatch(dvb.values(), dv, eq) == "");
    CHECK((qb.guards_intact() && kb.guards_intact() && vb.guards_intact() && dob.guards_intact() &&
           ob.guards_intact() && dqb.guards_intact() && dkb.guards_intact() && dvb.guards_intact() &&
           stats.guards_intact()));
  });
}

TEST_CASE("kernels on the host: neighborhood attention forward, dq and the gathered dk/dv equal the host's loops") {
  using dtensor::compute::NeighborhoodDims;
  const NeighborhoodCase cases[] = {
      // The whole 7 x 6 image on one rank: windows shifted inward at every border.
      {"whole image, 3 x 5 window",
       NeighborhoodDims{.batch = 2, .heads = 2, .head_dim = 3, .extent = {7, 6}, .kernel = {3, 5},
                        .q_first = {0, 0}, .q_len = {7, 6}, .kv_first = {0, 0}, .kv_len = {7, 6}}},
      // A rank's block of a 9 x 10 image with the ghosts its windows need (and a key
      // column beyond them no window reads: its dk, dv are zeros).
      {"a block with ghosts, dilation 2 along y",
       NeighborhoodDims{.batch = 1, .heads = 3, .head_dim = 2, .extent = {9, 10}, .kernel = {3, 3},
                        .dilation = {1, 2}, .q_first = {3, 2}, .q_len = {3, 4}, .kv_first = {2, 0},
                        .kv_len = {5, 9}}},
      {"the last rows, the window shifted inward past the block",
       NeighborhoodDims{.batch = 1, .heads = 1, .head_dim = 4, .extent = {8, 5}, .kernel = {5, 3},
                        .q_first = {6, 0}, .q_len = {2, 5}, .kv_first = {3, 0}, .kv_len = {5, 5}, .scale = 0.7}},
      // Dilated windows shifted inward at the borders: query 0 reads key 6 along X, a
      // whole window span, (kernel - 1) x dilation, away (the widest the gather searches).
      {"whole image, dilation 3 along x",
       NeighborhoodDims{.batch = 1, .heads = 2, .head_dim = 2, .extent = {9, 7}, .kernel = {3, 5},
                        .dilation = {3, 1}, .q_first = {0, 0}, .q_len = {9, 7}, .kv_first = {0, 0},
                        .kv_len = {9, 7}}},
      {"the last rows, a 5-wide window at dilation 2 shifted inward",
       NeighborhoodDims{.batch = 2, .heads = 1, .head_dim = 3, .extent = {12, 6}, .kernel = {5, 3},
                        .dilation = {2, 1}, .q_first = {9, 0}, .q_len = {3, 6}, .kv_first = {2, 0},
                        .kv_len = {10, 6}}},
      {"no queries", NeighborhoodDims{.batch = 1, .heads = 2, .head_dim = 2, .extent = {5, 5}, .kernel = {3, 3},
                                      .q_first = {0, 0}, .q_len = {0, 5}, .kv_first = {0, 0}, .kv_len = {2, 5}}},
  };
  for_types<float, double>([&]<class T>() {
    for (const NeighborhoodCase& c : cases) check_neighborhood_kernels<T>(c);
  });
}

TEST_CASE("kernels on the host: attention_merge equals the host's log-sum-exp merge") {
  for_types<float, double>([]<class T>() {
    const int64_t rows = 37, dim = 5;
    const auto sz = [](int64_t n) { return static_cast<std::size_t>(n); };
    std::vector<T> o = random_values<T>(sz(rows * dim), -1, 1, 41), ob = random_values<T>(sz(rows * dim), -1, 1, 42);
    std::vector<T> lse = random_values<T>(sz(rows), -3, 3, 43), lb = random_values<T>(sz(rows), -3, 3, 44);
    const T inf = std::numeric_limits<T>::infinity();
    lse[3] = -inf;             // no key yet: the other side is copied
    lb[5] = -inf;              // nothing to add
    lse[7] = lb[7] = -inf;     // neither
    lb[9] = lse[9] + T(40);    // one side dominates
    std::vector<T> want_o = o, want_l = lse;
    dtensor::compute::attention_merge(dtensor::Device::host(), want_o.data(), want_l.data(), ob.data(), lb.data(), rows,
                                      dim);
    CHECK(want_l[3] == lb[3]);
    CHECK(want_l[7] == -inf);
    each_launch(stride_configs(rows, false), [&](const Config& c) {
      Buffer<T> ob_(o), lb_(lse), obb(ob), lbb(lb);
      hl::launch(c.grid, c.block, 0, kd::attention_merge_kernel<T>, ob_.data(), lb_.data(),
                 static_cast<const T*>(obb.data()), static_cast<const T*>(lbb.data()), rows, dim);
      const auto eq = [](T a, T b) { return close(a, b, tolerance<T>()); };
      CHECK(mismatch(ob_.values(), want_o, eq) == "");
      CHECK(mismatch(lb_.values(), want_l, eq) == "");
      CHECK((ob_.guards_intact() && lb_.guards_intact() && obb.guards_intact() && lbb.guards_intact()));
    });
  });
}

// --- the solvers' grid kernels (kernels/stencil.cuh) against the host loops ---
// The kernels and the loops (compute/stencil_loops.hpp, the emulated device's) share the
// per-cell code, so what this checks is the kernels' own part: every cell visited once
// under any grid, the block sums and their finish (finish_all) equal to the loops'
// sum, nothing written outside the outputs. (tests/gpu/test_device_solvers.cpp checks
// the per-cell code against the host solvers' independent row kernels.)
namespace {

using dtensor::compute::GridRef;
using dtensor::compute::GridTransfer;
using dtensor::compute::GridUpdate;
using dtensor::compute::StencilApply;
using dtensor::compute::StencilEpilogue;
using dtensor::compute::StencilOperator;

// Grids with a reduction: kThreads per block (block_reduce's buffer), 1, 3 and the
// production count of blocks.
std::vector<Config> sum_configs(int64_t n) {
  return {{Dim3{kd::blocks_for(n)}, Dim3{kd::kThreads}}, {Dim3{1}, Dim3{kd::kThreads}}, {Dim3{3}, Dim3{kd::kThreads}}};
}

// A padded block of `rank` grid dims (normalized to three), one ghost layer.
struct GridBlock {
  int rank;
  int64_t n[3], pad[3], ps[3];
  int64_t numel() const { return pad[0] * pad[1] * pad[2]; }
  int64_t cells() const { return n[0] * n[1] * n[2]; }
  int64_t at_cell0() const { return (rank == 3 ? ps[0] : 0) + ps[1] + ps[2]; }  // interior cell 0
  GridRef ref(const void* base) const {
    GridRef g;
    g.p = static_cast<const char*>(base);  // offset applied by the caller (element type)
    g.s[0] = rank == 3 ? ps[0] : 0, g.s[1] = ps[1], g.s[2] = ps[2];
    return g;
  }
};
GridBlock grid_block(int rank, int64_t a, int64_t b, int64_t c) {
  GridBlock g{rank, {rank == 3 ? a : 1, b, c}, {}, {}};
  for (int d = 0; d < 3; ++d) g.pad[d] = g.n[d] + (d >= 3 - rank ? 2 : 0);
  g.ps[2] = 1, g.ps[1] = g.pad[2], g.ps[0] = g.pad[1] * g.pad[2];
  return g;
}
template <class T>
GridRef interior(const GridBlock& g, T* base) {
  GridRef r = g.ref(base);
  r.p = base + g.at_cell0();
  return r;
}

// The operators: taps (7- or 9-point with corners), a variable coefficient, a field of
// 3^rank coefficients whose rows are pooled (two distinct rows).
template <class T>
struct Operators {
  std::vector<T> k;                                       // VarCoeff's padded field
  std::vector<std::vector<T>> pools;                      // Field
  std::vector<std::vector<int64_t>> starts;
  std::vector<StencilOperator> ops;
  Operators(const GridBlock& g) {
    StencilOperator taps;
    taps.rank = g.rank;
    const int first = 3 - g.rank;
    int t = 0;
    for (int k3 = 0; k3 < (g.rank == 2 ? 9 : 27); ++k3) {
      int o[3] = {0, 0, 0}, nz = 0, rest = k3;
      for (int d = 2; d >= first; --d) o[d] = rest % 3 - 1, rest /= 3, nz += o[d] != 0;
      if (g.rank == 3 && nz > 1) continue;  // 3-D: faces only
      for (int d = 0; d < 3; ++d) taps.tap[t][d] = o[d];
      taps.weight[t++] = nz == 0 ? 8.5 : -1.0 - 0.1 * k3;
    }
    taps.taps = t;
    ops.push_back(taps);
    k = random_values<T>(static_cast<std::size_t>(g.numel()), 0.5, 2, 71);
    StencilOperator var;
    var.kind = StencilOperator::Kind::VarCoeff;
    var.rank = g.rank;
    var.k = interior(g, k.data());
    var.scale = 0.7;
    ops.push_back(var);
    StencilOperator field;
    field.kind = StencilOperator::Kind::Field;
    field.rank = g.rank;
    const int64_t rows = g.n[0] * g.n[1];
    for (int q = 0; q < field.points(); ++q) {
      pools.push_back(random_values<T>(static_cast<std::size_t>(2 * g.n[2]), -1, 1, 80 + q));
      std::vector<int64_t> st(static_cast<std::size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) st[static_cast<std::size_t>(r)] = (r % 3 == 1) ? g.n[2] : 0;
      starts.push_back(std::move(st));
    }
    for (int q = 0; q < field.points(); ++q) field.pool[q] = pools[q].data(), field.row_start[q] = starts[q].data();
    ops.push_back(field);
  }
};

template <class T>
void check_stencil_kernels(const GridBlock& g) {
  const Operators<T> operators(g);
  const auto sz = [](int64_t n) { return static_cast<std::size_t>(n); };
  const std::vector<T> u = random_values<T>(sz(g.numel()), -1, 1, 61), b = random_values<T>(sz(g.numel()), -1, 1, 62),
                       x = random_values<T>(sz(g.numel()), -1, 1, 63), dinv = random_values<T>(sz(g.numel()), 0.1, 1, 64),
                       d0 = random_values<T>(sz(g.numel()), -1, 1, 65);
  using EKind = StencilEpilogue::Kind;
  for (std::size_t oi = 0; oi < operators.ops.size(); ++oi)
    for (EKind kind : {EKind::None, EKind::Dot, EKind::Residual, EKind::Jacobi, EKind::Smooth, EKind::GaussSeidel})
      for (int variant = 0; variant < 2; ++variant) {  // norm / box colours
        INFO("rank ", g.rank, ", operator ", oi, ", epilogue ", int(kind), ", variant ", variant, ", ", type_name<T>());
        // The loops' run on vectors of their own, the kernels' on guarded buffers.
        std::vector<T> out(sz(g.numel()), T(7)), d = d0;
        auto make = [&](const T* uu, const T* bb, const T* xx, const T* di, T* dd, T* oo) {
          StencilApply ap;
          ap.op = operators.ops[oi];
          for (int q = 0; q < 3; ++q) ap.shape[q] = g.n[q], ap.offset[q] = q == 2 ? 3 : 0;
          ap.u = interior(g, const_cast<T*>(uu));
          ap.out = interior(g, oo);
          ap.epilogue.kind = kind;
          ap.epilogue.norm = variant == 1;
          ap.epilogue.v = ap.epilogue.b = interior(g, const_cast<T*>(bb));
          ap.epilogue.x = interior(g, const_cast<T*>(xx));
          ap.epilogue.dinv = interior(g, const_cast<T*>(di));
          ap.epilogue.d = interior(g, dd);
          ap.epilogue.c1 = 0.3, ap.epilogue.c2 = 0.9;
          ap.epilogue.colour = 1;
          ap.epilogue.box_colours = variant == 1;
          return ap;
        };
        const double want_sum =
            dtensor::compute::stencil_apply<T>(make(u.data(), b.data(), x.data(), dinv.data(), d.data(), out.data()));
        each_launch(sum_configs(g.cells()), [&](const Config& c) {
          Buffer<T> ub(u), bbuf(b), xb(x), db(dinv), dd(d0), ob(std::vector<T>(sz(g.numel()), T(7)));
          Buffer<double> partials(c.grid.x), sum(1);
          const StencilApply ap = make(ub.data(), bbuf.data(), xb.data(), db.data(), dd.data(), ob.data());
          hl::launch(c.grid, c.block, 0, kd::stencil_apply_kernel<T>, ap, ap.epilogue.sums() ? partials.data() : nullptr);
          CHECK(mismatch(ob.values(), out) == "");
          CHECK(mismatch(dd.values(), d) == "");
          if (ap.epilogue.sums()) {
            hl::launch(Dim3{1}, Dim3{kd::kThreads}, 0, kd::finish_all<double, double, kd::SumOp>,
                       static_cast<const double*>(partials.data()), static_cast<int64_t>(c.grid.x), sum.data(), 0.0,
                       kd::SumOp{});
            CHECK(close(sum.values()[0], want_sum, 1e-12));
          }
          hl::launch(c.grid, c.block, 0, kd::stencil_diagonal_kernel<T>, ap);  // the diagonal into the output
          std::vector<T> diag(sz(g.numel()), T(7));
          StencilApply dap = ap;
          dap.out = interior(g, diag.data());
          dtensor::compute::stencil_diagonal<T>(dap.op, dap.shape, dap.out);
          CHECK(mismatch(ob.values(), diag) == "");
          CHECK((ub.guards_intact() && bbuf.guards_intact() && xb.guards_intact() && db.guards_intact() &&
                 dd.guards_intact() && ob.guards_intact() && partials.guards_intact() && sum.guards_intact()));
        });
      }

  // The vector updates with sums (CgCg: one, Residual: two, PowerSums: three) and without.
  using UKind = GridUpdate::Kind;
  for (UKind kind : {UKind::CgCgUpdate, UKind::Residual, UKind::PowerSums, UKind::Xpby, UKind::Reciprocal}) {
    INFO("rank ", g.rank, ", update ", int(kind), ", ", type_name<T>());
    std::vector<std::vector<T>> v = {u, b, x, d0, dinv};
    auto make = [&](std::vector<T*> p) {
      GridUpdate up;
      up.kind = kind;
      for (int q = 0; q < 3; ++q) up.shape[q] = g.n[q];
      GridRef* slot[] = {&up.a, &up.b, &up.c, &up.d, &up.e};
      for (int q = 0; q < 5; ++q) *slot[q] = interior(g, p[q]);
      up.alpha = 0.4, up.beta = 0.6;
      return up;
    };
    const dtensor::compute::GridSums want =
        dtensor::compute::grid_update<T>(make({v[0].data(), v[1].data(), v[2].data(), v[3].data(), v[4].data()}));
    each_launch(sum_configs(g.cells()), [&](const Config& c) {
      Buffer<T> b0(u), b1(b), b2(x), b3(d0), b4(dinv);
      Buffer<double> partials(3 * std::size_t{c.grid.x}), sums(3);
      const GridUpdate up = make({b0.data(), b1.data(), b2.data(), b3.data(), b4.data()});
      hl::launch(c.grid, c.block, 0, kd::grid_update_kernel<T>, up, up.sums() ? partials.data() : nullptr);
      CHECK(mismatch(b0.values(), v[0]) == "");
      CHECK(mismatch(b1.values(), v[1]) == "");
      CHECK(mismatch(b2.values(), v[2]) == "");
      CHECK(mismatch(b3.values(), v[3]) == "");
      CHECK(mismatch(b4.values(), v[4]) == "");
      if (up.sums())
        for (int q = 0; q < 3; ++q) {
          hl::launch(Dim3{1}, Dim3{kd::kThreads}, 0, kd::finish_all<double, double, kd::SumOp>,
                     static_cast<const double*>(partials.data()) + q * c.grid.x, static_cast<int64_t>(c.grid.x),
                     sums.data() + q, 0.0, kd::SumOp{});
          CHECK(close(sums.values()[q], want.s[q], 1e-12));
        }
      CHECK((b0.guards_intact() && b1.guards_intact() && b2.guards_intact() && b3.guards_intact() &&
             b4.guards_intact() && partials.guards_intact() && sums.guards_intact()));
    });
  }

  // Restriction into a coarse block and prolongation back (ghosts set, interior added).
  GridTransfer t;
  t.rank = g.rank;
  for (int q = 0; q < 3; ++q) {
    const bool grid_dim = q >= 3 - g.rank;
    t.fine_strides[q] = g.ref(nullptr).s[q];
    t.fine_padded[q] = g.pad[q], t.fine_shape[q] = g.n[q];
    t.fine_lo[q] = grid_dim ? 1 : 0;
    t.origin[q] = grid_dim ? 2 : 0;  // fine offset 0: coarse cell 0 is fine node 1
    t.coarse_shape[q] = grid_dim ? g.n[q] / 2 : 1;
  }
  const int64_t cn = t.coarse_shape[0] * t.coarse_shape[1] * t.coarse_shape[2];
  t.coarse.s[2] = 1, t.coarse.s[1] = t.coarse_shape[2], t.coarse.s[0] = t.coarse_shape[1] * t.coarse_shape[2];
  std::vector<T> fine = u, coarse(sz(cn));
  GridTransfer ht = t;
  ht.fine = fine.data(), ht.coarse.p = coarse.data();
  dtensor::compute::grid_restrict<T>(ht);
  dtensor::compute::grid_prolong<T>(ht);
  each_launch(stride_configs(g.numel()), [&](const Config& c) {
    INFO("rank ", g.rank, ", transfers, ", type_name<T>());
    Buffer<T> fb(u), cb(sz(cn));
    GridTransfer kt = t;
    kt.fine = fb.data(), kt.coarse.p = cb.data();
    hl::launch(c.grid, c.block, 0, kd::restrict_kernel<T>, kt);
    hl::launch(c.grid, c.block, 0, kd::prolong_kernel<T>, kt);
    CHECK(mismatch(cb.values(), coarse) == "");
    CHECK(mismatch(fb.values(), fine) == "");
    CHECK((fb.guards_intact() && cb.guards_intact()));
  });
}

}  // namespace

TEST_CASE("kernels on the host: the solvers' grid kernels (stencils with epilogues, updates, transfers) equal the loops") {
  for (const GridBlock& g : {grid_block(2, 1, 7, 9), grid_block(3, 4, 5, 7), grid_block(3, 1, 1, 3)}) {
    check_stencil_kernels<double>(g);
    check_stencil_kernels<float>(g);
  }
}

// The spectral operators' scaling (cuda/fft.hpp) against the host's (compute/fft_dims.hpp's
// weight_paired_bins after a scale): a half spectrum [outer, bins, inner] of complex
// values as their real and imaginary parts, even and odd real lengths, and the clearing
// of the imaginary parts a C2R ignores.
TEST_CASE("kernels on the host: scale_bins (the device transforms' scale, weights and real bins)") {
  for_types<float, double>([]<class T>() {
    struct Case {
      int64_t outer, bins, inner, n;
    };
    for (const Case& k : {Case{1, 5, 1, 8}, Case{3, 5, 2, 9}, Case{2, 1, 3, 1}, Case{4, 2, 1, 2}, Case{1, 17, 7, 32},
                          Case{0, 3, 2, 4}}) {
      const int64_t count = k.outer * k.bins * k.inner * 2;
      INFO("outer ", k.outer, ", bins ", k.bins, ", inner ", k.inner, ", n ", k.n, ", ", type_name<T>());
      const std::vector<T> x = random_values<T>(static_cast<std::size_t>(count), -10, 10, 5);
      for (const double w : {1.0, 0.5, 2.0})
        for (const double s : {1.0, 0.125, 0.3})
          for (const bool real_bins : {false, true}) {
            std::vector<std::complex<T>> want(static_cast<std::size_t>(count / 2));
            for (std::size_t i = 0; i < want.size(); ++i) want[i] = {x[2 * i], x[2 * i + 1]};
            if (s != 1.0)
              for (auto& v : want) v *= static_cast<T>(s);
            if (w != 1.0)
              dtensor::compute::weight_paired_bins(want.data(), k.outer, k.bins, k.inner, k.n, static_cast<T>(w));
            if (real_bins)
              for (int64_t a = 0; a < k.outer; ++a)
                for (int64_t b = 0; b < k.bins; ++b)
                  if (!dtensor::compute::is_paired_bin(b, k.n))
                    for (int64_t i = 0; i < k.inner; ++i) want[(a * k.bins + b) * k.inner + i].imag(T(0));
            std::vector<T> flat(static_cast<std::size_t>(count));
            for (std::size_t i = 0; i < want.size(); ++i)
              flat[2 * i] = want[i].real(), flat[2 * i + 1] = want[i].imag();
            each_launch(stride_configs(count), [&](const Config& c) {
              Buffer<T> p(x);
              hl::launch(c.grid, c.block, 0, kd::scale_bins_kernel<T>, p.data(), k.bins, 2 * k.inner, k.n,
                         static_cast<T>(s), static_cast<T>(w), s != 1.0, w != 1.0, real_bins, count);
              CHECK(mismatch(p.values(), flat) == "");
              CHECK(p.guards_intact());
            });
          }
    }
  });
}

// The Fourier layer's mixing and weight-term kernels (kernels/spectral_mix.cuh) against
// the host loops of compute/spectral_mix.hpp (the same per-element functions: this
// checks the kernels' indexing and grid-stride loops) and, for one element, against a
// sum written here: 1-3 spatial dims, blocks at offsets, dropped frequencies, both ways.
TEST_CASE("kernels on the host: spectral_mix and spectral_weight_terms") {
  using dtensor::compute::SpectralMixDims;
  struct Case {
    int spatial;
    int64_t block[3], offset[3], real[3], modes[3];
  };
  const Case cases[] = {
      {1, {5, 1, 1}, {2, 0, 0}, {12, 1, 1}, {4, 1, 1}},
      {2, {3, 4, 1}, {0, 1, 0}, {7, 9, 1}, {2, 3, 1}},
      {2, {4, 2, 1}, {3, 0, 0}, {7, 9, 1}, {2, 2, 1}},
      {3, {2, 3, 2}, {1, 2, 0}, {6, 6, 8}, {2, 2, 3}},
  };
  for (const Case& k : cases)
    for (const bool conjugate : {false, true}) {
      SpectralMixDims d;
      d.spatial = k.spatial, d.batch = 2, d.weight_in = 3, d.weight_out = 2, d.conjugate = conjugate;
      d.in_channels = conjugate ? d.weight_out : d.weight_in;
      d.out_channels = conjugate ? d.weight_in : d.weight_out;
      for (int i = 0; i < 3; ++i)
        d.block[i] = k.block[i], d.offset[i] = k.offset[i], d.real[i] = k.real[i], d.modes[i] = k.modes[i];
      INFO("spatial ", k.spatial, ", conjugate ", conjugate);
      const auto cells = static_cast<std::size_t>(d.cells());
      const std::vector<double> in = random_values<double>(2 * d.batch * d.in_channels * cells, -1, 1, 7);
      const std::vector<double> w = random_values<double>(2 * d.weight_in * d.weight_out * d.mode_cells(), -1, 1, 8);
      const std::vector<double> x = random_values<double>(2 * d.batch * d.weight_in * cells, -1, 1, 10);
      const std::vector<double> y = random_values<double>(2 * d.batch * d.weight_out * cells, -1, 1, 9);
      std::vector<double> want(2 * d.batch * d.out_channels * cells);
      dtensor::compute::spectral_mix(d, in.data(), w.data(), want.data());
      std::vector<double> want_g(w.size(), 0.5);
      dtensor::compute::spectral_weight_terms(d, x.data(), y.data(), want_g.data());
      // Independently of the header: the retained-frequency rule written again here, and
      // one output element and one weight term summed by hand at a retained frequency.
      auto retained = [&](int64_t c) -> int64_t {  // the weight cell of block cell c, or -1
        int64_t k[3] = {0, 0, 0}, cell = 0;
        for (int i = d.spatial - 1; i >= 0; --i) k[i] = d.offset[i] + c % d.block[i], c /= d.block[i];
        for (int i = 0; i < d.spatial; ++i) {
          const bool last = i + 1 == d.spatial;
          const int64_t m = d.modes[i], n = d.real[i], width = last ? m : 2 * m;
          const int64_t j = k[i] < m ? k[i] : (!last && k[i] >= n - m) ? 2 * m - (n - k[i]) : -1;
          if (j < 0) return -1;
          cell = cell * width + j;
        }
        return cell;
      };
      int64_t kept = -1;
      for (int64_t c = 0; c < d.cells(); ++c) {
        CHECK(retained(c) == d.weight_cell(c));
        if (kept < 0 && retained(c) >= 0) kept = c;
      }
      REQUIRE(kept >= 0);
      {
        const int64_t o = d.out_channels - 1, cell = retained(kept), mc = d.mode_cells();
        const int64_t plane = d.weight_in * d.weight_out * mc;
        std::complex<double> acc{};
        for (int64_t i = 0; i < d.in_channels; ++i) {
          const int64_t ci = conjugate ? o : i, co = conjugate ? i : o;
          const int64_t wi = (ci * d.weight_out + co) * mc + cell;
          std::complex<double> wv(w[wi], w[plane + wi]);
          if (conjugate) wv = std::conj(wv);
          const std::size_t xi = 2 * ((d.in_channels + i) * cells + kept);  // b = 1
          acc += std::complex<double>(in[xi], in[xi + 1]) * wv;
        }
        const std::size_t e = 2 * ((d.out_channels + o) * cells + kept);
        CHECK(std::abs(std::complex<double>(want[e], want[e + 1]) - acc) < 1e-14);
        // The weight term of (weight_in - 1, 0) at that frequency.
        const int64_t ci = d.weight_in - 1, wi = (ci * d.weight_out) * mc + cell;
        std::complex<double> term{};
        for (int64_t bb = 0; bb < d.batch; ++bb) {
          const std::size_t xi = 2 * ((bb * d.weight_in + ci) * cells + kept);
          const std::size_t yi = 2 * ((bb * d.weight_out) * cells + kept);
          term += std::conj(std::complex<double>(x[xi], x[xi + 1])) * std::complex<double>(y[yi], y[yi + 1]);
        }
        CHECK(std::abs(want_g[wi] - 0.5 - term.real()) < 1e-14);
        CHECK(std::abs(want_g[plane + wi] - 0.5 - term.imag()) < 1e-14);
      }
      const int64_t n = d.batch * d.out_channels * d.cells(), ng = d.weight_in * d.weight_out * d.cells();
      each_launch(stride_configs(n), [&](const Config& c) {
        Buffer<double> pin(in), pw(w), out(std::vector<double>(want.size(), -7.0));
        hl::launch(c.grid, c.block, 0, kd::spectral_mix_kernel<double>, d, pin.data(), pw.data(), out.data(), n);
        CHECK(mismatch(out.values(), want) == "");
        CHECK((pin.guards_intact() && pw.guards_intact() && out.guards_intact()));
      });
      each_launch(stride_configs(ng), [&](const Config& c) {
        Buffer<double> px(x), py(y), g(std::vector<double>(w.size(), 0.5));
        hl::launch(c.grid, c.block, 0, kd::spectral_weight_terms_kernel<double>, d, px.data(), py.data(), g.data(),
                   ng);
        CHECK(mismatch(g.values(), want_g) == "");
        CHECK((px.guards_intact() && py.guards_intact() && g.guards_intact()));
      });
    }
}

// --- bfloat16 and float16: the kernels compute in float and round once, as the host ---

namespace {

template <class H>
std::vector<H> half_values(std::size_t n, unsigned seed, double lo = -4, double hi = 4) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<H> v(n);
  for (auto& x : v) x = H(static_cast<float>(dist(gen)));
  return v;
}

// The same 16 bits, NaN with any NaN.
template <class H>
bool same_half(H a, H b) {
  const float x = a, y = b;
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  return a.bits == b.bits;
}
template <class H>
std::string half_mismatch(const std::vector<H>& got, const std::vector<H>& want) {
  if (got.size() != want.size()) return "sizes differ";
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!same_half(got[i], want[i]))
      return "element " + std::to_string(i) + ": got " + show(float(got[i])) + ", want " + show(float(want[i]));
  return "";
}

template <class H>
void check_half_elementwise(int64_t n) {
  const auto size = static_cast<std::size_t>(n);
  std::vector<H> a = half_values<H>(size, 81), b = half_values<H>(size, 82, 0.5, 3);
  // A NaN, -0, and 1e30 (infinite in float16).
  if (size > 3) a[0] = H(std::numeric_limits<float>::quiet_NaN()), a[1] = H(-0.f), a[2] = H(1e30f);
  // The host's rule (compute/local.hpp's map_float16): each element to float, one float
  // operation, one rounding back.
  std::vector<H> add(size), div(size), scaled(size), gelu(size), dgelu(size), relu(size), biased(size);
  const float s = 1.f / 3.f;
  const int64_t cols = 7;
  for (std::size_t i = 0; i < size; ++i) {
    add[i] = H(float(a[i]) + float(b[i]));
    div[i] = H(float(a[i]) / float(b[i]));
    scaled[i] = H(float(a[i]) * s);
    gelu[i] = H(dtensor::UnaryMath<Unary::Gelu>::value(float(a[i])));
    relu[i] = H(dtensor::UnaryMath<Unary::Relu>::value(float(a[i])));
    dgelu[i] = H(dtensor::UnaryMath<Unary::Gelu>::derivative(float(a[i])) * float(b[i]));
    biased[i] = H(float(a[i]) + float(b[i % cols]));
  }
  each_launch(stride_configs(n, false), [&](const Config& c) {
    Buffer<H> x(a), y(b), out(size);
    hl::launch(c.grid, c.block, 0, kd::binary_kernel<H, Binary::Add>, x.data(), y.data(), out.data(), n);
    CHECK(half_mismatch(out.values(), add) == "");
    hl::launch(c.grid, c.block, 0, kd::binary_kernel<H, Binary::Div>, x.data(), y.data(), out.data(), n);
    CHECK(half_mismatch(out.values(), div) == "");
    hl::launch(c.grid, c.block, 0, kd::binary_scalar_kernel<H, Binary::Mul>, x.data(), s, out.data(), n);
    CHECK(half_mismatch(out.values(), scaled) == "");
    hl::launch(c.grid, c.block, 0, kd::unary_kernel<H, Unary::Gelu>, x.data(), out.data(), n);
    CHECK(half_mismatch(out.values(), gelu) == "");
    hl::launch(c.grid, c.block, 0, kd::unary_kernel<H, Unary::Relu>, x.data(), out.data(), n);
    CHECK(half_mismatch(out.values(), relu) == "");
    hl::launch(c.grid, c.block, 0, kd::unary_backward_kernel<H, Unary::Gelu>, x.data(), y.data(), out.data(), n);
    CHECK(half_mismatch(out.values(), dgelu) == "");
    if (n % cols == 0) {
      hl::launch(c.grid, c.block, 0, kd::add_bias_kernel<H, true>, x.data(), y.data(), out.data(), cols, n);
      CHECK(half_mismatch(out.values(), biased) == "");
    }
    CHECK((x.guards_intact() && y.guards_intact() && out.guards_intact()));
  });
}

template <class H>
void check_half_reductions(int64_t len, int64_t inner) {
  INFO("len ", len, ", inner ", inner);
  const int64_t outer = 3, outs = outer * inner;
  const auto in = half_values<H>(static_cast<std::size_t>(outer * len * inner), 83);
  // reduce_columns adds j in order, in float, and rounds once: the host's reduce_dim; a
  // mean multiplies the float sum by 1/len before that one rounding.
  const float scale = 1.f / static_cast<float>(len);
  std::vector<H> want(static_cast<std::size_t>(outs)), want_max(static_cast<std::size_t>(outs)),
      want_mean(static_cast<std::size_t>(outs));
  std::vector<double> exact(static_cast<std::size_t>(outs));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      float acc = 0, mx = -std::numeric_limits<float>::infinity();
      double e = 0;
      for (int64_t j = 0; j < len; ++j) {
        const float v = in[static_cast<std::size_t>((o * len + j) * inner + i)];
        acc += v, e += v, mx = std::max(mx, v);
      }
      want[static_cast<std::size_t>(o * inner + i)] = H(acc);
      want_mean[static_cast<std::size_t>(o * inner + i)] = H(acc * scale);
      want_max[static_cast<std::size_t>(o * inner + i)] = H(mx);
      exact[static_cast<std::size_t>(o * inner + i)] = e;
    }
  each_launch(stride_configs(outs, false), [&](const Config& c) {
    Buffer<H> x(in), out(static_cast<std::size_t>(outs));
    hl::launch(c.grid, c.block, 0, kd::reduce_columns<H, kd::SumOp>, x.data(), out.data(), len, inner, outs, 0.f,
               kd::SumOp{}, 1.f);
    CHECK(half_mismatch(out.values(), want) == "");
    hl::launch(c.grid, c.block, 0, kd::reduce_columns<H, kd::SumOp>, x.data(), out.data(), len, inner, outs, 0.f,
               kd::SumOp{}, scale);
    CHECK(half_mismatch(out.values(), want_mean) == "");
    hl::launch(c.grid, c.block, 0, kd::reduce_columns<H, kd::MaxOp>, x.data(), out.data(), len, inner, outs,
               -std::numeric_limits<float>::infinity(), kd::MaxOp{}, 1.f);
    CHECK(half_mismatch(out.values(), want_max) == "");
  });
  // reduce_rows adds in a tree: within one 16-bit rounding of the exact sum, plus the
  // float error of len additions of |x| <= 4.
  const double ulp = std::is_same_v<H, dtensor::bfloat16> ? 0x1p-8 : 0x1p-11;
  for (Order o : kOrders) {
    hl::ScopedOrder scoped(o);
    Buffer<H> x(in), out(static_cast<std::size_t>(outs));
    hl::launch(Dim3{2}, Dim3{kd::kThreads}, 0, kd::reduce_rows<H, kd::SumOp>, x.data(), out.data(), len, inner, outs,
               0.f, kd::SumOp{}, 1.f);
    const auto got = out.values();
    for (int64_t k = 0; k < outs; ++k) {
      const double e = exact[static_cast<std::size_t>(k)];
      CHECK(std::abs(float(got[static_cast<std::size_t>(k)]) - e) <= ulp * std::abs(e) + 4.0 * len * 0x1p-24 * 4);
    }
  }
}

}  // namespace

TEST_CASE("kernels on the host: bfloat16 and float16 elementwise kernels and reductions compute in float") {
  for_types<dtensor::bfloat16, dtensor::float16>([]<class H>() {
    INFO(type_name<H>());
    for (int64_t n : {0, 1, 7, 35, 1029}) {
      INFO("n = ", n);
      check_half_elementwise<H>(n);
    }
    check_half_reductions<H>(1, 5);
    check_half_reductions<H>(300, 1);
    check_half_reductions<H>(33, 40);
  });
}

TEST_CASE("kernels on the host: convert_runs is core/float16.hpp's rounding, every bit pattern and ties") {
  using dtensor::bfloat16;
  using dtensor::float16;
  using kd::Layout;
  // Every 16-bit pattern widened to float, and back: exact (NaN stays NaN).
  std::vector<std::uint16_t> bits(65536);
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<std::uint16_t>(i);
  const int64_t n = 65536;
  const auto all = kd::runs_of(dtensor::StridedBlock::contiguous(0, n));
  for_types<bfloat16, float16>([&]<class H>() {
    INFO(type_name<H>());
    std::vector<H> h(bits.size());
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = H::from_bits(bits[i]);
    Buffer<H> src(h), back(h.size());
    Buffer<float> wide(h.size());
    hl::launch(Dim3{kd::blocks_for(n)}, Dim3{kd::kThreads}, 0, kd::convert_runs<H, float, Layout::Contiguous>,
               src.data(), all, wide.data(), all, n);
    hl::launch(Dim3{kd::blocks_for(n)}, Dim3{kd::kThreads}, 0, kd::convert_runs<float, H, Layout::Contiguous>,
               wide.data(), all, back.data(), all, n);
    const auto w = wide.values();
    const auto b = back.values();
    int wrong = 0;
    for (std::size_t i = 0; i < h.size(); ++i) {
      const float f = float(h[i]);
      if (!(std::isnan(f) ? std::isnan(w[i]) : (w[i] == f && std::signbit(w[i]) == std::signbit(f)))) ++wrong;
      if (!same_half(b[i], h[i])) ++wrong;
    }
    CHECK(wrong == 0);
    // Floats and doubles in, strided: ties to even, overflow, the double rounded once.
    std::vector<double> d = {1.0 + 0x1p-8 + 0x1p-40, 1.0 + 0x1p-8, 1.0 + 3 * 0x1p-8, 1e39, -1e39, 65519.99,
                             65520.0, 0x1p-25, 3 * 0x1p-26, -0.0, std::numeric_limits<double>::quiet_NaN(), 0.1};
    while (d.size() < 40)
      d.push_back(std::ldexp(static_cast<double>(d.size()) * 0.37 - 7, static_cast<int>(d.size() % 9) - 4));
    std::vector<float> f(d.size());
    for (std::size_t i = 0; i < d.size(); ++i) f[i] = static_cast<float>(d[i]);
    const int64_t m = static_cast<int64_t>(d.size());
    // Source read as 4 runs of m/4 with stride m/4 + 3 (a strided block), destination contiguous.
    const int64_t run = m / 4, stride = run + 3;
    std::vector<double> ds(static_cast<std::size_t>(4 * stride), 99.0);
    std::vector<float> fs(ds.size(), 99.f);
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t k = 0; k < run; ++k)
        ds[static_cast<std::size_t>(r * stride + k)] = d[static_cast<std::size_t>(r * run + k)],
        fs[static_cast<std::size_t>(r * stride + k)] = f[static_cast<std::size_t>(r * run + k)];
    const kd::Runs strided{0, stride, run}, dense = kd::runs_of(dtensor::StridedBlock::contiguous(0, m));
    Buffer<double> dsrc(ds);
    Buffer<float> fsrc(fs);
    Buffer<H> from_d(d.size()), from_f(d.size());
    each_launch(stride_configs(m, false), [&](const Config& c) {
      hl::launch(c.grid, c.block, 0, kd::convert_runs<double, H, Layout::Strided>, dsrc.data(), strided,
                 from_d.data(), dense, m);
      hl::launch(c.grid, c.block, 0, kd::convert_runs<float, H, Layout::Strided>, fsrc.data(), strided,
                 from_f.data(), dense, m);
      const auto gd = from_d.values(), gf = from_f.values();
      for (std::size_t i = 0; i < d.size(); ++i) {
        INFO("value ", show(d[i]));
        CHECK(same_half(gd[i], H::from_double(d[i])));
        CHECK(same_half(gf[i], H(f[i])));
      }
    });
    // The double case that rounding through float gets wrong, by hand: bfloat16 of
    // 1 + 2^-8 + 2^-40 is 1 + 2^-7 (above the tie), through float it would be 1.
    if constexpr (std::is_same_v<H, bfloat16>) CHECK(float(from_d.values()[0]) == 1.0f + 0x1p-7f);
  });
}

TEST_CASE("kernels on the host: 16-bit reduce_runs, divide_runs, max_abs and row_affine") {
  for_types<dtensor::bfloat16, dtensor::float16>([]<class H>() {
    INFO(type_name<H>());
    using kd::Layout;
    const int64_t n = 1031;
    const auto a = half_values<H>(n, 91), b = half_values<H>(n, 92);
    const auto all = kd::runs_of(dtensor::StridedBlock::contiguous(0, n));
    std::vector<H> sum(n), mx(n), third(n);
    for (int64_t i = 0; i < n; ++i) {
      sum[i] = H(float(b[i]) + float(a[i]));
      mx[i] = float(a[i]) > float(b[i]) ? a[i] : b[i];
      third[i] = H(float(b[i]) / 3.f);
    }
    each_launch(stride_configs(n, false), [&](const Config& c) {
      Buffer<H> src(a), dst(b);
      hl::launch(c.grid, c.block, 0, kd::reduce_runs<H, Reduce::Sum, Layout::Contiguous>, src.data(), all,
                 dst.data(), all, n);
      CHECK(half_mismatch(dst.values(), sum) == "");
      Buffer<H> dst2(b);
      hl::launch(c.grid, c.block, 0, kd::reduce_runs<H, Reduce::Max, Layout::Strided>, src.data(), all, dst2.data(),
                 all, n);
      CHECK(half_mismatch(dst2.values(), mx) == "");
      Buffer<H> dst3(b);
      hl::launch(c.grid, c.block, 0, kd::divide_runs<H, Layout::Contiguous>, dst3.data(), all, 3.f, n);
      CHECK(half_mismatch(dst3.values(), third) == "");
    });
    // max_abs: |x| in float, a NaN anywhere gives NaN.
    for (bool with_nan : {false, true}) {
      auto v = a;
      if (with_nan) v[n / 3] = H(std::numeric_limits<float>::quiet_NaN());
      float want = 0;
      for (H x : v) want = std::max(want, std::abs(float(x)));
      Buffer<H> x(v);
      Buffer<H> out(1);
      hl::launch(Dim3{1}, Dim3{kd::kThreads}, 0, kd::reduce_all<H, float, H, kd::Magnitude, kd::MaxNanOp>, x.data(),
                 n, out.data(), 0.f, kd::Magnitude{}, kd::MaxNanOp{});
      const float got = out.values()[0];
      if (with_nan) CHECK(std::isnan(got));
      else CHECK(got == want);
    }
    // sum_squares: the double sum of the squares, never rounded to 16 bits (1029 values
    // of 4: 16464 is no float16 sum to stop at, nor a bfloat16 one).
    {
      std::vector<H> fours(1029, H(4.f));
      for (const auto& v : {a, fours}) {
        double exact = 0;
        for (H x : v) exact += double(float(x)) * double(float(x));
        Buffer<H> x(v);
        Buffer<double> out(1);
        hl::launch(Dim3{1}, Dim3{kd::kThreads}, 0, kd::reduce_all<H, double, double, kd::Square<double>, kd::SumOp>,
                   x.data(), static_cast<int64_t>(v.size()), out.data(), 0.0, kd::Square<double>{}, kd::SumOp{});
        CHECK(std::abs(out.values()[0] - exact) <= 1e-12 * exact);
        CHECK(out.guards_intact());
      }
    }
    // scatter_add_rows into a float copy of the table (kernels.cu's 16-bit path): a row
    // hit 300 times by ones adds to exactly 300 + its old value in float, rounded once
    // (a bfloat16 running sum would stall at 256), bit for bit the host's.
    {
      const int64_t table_rows = 7, cols = 3, rows = 320;
      std::vector<int64_t> index(rows);
      for (int64_t i = 0; i < rows; ++i) index[i] = i < 300 ? 12 : 10 + i % 9;  // lo = 10: some outside the block
      std::vector<H> dy(rows * cols, H(1.f)), table = half_values<H>(table_rows * cols, 93);
      std::vector<H> want = table;
      dtensor::compute::scatter_add_rows(dtensor::Device::host(), dy.data(), index.data(), rows, cols, 10,
                                         want.data(), table_rows);
      // Row 2 (index 12) is hit 302 times (300, and i = 308, 317): within one rounding.
      CHECK(std::abs(float(want[2 * cols]) - (302.f + float(table[2 * cols]))) <= 1.f);
      const int64_t chunk = kd::scatter_chunk(table_rows, cols), items = (table_rows + chunk - 1) / chunk * cols;
      each_launch(stride_configs(items, false), [&](const Config& c) {
        std::vector<float> wide(table.size());
        for (std::size_t i = 0; i < table.size(); ++i) wide[i] = float(table[i]);
        Buffer<H> g(dy);
        Buffer<int64_t> idx(index);
        Buffer<float> tb(wide);
        hl::launch(c.grid, c.block, 0, kd::scatter_add_rows_kernel<H, float>, g.data(), idx.data(), rows, cols,
                   int64_t{10}, tb.data(), table_rows, chunk, items);
        std::vector<H> got;
        for (float f : tb.values()) got.push_back(H(f));
        CHECK(half_mismatch(got, want) == "");
      });
    }
    // row_affine: the host's 16-bit map (float arithmetic, one rounding), within one
    // 16-bit unit of rounding (the two compilations may contract a product and a sum
    // into one fused operation differently).
    const int64_t rows = 5, cols = 206;
    std::vector<double> center = {0.5, -1, 2, 0, 0.25}, scale = {2, 0.5, 1, 3, -1}, bs = {1, 0.5, -2, 0, 1},
                        offset = {0.1, 0.2, 0.3, 0.4, 0.5};
    std::vector<double> cscale(cols), coff(cols);
    for (int64_t j = 0; j < cols; ++j) cscale[j] = 1 + 0.01 * j, coff[j] = -0.02 * j;
    const dtensor::RowTerms host_terms{center.data(), scale.data(), bs.data(), offset.data(), cscale.data(),
                                       coff.data()};
    std::vector<H> want(rows * cols);
    dtensor::compute::row_affine(dtensor::Device::host(), a.data(), b.data(), host_terms, rows, cols, want.data());
    const double ulp = std::is_same_v<H, dtensor::bfloat16> ? 0x1p-7 : 0x1p-10;
    each_launch(stride_configs(rows * cols, false), [&](const Config& c) {
      Buffer<H> x(a), y(b), out(rows * cols);
      hl::launch(c.grid, c.block, 0, kd::row_affine_kernel<H>, x.data(), y.data(), host_terms, cols, out.data(),
                 rows * cols);
      const auto got = out.values();
      for (int64_t e = 0; e < rows * cols; ++e)
        REQUIRE(std::abs(float(got[e]) - float(want[e])) <= ulp * std::max(1.f, std::abs(float(want[e]))));
    });
  });
}
