// The CUDA kernels of kernels/, each against a host reference: the host paths of
// core/block.hpp where they exist, plain loops (in double where rounding matters)
// elsewhere. Everything runs on one stream of the test's own, with uploads and
// downloads ordered on it, so a case needs no device-wide synchronization.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "dtensor/core/block.hpp"
#include "dtensor/compute/attention.hpp"
#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/kernels.hpp"
#include "dtensor/cuda/memory.hpp"
#include "dtensor/cuda/stream.hpp"

namespace {

namespace k = dtensor::cuda::kernels;
using dtensor::StridedBlock;
using dtensor::DType;
using dtensor::dtype_of;
using dtensor::ReduceOp;

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { DTENSOR_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return s; }
};

// A device array whose transfers are ordered on the test's stream.
template <class T>
class Device {
 public:
  Device(const std::vector<T>& h, cudaStream_t s) : n_(h.size()), s_(s) {
    if (n_ == 0) return;
    DTENSOR_CUDA(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
    DTENSOR_CUDA(cudaMemcpyAsync(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, s_));
    // The pageable source is staged before cudaMemcpyAsync returns, but syncing here
    // keeps the test independent of that detail.
    DTENSOR_CUDA(cudaStreamSynchronize(s_));
  }
  ~Device() { (void)cudaFree(p_); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  T* get() const { return p_; }
  // Waits for the stream's work, then copies back.
  std::vector<T> host() const {
    std::vector<T> h(n_);
    if (n_ == 0) return h;
    DTENSOR_CUDA(cudaMemcpyAsync(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, s_));
    DTENSOR_CUDA(cudaStreamSynchronize(s_));
    return h;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
  cudaStream_t s_;
};

template <class T>
std::vector<T> random_values(std::size_t n, double lo, double hi, unsigned seed = 1) {
  if constexpr (std::is_unsigned_v<T>) lo = std::max(lo, 0.0);  // a negative double has no unsigned value
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

template <class T>
std::vector<T> iota_values(std::size_t n, T start = T(0)) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(start + static_cast<T>(i));
  return v;
}

template <class T>
double default_tol() {
  return std::is_same_v<T, float> ? 1e-6 : 1e-12;
}

// Reports the first element out of tolerance (one CHECK per array, not per element):
// |got - want| <= rel |want| + abs, abs by default the type's smallest normal (a floor
// for exact zeros).
template <class T>
void check_close(const std::vector<T>& got, const std::vector<T>& want, double rel, const char* what,
                 double abs = static_cast<double>(std::numeric_limits<T>::min())) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const bool same_inf = std::isinf(w) && g == w;
    if (!same_inf && !(std::abs(g - w) <= rel * std::abs(w) + abs)) {
      INFO("element ", i, ": got ", g, ", want ", w);
      CHECK(false);
      return;
    }
  }
}

template <class T>
void check_equal(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i])) {
      INFO("element ", i, ": got ", +got[i], ", want ", +want[i]);
      CHECK(false);
      return;
    }
}

// --- copy_block ---

// Copies src[sb] to dst[db] on the device and on the host (core/block.hpp's
// copy_block), with every other element of dst left as it was, and compares.
template <class T>
void check_copy(StridedBlock sb, std::size_t src_n, StridedBlock db, std::size_t dst_n, cudaStream_t s) {
  INFO("src {", sb.offset, ",", sb.count, ",", sb.stride, ",", sb.len, "} dst {", db.offset, ",", db.count, ",",
       db.stride, ",", db.len, "} element size ", sizeof(T));
  std::vector<T> src(src_n), dst(dst_n);
  for (std::size_t i = 0; i < src_n; ++i) std::memset(&src[i], static_cast<int>(i % 251 + 1), sizeof(T));
  std::memset(dst.data(), 0, dst_n * sizeof(T));
  Device<T> d_src(src, s), d_dst(dst, s);
  k::copy_block(d_src.get(), sb, d_dst.get(), db, sizeof(T), s);
  dtensor::detail::copy_block(src.data(), sb, dst.data(), db, sizeof(T));
  const auto got = d_dst.host();
  CHECK(std::memcmp(got.data(), dst.data(), dst_n * sizeof(T)) == 0);
}

struct Bytes12 {  // an element size the kernels have no word for: moved as bytes
  unsigned char b[12];
};

TEST_CASE("copy_block: blocks cut into different runs, every element size") {
  Stream s;
  // 3 runs of 4, 7 apart, into 2 runs of 6, 9 apart.
  const StridedBlock sb{1, 3, 7, 4}, db{2, 2, 9, 6};
  check_copy<std::int8_t>(sb, 22, db, 20, s);
  check_copy<std::uint16_t>(sb, 22, db, 20, s);
  check_copy<float>(sb, 22, db, 20, s);
  check_copy<double>(sb, 22, db, 20, s);
  check_copy<Bytes12>(sb, 22, db, 20, s);
  // Even offsets, strides and runs: 4-byte elements move as 8-byte words.
  check_copy<float>(StridedBlock{0, 4, 10, 6}, 40, StridedBlock{2, 3, 12, 8}, 40, s);
  check_copy<std::int8_t>(StridedBlock{8, 4, 16, 8}, 80, StridedBlock{0, 2, 24, 16}, 48, s);
  // A strided side against a contiguous one.
  check_copy<float>(StridedBlock{3, 5, 11, 7}, 60, StridedBlock::contiguous(4, 35), 40, s);
  check_copy<double>(StridedBlock::contiguous(0, 35), 35, StridedBlock{1, 7, 6, 5}, 48, s);
}

TEST_CASE("copy_block: contiguous, equal runs, and empty") {
  Stream s;
  check_copy<float>(StridedBlock::contiguous(5, 1000), 1005, StridedBlock::contiguous(3, 1000), 1003, s);
  check_copy<std::int8_t>(StridedBlock::contiguous(1, 77), 78, StridedBlock::contiguous(0, 77), 77, s);
  // Contiguous written as several runs (stride == len) against one run.
  check_copy<float>(StridedBlock{0, 4, 25, 25}, 100, StridedBlock::contiguous(0, 100), 100, s);
  // Equal runs: wide ones go to a 2-D copy, narrow ones to the kernel.
  check_copy<float>(StridedBlock{2, 5, 100, 80}, 500, StridedBlock{1, 5, 90, 80}, 450, s);
  check_copy<double>(StridedBlock{0, 6, 5, 3}, 30, StridedBlock{1, 6, 4, 3}, 25, s);
  check_copy<float>(StridedBlock{0, 0, 5, 3}, 1, StridedBlock{0, 0, 4, 3}, 1, s);  // no runs
  k::copy_block(nullptr, StridedBlock{0, 3, 5, 0}, nullptr, StridedBlock{0, 0, 0, 0}, 4, s);
  CHECK_THROWS_AS(k::copy_block(nullptr, StridedBlock::contiguous(0, 3), nullptr, StridedBlock::contiguous(0, 4), 4, s),
                  dtensor::InvalidArgument);
}

// --- reduce_block, divide_block, fill ---

template <class T>
void check_reduce_block(ReduceOp op, StridedBlock sb, std::size_t src_n, StridedBlock db, std::size_t dst_n,
                        cudaStream_t s) {
  INFO("op ", dtensor::name(op), ", ", dtensor::name(dtype_of<T>()));
  const auto src = random_values<T>(src_n, -50, 50, 2);
  auto dst = random_values<T>(dst_n, -50, 50, 3);
  Device<T> d_src(src, s), d_dst(dst, s);
  k::reduce_block(dtype_of<T>(), op, d_src.get(), sb, d_dst.get(), db, s);
  dtensor::detail::reduce_block(dtype_of<T>(), op, src.data(), sb, dst.data(), db);
  check_equal(d_dst.host(), dst, "reduce_block");  // one operation per element: exact
  if (op == ReduceOp::Avg) {
    k::divide_block(dtype_of<T>(), d_dst.get(), db, 3, s);
    dtensor::detail::divide_block(dtype_of<T>(), dst.data(), db, 3);
    check_equal(d_dst.host(), dst, "divide_block");
  }
}

TEST_CASE("reduce_block and divide_block") {
  Stream s;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg}) {
    check_reduce_block<float>(op, StridedBlock{1, 3, 7, 4}, 22, StridedBlock{2, 2, 9, 6}, 20, s);
    check_reduce_block<double>(op, StridedBlock::contiguous(3, 1000), 1003, StridedBlock::contiguous(0, 1000), 1000, s);
    check_reduce_block<std::int32_t>(op, StridedBlock{0, 4, 10, 6}, 40, StridedBlock{2, 3, 12, 8}, 40, s);
    check_reduce_block<std::int8_t>(op, StridedBlock::contiguous(0, 300), 300, StridedBlock{0, 3, 150, 100}, 400, s);
    check_reduce_block<std::uint64_t>(op, StridedBlock{5, 2, 9, 4}, 20, StridedBlock::contiguous(1, 8), 9, s);
  }
  // divide_block on a strided block leaves the gaps alone.
  std::vector<float> v = iota_values<float>(30, 1.0f);
  Device<float> d(v, s);
  const StridedBlock b{1, 3, 10, 4};
  k::divide_block(DType::Float32, d.get(), b, 4, s);
  dtensor::detail::divide_block(DType::Float32, v.data(), b, 4);
  check_equal(d.host(), v, "strided divide_block");
  k::divide_block(DType::Float32, nullptr, StridedBlock{0, 0, 0, 0}, 4, s);  // empty
}

template <class T>
void check_fill(double value, std::size_t n, cudaStream_t s) {
  INFO("fill ", dtensor::name(dtype_of<T>()), " with ", value);
  Device<T> d(std::vector<T>(n + 1, T(99)), s);
  k::fill(dtype_of<T>(), d.get(), static_cast<int64_t>(n), dtensor::Scalar::of(static_cast<T>(value)), s);
  std::vector<T> want(n, static_cast<T>(value));
  want.push_back(T(99));  // past the end: untouched
  const auto got = d.host();
  check_equal(got, want, "fill");
  if constexpr (std::is_floating_point_v<T>)
    CHECK(std::signbit(got[0]) == std::signbit(value));
}

TEST_CASE("fill") {
  Stream s;
  check_fill<float>(1.5, 1000, s);
  check_fill<float>(0.0, 1000, s);
  check_fill<float>(-0.0, 10, s);
  check_fill<double>(-2.25, 777, s);
  check_fill<std::int32_t>(-7, 513, s);
  check_fill<std::int8_t>(-3, 100, s);
  check_fill<std::uint8_t>(200, 100, s);
  check_fill<std::uint64_t>(0, 100, s);
  check_fill<std::int64_t>(-123456789012.0, 5, s);
  k::fill(DType::Float32, nullptr, 0, dtensor::Scalar::of(1.0f), s);  // empty
  // 64-bit integers travel exactly (a double would round these).
  check_fill<std::int64_t>(0, 3, s);
  {
    const std::int64_t big = std::numeric_limits<std::int64_t>::max() - 2;
    Device<std::int64_t> d(std::vector<std::int64_t>(3, 0), s);
    k::fill(DType::Int64, d.get(), 3, dtensor::Scalar::of(big), s);
    check_equal(d.host(), std::vector<std::int64_t>(3, big), "fill int64 near max");
  }
}

// --- elementwise ---

template <class T>
T host_binary(k::Binary op, T a, T b) {
  switch (op) {
    case k::Binary::Add: return static_cast<T>(a + b);
    case k::Binary::Sub: return static_cast<T>(a - b);
    case k::Binary::Mul: return static_cast<T>(a * b);
    default: return static_cast<T>(a / b);
  }
}

// The reference in double, rounded once to T: only the kernel's error is measured.
template <class T>
T host_unary(k::Unary f, T a) {
  const double x = static_cast<double>(a);
  switch (f) {
    case k::Unary::Neg: return static_cast<T>(-x);
    case k::Unary::Exp: return static_cast<T>(std::exp(x));
    case k::Unary::Log: return static_cast<T>(std::log(x));
    case k::Unary::Sqrt: return static_cast<T>(std::sqrt(x));
    case k::Unary::Abs: return static_cast<T>(std::abs(x));
    case k::Unary::Relu: return static_cast<T>(x < 0 ? 0.0 : x);
    case k::Unary::Tanh: return static_cast<T>(std::tanh(x));
    default: return static_cast<T>(1.0 / (1.0 + std::exp(-x)));
  }
}

template <class T>
void check_elementwise(cudaStream_t s) {
  INFO(dtensor::name(dtype_of<T>()));
  const std::size_t n = 100003;
  const auto a = random_values<T>(n, -3, 3, 4);
  const auto b = random_values<T>(n, 0.5, 2, 5);  // nonzero divisors
  Device<T> da(a, s), db(b, s), dout(std::vector<T>(n), s);
  for (k::Binary op : {k::Binary::Add, k::Binary::Sub, k::Binary::Mul, k::Binary::Div}) {
    INFO("binary op ", static_cast<int>(op));
    std::vector<T> want(n), want_s(n);
    const T scalar = static_cast<T>(1.25);
    for (std::size_t i = 0; i < n; ++i) {
      want[i] = host_binary(op, a[i], b[i]);
      want_s[i] = host_binary(op, a[i], scalar);
    }
    k::binary(dtype_of<T>(), op, da.get(), db.get(), dout.get(), static_cast<int64_t>(n), s);
    check_close(dout.host(), want, default_tol<T>(), "binary");
    k::binary_scalar(dtype_of<T>(), op, da.get(), dtensor::Scalar::of(scalar), dout.get(), static_cast<int64_t>(n), s);
    check_close(dout.host(), want_s, default_tol<T>(), "binary_scalar");
  }
  // In place: out aliases a.
  Device<T> dinplace(a, s);
  k::binary(dtype_of<T>(), k::Binary::Mul, dinplace.get(), db.get(), dinplace.get(), static_cast<int64_t>(n), s);
  std::vector<T> prod(n);
  for (std::size_t i = 0; i < n; ++i) prod[i] = a[i] * b[i];
  check_close(dinplace.host(), prod, default_tol<T>(), "binary in place");

  const auto positive = random_values<T>(n, 0.05, 4, 6);  // for log and sqrt
  Device<T> dpos(positive, s);
  for (k::Unary f : {k::Unary::Neg, k::Unary::Exp, k::Unary::Log, k::Unary::Sqrt, k::Unary::Abs, k::Unary::Relu,
                     k::Unary::Tanh, k::Unary::Sigmoid}) {
    INFO("unary op ", static_cast<int>(f));
    const bool needs_positive = f == k::Unary::Log || f == k::Unary::Sqrt;
    const auto& x = needs_positive ? positive : a;
    std::vector<T> want(n);
    for (std::size_t i = 0; i < n; ++i) want[i] = host_unary(f, x[i]);
    k::unary(dtype_of<T>(), f, (needs_positive ? dpos : da).get(), dout.get(), static_cast<int64_t>(n), s);
    check_close(dout.host(), want, default_tol<T>(), "unary");
  }
}

TEST_CASE("binary, binary_scalar and unary in float and double") {
  Stream s;
  check_elementwise<float>(s);
  check_elementwise<double>(s);
}

TEST_CASE("elementwise on integers") {
  Stream s;
  const std::size_t n = 5000;
  std::vector<std::int32_t> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = static_cast<std::int32_t>(i * 7919 % 20011) - 10000;
    b[i] = static_cast<std::int32_t>(i * 104729 % 3001) - 1500;
  }
  Device<std::int32_t> da(a, s), db(b, s), dout(std::vector<std::int32_t>(n), s);
  std::vector<std::int32_t> want(n);

  k::binary(DType::Int32, k::Binary::Add, da.get(), db.get(), dout.get(), static_cast<int64_t>(n), s);
  for (std::size_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
  check_equal(dout.host(), want, "int32 add");

  k::binary_scalar(DType::Int32, k::Binary::Div, da.get(), dtensor::Scalar::of(std::int32_t{7}), dout.get(),
                   static_cast<int64_t>(n), s);
  for (std::size_t i = 0; i < n; ++i) want[i] = a[i] / 7;  // truncating, as in C++
  check_equal(dout.host(), want, "int32 div by scalar");

  k::unary(DType::Int32, k::Unary::Neg, da.get(), dout.get(), static_cast<int64_t>(n), s);
  for (std::size_t i = 0; i < n; ++i) want[i] = -a[i];
  check_equal(dout.host(), want, "int32 neg");
  k::unary(DType::Int32, k::Unary::Abs, da.get(), dout.get(), static_cast<int64_t>(n), s);
  for (std::size_t i = 0; i < n; ++i) want[i] = std::abs(a[i]);
  check_equal(dout.host(), want, "int32 abs");
  k::unary(DType::Int32, k::Unary::Relu, da.get(), dout.get(), static_cast<int64_t>(n), s);
  for (std::size_t i = 0; i < n; ++i) want[i] = std::max(a[i], 0);
  check_equal(dout.host(), want, "int32 relu");

  CHECK_THROWS_AS(k::unary(DType::Int32, k::Unary::Exp, da.get(), dout.get(), 1, s), dtensor::InvalidArgument);
  CHECK_THROWS_AS(k::unary(DType::UInt8, k::Unary::Sigmoid, nullptr, nullptr, 0, s), dtensor::InvalidArgument);
  k::binary(DType::Float32, k::Binary::Add, nullptr, nullptr, nullptr, 0, s);  // empty: nothing launched
}

TEST_CASE("add_bias along rows and along columns") {
  Stream s;
  const int64_t rows = 37, cols = 53;
  const auto m = random_values<float>(rows * cols, -1, 1, 7);
  const auto vr = random_values<float>(cols, -1, 1, 8);
  const auto vc = random_values<float>(rows, -1, 1, 9);
  Device<float> dm(m, s), dvr(vr, s), dvc(vc, s), dout(std::vector<float>(rows * cols), s);
  std::vector<float> want(rows * cols);

  k::add_bias(DType::Float32, dm.get(), dvr.get(), dout.get(), rows, cols, true, s);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) want[r * cols + c] = m[r * cols + c] + vr[c];
  check_equal(dout.host(), want, "along rows");

  k::add_bias(DType::Float32, dm.get(), dvc.get(), dm.get(), rows, cols, false, s);  // in place
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) want[r * cols + c] = m[r * cols + c] + vc[r];
  check_equal(dm.host(), want, "along columns, in place");
}

template <class T>
void check_transpose(int64_t rows, int64_t cols, cudaStream_t s) {
  INFO(rows, " x ", cols, " ", dtensor::name(dtype_of<T>()));
  const auto in = iota_values<T>(static_cast<std::size_t>(rows * cols));
  Device<T> din(in, s), dout(std::vector<T>(rows * cols), s);
  k::transpose(dtype_of<T>(), din.get(), dout.get(), rows, cols, s);
  std::vector<T> want(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) want[c * rows + r] = in[r * cols + c];
  check_equal(dout.host(), want, "transpose");
}

TEST_CASE("transpose") {
  Stream s;
  check_transpose<float>(37, 53, s);
  check_transpose<double>(53, 37, s);
  check_transpose<std::int8_t>(37, 53, s);
  check_transpose<float>(64, 32, s);  // whole tiles
  check_transpose<float>(1, 100, s);  // vectors: a copy
  check_transpose<float>(100, 1, s);
  check_transpose<float>(3, 1000, s);
  k::transpose(DType::Float32, nullptr, nullptr, 0, 5, s);
}

// --- reductions ---

template <class T>
std::vector<T> host_reduce_dim(k::Reduce r, const std::vector<T>& in, int64_t outer, int64_t len, int64_t inner) {
  using L = std::numeric_limits<T>;
  std::vector<T> out(static_cast<std::size_t>(outer * inner));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      // Sums in double: the reference should not carry float's rounding.
      double sum = 0;
      T best = r == k::Reduce::Max ? (L::has_infinity ? -L::infinity() : L::lowest())
                                   : (L::has_infinity ? L::infinity() : L::max());
      for (int64_t j = 0; j < len; ++j) {
        const T v = in[(o * len + j) * inner + i];
        sum += static_cast<double>(v);
        if (r == k::Reduce::Max) best = std::max(best, v);
        if (r == k::Reduce::Min) best = std::min(best, v);
      }
      out[o * inner + i] = r == k::Reduce::Sum ? static_cast<T>(sum) : best;
    }
  return out;
}

template <class T>
void check_reduce_dim(int64_t outer, int64_t len, int64_t inner, double sum_tol, cudaStream_t s) {
  INFO("[", outer, ", ", len, ", ", inner, "] ", dtensor::name(dtype_of<T>()));
  // Positive floats, so that sums do not cancel and a relative tolerance is fair;
  // small integers, so that sums fit an int8.
  const auto in = std::is_floating_point_v<T> ? random_values<T>(outer * len * inner, 0, 1, 10)
                                              : random_values<T>(outer * len * inner, -10, 10, 10);
  Device<T> din(in, s), dout(std::vector<T>(outer * inner, T(42)), s);
  for (k::Reduce r : {k::Reduce::Sum, k::Reduce::Max, k::Reduce::Min}) {
    INFO("reduction ", static_cast<int>(r));
    k::reduce_dim(dtype_of<T>(), r, din.get(), dout.get(), outer, len, inner, dtensor::Scalar::of(T(1)), s);
    const auto want = host_reduce_dim(r, in, outer, len, inner);
    if (r == k::Reduce::Sum && std::is_floating_point_v<T>) check_close(dout.host(), want, sum_tol, "sum");
    else check_equal(dout.host(), want, "max, min or integer sum");
  }
}

TEST_CASE("reduce_dim") {
  Stream s;
  check_reduce_dim<float>(3, 0, 5, 0, s);  // the identities
  check_reduce_dim<std::int32_t>(3, 0, 5, 0, s);
  check_reduce_dim<float>(2, 7, 3, 1e-6, s);  // a thread per output
  check_reduce_dim<double>(2, 7, 3, 1e-12, s);
  check_reduce_dim<std::int32_t>(2, 7, 3, 0, s);
  check_reduce_dim<std::int8_t>(4, 9, 2, 0, s);
  check_reduce_dim<float>(2, 100, 3, 1e-6, s);  // a block per output, narrow inner
  check_reduce_dim<float>(3, 40, 64, 1e-6, s);  // a block per output, few outputs
  check_reduce_dim<double>(5, 40, 1000, 1e-12, s);  // a thread per output, many outputs
  // One long row: float sums of a million terms, in a thread's sequence then a tree.
  check_reduce_dim<float>(1, 1000003, 1, 1e-4, s);
  check_reduce_dim<double>(1, 1000003, 1, 1e-12, s);
  k::reduce_dim(DType::Float32, k::Reduce::Sum, nullptr, nullptr, 0, 5, 3, dtensor::Scalar::of(1.f),
                s);  // no outputs
}

template <class T>
void check_norms(std::size_t n, cudaStream_t s) {
  INFO("n = ", n, " ", dtensor::name(dtype_of<T>()));
  // Integers small enough that a million squares fit an int32.
  const auto a = std::is_floating_point_v<T> ? random_values<T>(n, -2, 2, 11) : random_values<T>(n, -20, 20, 11);
  Device<T> da(a, s), dout(std::vector<T>{T(42)}, s);
  double sum = 0;
  T max = 0;
  for (T x : a) {
    sum += static_cast<double>(x) * static_cast<double>(x);
    max = std::max(max, static_cast<T>(std::abs(x)));
  }
  k::sum_squares(dtype_of<T>(), n ? da.get() : nullptr, static_cast<int64_t>(n), dout.get(), s);
  if constexpr (std::is_floating_point_v<T>)
    check_close(dout.host(), std::vector<T>{static_cast<T>(sum)}, default_tol<T>(), "sum_squares");
  else check_equal(dout.host(), std::vector<T>{static_cast<T>(sum)}, "sum_squares");
  k::max_abs(dtype_of<T>(), n ? da.get() : nullptr, static_cast<int64_t>(n), dout.get(), s);
  check_equal(dout.host(), std::vector<T>{max}, "max_abs");
}

TEST_CASE("sum_squares and max_abs") {
  Stream s;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, (std::size_t{1} << 20) + 7}) {
    check_norms<float>(n, s);
    check_norms<double>(n, s);
    check_norms<std::int32_t>(n, s);
  }
  check_norms<std::int64_t>(1000, s);
  // A NaN anywhere makes max_abs NaN.
  std::vector<float> v = random_values<float>(5000, -1, 1, 12);
  v[4321] = std::numeric_limits<float>::quiet_NaN();
  Device<float> dv(v, s), dout(std::vector<float>{0.0f}, s);
  k::max_abs(DType::Float32, dv.get(), static_cast<int64_t>(v.size()), dout.get(), s);
  CHECK(std::isnan(dout.host()[0]));
}

// softmax as dtensor runs it: the maxima by reduce_dim, then shift and finish.
template <class T>
void check_softmax(int64_t outer, int64_t len, int64_t inner, bool log, cudaStream_t s) {
  INFO("[", outer, ", ", len, ", ", inner, "] ", dtensor::name(dtype_of<T>()), log ? " log-softmax" : " softmax");
  const auto x = random_values<T>(outer * len * inner, -5, 5, 13);
  Device<T> dx(x, s), dmax(std::vector<T>(outer * inner), s), dsums(std::vector<T>(outer * inner, T(42)), s);
  k::reduce_dim(dtype_of<T>(), k::Reduce::Max, dx.get(), dmax.get(), outer, len, inner, dtensor::Scalar::of(T(1)),
                s);
  k::softmax_shift(dtype_of<T>(), dx.get(), dmax.get(), dsums.get(), outer, len, inner, log, s);

  std::vector<T> want(x.size()), want_sums(outer * inner);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double m = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t j = 0; j < len; ++j) m = std::max(m, static_cast<double>(x[(o * len + j) * inner + i]));
      for (int64_t j = 0; j < len; ++j) sum += std::exp(static_cast<double>(x[(o * len + j) * inner + i]) - m);
      want_sums[o * inner + i] = static_cast<T>(sum);
      for (int64_t j = 0; j < len; ++j) {
        const std::size_t e = static_cast<std::size_t>((o * len + j) * inner + i);
        const double shifted = static_cast<double>(x[e]) - m;
        want[e] = static_cast<T>(log ? shifted - std::log(sum) : std::exp(shifted) / sum);
      }
    }
  // A few roundings of exp and the sum, rather than one; and an absolute term, since
  // x - max - log(sum) can cancel to near zero.
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  check_close(dsums.host(), want_sums, tol, "sums");
  k::softmax_finish(dtype_of<T>(), dx.get(), dsums.get(), outer, len, inner, log, s);
  check_close(dx.host(), want, tol, "softmax", tol);
}

TEST_CASE("softmax_shift and softmax_finish") {
  Stream s;
  for (bool log : {false, true}) {
    check_softmax<float>(2, 5, 3, log, s);
    check_softmax<double>(2, 5, 3, log, s);
    check_softmax<float>(3, 100, 1, log, s);  // a block per row
    check_softmax<double>(2, 1000, 2, log, s);
  }
  k::softmax_shift(DType::Float32, nullptr, nullptr, nullptr, 0, 5, 3, false, s);  // empty
  k::softmax_finish(DType::Float32, nullptr, nullptr, 2, 0, 3, true, s);
  CHECK_THROWS_AS(k::softmax_finish(DType::Int32, nullptr, nullptr, 1, 1, 1, true, s), dtensor::InvalidArgument);
}

// --- attention (kernels/attention.cuh) against the host's tiled core ---

template <class T>
void check_attention(const dtensor::compute::AttentionDims& d, bool with_mask, cudaStream_t s) {
  INFO(dtensor::name(dtype_of<T>()), ": batch ", d.batch, ", heads ", d.heads, "/", d.kv_heads, ", lengths ", d.q_len,
       "/", d.kv_len, ", head dim ", d.head_dim, d.causal ? ", causal" : "", ", dropout ", d.dropout.p,
       with_mask ? ", mask" : "");
  const int64_t D = d.head_dim, nq = d.batch * d.heads * d.q_len * D, nkv = d.batch * d.kv_heads * d.kv_len * D;
  const int64_t rows = d.batch * d.heads * d.q_len;
  const auto q = random_values<T>(nq, -1, 1, 31), kk = random_values<T>(nkv, -1, 1, 32),
             v = random_values<T>(nkv, -1, 1, 33), dout = random_values<T>(nq, -1, 1, 34);
  const auto mask = with_mask ? random_values<T>(d.q_len * d.kv_len, -2, 2, 35) : std::vector<T>{};
  std::vector<T> o(nq), lse(rows), dq(nq), dk(nkv), dv(nkv);
  const T* hm = with_mask ? mask.data() : nullptr;
  dtensor::compute::attention_forward(d, q.data(), kk.data(), v.data(), hm, o.data(), lse.data());
  dtensor::compute::attention_backward(d, q.data(), kk.data(), v.data(), hm, o.data(), lse.data(), dout.data(),
                                       dq.data(), dk.data(), dv.data());
  Device<T> gq(q, s), gk(kk, s), gv(v, s), gm(mask, s), gdo(dout, s);
  Device<T> go(std::vector<T>(nq, T(7)), s), gl(std::vector<T>(rows, T(7)), s);  // every element must be written
  Device<T> gdq(std::vector<T>(nq, T(7)), s), gdk(std::vector<T>(nkv, T(7)), s), gdv(std::vector<T>(nkv, T(7)), s);
  const T* dm = with_mask ? gm.get() : nullptr;
  k::attention_forward(dtype_of<T>(), d, gq.get(), gk.get(), gv.get(), dm, go.get(), gl.get(), s);
  // Sums of up to kv_len terms in another order than the host's.
  const double tol = std::is_same_v<T, float> ? 3e-5 : 1e-12;
  check_close(go.host(), o, tol, "o", tol);
  check_close(gl.host(), lse, tol, "lse", tol);
  k::attention_backward(dtype_of<T>(), d, gq.get(), gk.get(), gv.get(), dm, go.get(), gl.get(), gdo.get(), gdq.get(),
                        gdk.get(), gdv.get(), s);
  check_close(gdq.host(), dq, 3 * tol, "dq", 3 * tol);
  check_close(gdk.host(), dk, 3 * tol, "dk", 3 * tol);
  check_close(gdv.host(), dv, 3 * tol, "dv", 3 * tol);
}

TEST_CASE("attention_forward and attention_backward equal the host's tiled core") {
  using dtensor::compute::AttentionDims;
  Stream s;
  const AttentionDims plain{.batch = 2, .heads = 8, .kv_heads = 2, .q_len = 197, .kv_len = 230, .head_dim = 64};
  AttentionDims causal = plain;
  causal.causal = true, causal.q_offset = 300, causal.kv_offset = 250;  // a block of a longer sequence
  AttentionDims dropout = causal;
  dropout.dropout = {.p = 0.2, .seed = 5, .stream = 3, .batch_offset = 2, .head_offset = 8, .heads_total = 16,
                     .q_total = 600, .kv_total = 600};
  const AttentionDims wide{.batch = 1, .heads = 4, .kv_heads = 4, .q_len = 300, .kv_len = 300, .head_dim = 128,
                           .causal = true};
  const AttentionDims odd{.batch = 3, .heads = 3, .kv_heads = 1, .q_len = 33, .kv_len = 65, .head_dim = 7};
  for (const AttentionDims& d : {plain, causal, dropout, wide, odd}) {
    check_attention<float>(d, false, s);
    check_attention<double>(d, false, s);
  }
  check_attention<float>(causal, true, s);
  check_attention<double>(odd, true, s);
  const AttentionDims long_seq{.batch = 1, .heads = 2, .kv_heads = 1, .q_len = 2048, .kv_len = 2048, .head_dim = 64,
                               .causal = true};
  check_attention<float>(long_seq, false, s);
  // Empty blocks: nothing launched, and the gradients of k and v still written (zeros).
  const AttentionDims no_queries{.batch = 1, .heads = 2, .kv_heads = 1, .q_len = 0, .kv_len = 5, .head_dim = 8};
  check_attention<float>(no_queries, false, s);
  CHECK_THROWS_AS(k::attention_forward(DType::Int32, plain, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, s),
                  dtensor::InvalidArgument);
  // The ring's merge of two partial results, rows with no key on either side included.
  {
    const int64_t rows = 300, dim = 64;
    auto o = random_values<double>(rows * dim, -1, 1, 51), ob = random_values<double>(rows * dim, -1, 1, 52);
    auto lse = random_values<double>(rows, -3, 3, 53), lb = random_values<double>(rows, -3, 3, 54);
    lse[3] = -std::numeric_limits<double>::infinity();
    lb[5] = -std::numeric_limits<double>::infinity();
    lse[7] = lb[7] = -std::numeric_limits<double>::infinity();
    Device<double> go(o, s), gl(lse, s), gob(ob, s), glb(lb, s);
    dtensor::compute::attention_merge(dtensor::Device::host(), o.data(), lse.data(), ob.data(), lb.data(), rows, dim);
    k::attention_merge(DType::Float64, go.get(), gl.get(), gob.get(), glb.get(), rows, dim, s);
    check_close(go.host(), o, 1e-14, "merged o", 1e-14);
    check_close(gl.host(), lse, 1e-14, "merged lse", 1e-14);
  }
  const AttentionDims huge{.batch = 1, .heads = 1, .kv_heads = 1, .q_len = 1, .kv_len = 1, .head_dim = 1 << 16};
  CHECK_THROWS_AS(k::attention_forward(DType::Float64, huge, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, s),
                  dtensor::InvalidArgument);
}

// A device block that a static object frees at exit: the main thread's thread_locals
// (its stream among them) end before static objects, so the block must be freed on
// the side, not on the destroyed stream (cudaFreeAsync on it crashed in the driver at
// bench_cuda's exit on an H100). A regression shows as this binary's exit status.
TEST_CASE("a device block held by a static object is freed at exit, after the thread's stream has ended") {
  struct Held {
    void* p = nullptr;
    ~Held() { dtensor::cuda::detail::deallocate(p, 256, 0); }
  };
  dtensor::cuda::set_device(0);
  REQUIRE(dtensor::cuda::current_stream() != nullptr);  // made before `held`: ends first
  static Held held{dtensor::cuda::detail::allocate(256, 0)};
  CHECK(held.p != nullptr);
}

}  // namespace
