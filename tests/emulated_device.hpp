#pragma once
// An emulated device for the tests: a DeviceBackend and MemorySpace that keep
// "device" memory in host RAM behind pointers the host cannot dereference (bit 62
// set: a non-canonical address, so any host access faults at once, as real GPU
// memory would). Only the backend's functions strip the tag. Installed for
// Device::cuda, it runs every device path of the core (allocation, copies,
// collectives on device buffers, operators through the backend table) on a
// machine without a GPU. The math here is plain loops, apart from the library's
// Eigen code.
#include <dtensor/dtensor.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace dtensor::test::emulated {

inline constexpr std::uintptr_t kTag = std::uintptr_t{1} << 62;

inline std::atomic<long>& calls() {  // backend calls, to show the device path ran
  static std::atomic<long> n{0};
  return n;
}

template <class T = void>
T* real(const void* p) {
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) & ~kTag);
}
inline void* tagged(void* p) { return p ? reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) | kTag) : p; }

inline void* allocate(std::size_t bytes, int) { return tagged(detail::host_allocate(bytes, 0)); }
inline void deallocate(void* p, std::size_t bytes, int) noexcept { detail::host_deallocate(real(p), bytes, 0); }
inline void zero(void* p, std::size_t bytes, int) { std::memset(real(p), 0, bytes); }
inline void copy(void* dst, Device dd, const void* src, Device sd, std::size_t bytes) {
  std::memcpy(dd.is_host() ? dst : real(dst), sd.is_host() ? src : real(src), bytes);
}

template <class F>
void typed(DType t, F&& f) {
  ++calls();
  visit_dtype(t, f);
}

inline const detail::DeviceBackend& backend() {
  static constexpr detail::DeviceBackend table{
      .bind_thread = [](int) { ++calls(); },
      .use_device = [](int) {},
      .synchronize = [] {},
      .copy_block = [](const void* src, Block sb, void* dst, Block db,
                       std::size_t elem) { ++calls(), detail::copy_block(real(src), sb, real(dst), db, elem); },
      .reduce_block = [](DType t, ReduceOp op, const void* src, Block sb, void* dst,
                         Block db) { ++calls(), detail::reduce_block(t, op, real(src), sb, real(dst), db); },
      .divide_block = [](DType t, void* dst, Block db,
                         int terms) { ++calls(), detail::divide_block(t, real(dst), db, terms); },
      .fill = [](DType t, void* dst, int64_t n,
                 Scalar v) { typed(t, [&](auto tag) { std::fill_n(real<decltype(tag)>(dst), n, v.as<decltype(tag)>()); }); },
      .binary = [](DType t, BinaryOp op, const void* a, const void* b, void* out, int64_t n) {
        typed(t, [&](auto tag) {
          using T = decltype(tag);
          const T *x = real<const T>(a), *y = real<const T>(b);
          T* o = real<T>(out);
          for (int64_t i = 0; i < n; ++i)
            o[i] = op == BinaryOp::Add ? x[i] + y[i] : op == BinaryOp::Sub ? x[i] - y[i] : op == BinaryOp::Mul ? x[i] * y[i] : x[i] / y[i];
        });
      },
      .binary_scalar = [](DType t, BinaryOp op, const void* a, Scalar s, void* out, int64_t n) {
        typed(t, [&](auto tag) {
          using T = decltype(tag);
          const T* x = real<const T>(a);
          const T y = s.as<T>();
          T* o = real<T>(out);
          for (int64_t i = 0; i < n; ++i)
            o[i] = op == BinaryOp::Add ? x[i] + y : op == BinaryOp::Sub ? x[i] - y : op == BinaryOp::Mul ? x[i] * y : x[i] / y;
        });
      },
      .unary = [](DType t, UnaryFn f, const void* a, void* out, int64_t n) {
        typed(t, [&](auto tag) {
          using T = decltype(tag);
          if constexpr (std::is_floating_point_v<T>) {
            const T* x = real<const T>(a);
            T* o = real<T>(out);
            for (int64_t i = 0; i < n; ++i) {
              const T v = x[i];
              switch (f) {
                case UnaryFn::Neg: o[i] = -v; break;
                case UnaryFn::Exp: o[i] = std::exp(v); break;
                case UnaryFn::Log: o[i] = std::log(v); break;
                case UnaryFn::Sqrt: o[i] = std::sqrt(v); break;
                case UnaryFn::Abs: o[i] = std::abs(v); break;
                case UnaryFn::Relu: o[i] = std::max(v, T(0)); break;
                case UnaryFn::Tanh: o[i] = std::tanh(v); break;
                case UnaryFn::Sigmoid: o[i] = T(1) / (T(1) + std::exp(-v)); break;
              }
            }
          } else {
            throw InvalidArgument("emulated device: unary functions take floating-point tensors");
          }
        });
      },
      .add_bias = [](DType t, const void* m, const void* v, void* out, int64_t rows, int64_t cols, bool along_rows) {
        typed(t, [&](auto tag) {
          using T = decltype(tag);
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < cols; ++j)
              real<T>(out)[i * cols + j] = real<const T>(m)[i * cols + j] + real<const T>(v)[along_rows ? j : i];
        });
      },
      .transpose = [](DType t, const void* in, void* out, int64_t rows, int64_t cols) {
        typed(t, [&](auto tag) {
          using T = decltype(tag);
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < cols; ++j) real<T>(out)[j * rows + i] = real<const T>(in)[i * cols + j];
        });
      },
      .reduce_dim = [](DType t, LocalReduce r, const void* in, void* out, int64_t outer, int64_t len, int64_t inner) {
        typed(t, [&](auto tag) {
          using T = decltype(tag);
          const T* x = real<const T>(in);
          T* o = real<T>(out);
          for (int64_t a = 0; a < outer; ++a)
            for (int64_t i = 0; i < inner; ++i) {
              T acc = r == LocalReduce::Sum ? T(0)
                      : r == LocalReduce::Max ? local::identity<LocalReduce::Max, T>()
                                              : local::identity<LocalReduce::Min, T>();
              for (int64_t j = 0; j < len; ++j) {
                const T v = x[(a * len + j) * inner + i];
                acc = r == LocalReduce::Sum ? acc + v : r == LocalReduce::Max ? std::max(acc, v) : std::min(acc, v);
              }
              o[a * inner + i] = acc;
            }
        });
      },
      .sum_squares = [](DType t, const void* a, int64_t n) {
        double s = 0;
        typed(t, [&](auto tag) {
          for (int64_t i = 0; i < n; ++i) s += double(real<const decltype(tag)>(a)[i]) * double(real<const decltype(tag)>(a)[i]);
        });
        return s;
      },
      .max_abs = [](DType t, const void* a, int64_t n) {
        double s = 0;
        typed(t, [&](auto tag) {
          for (int64_t i = 0; i < n; ++i) s = std::max(s, std::abs(double(real<const decltype(tag)>(a)[i])));
        });
        return s;
      },
      .softmax_shift = [](DType t, void* x, const void* max, void* sums, int64_t outer, int64_t len, int64_t inner,
                          bool log) {
        typed(t, [&](auto tag) {
          using T = decltype(tag);
          if (log) local::softmax_shift<true>(Device::host(), real<T>(x), real<const T>(max), real<T>(sums), outer, len, inner);
          else local::softmax_shift<false>(Device::host(), real<T>(x), real<const T>(max), real<T>(sums), outer, len, inner);
        });
      },
      .softmax_finish = [](DType t, void* x, const void* sums, int64_t outer, int64_t len, int64_t inner, bool log) {
        typed(t, [&](auto tag) {
          using T = decltype(tag);
          if (log) local::softmax_finish<true>(Device::host(), real<T>(x), real<const T>(sums), outer, len, inner);
          else local::softmax_finish<false>(Device::host(), real<T>(x), real<const T>(sums), outer, len, inner);
        });
      },
      .gemm = [](DType t, int64_t batch, int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c) {
        typed(t, [&](auto tag) {
          using T = decltype(tag);
          for (int64_t p = 0; p < batch; ++p)
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                T acc = 0;
                for (int64_t q = 0; q < k; ++q)
                  acc += real<const T>(a)[(p * m + i) * k + q] * real<const T>(b)[(p * k + q) * n + j];
                real<T>(c)[(p * m + i) * n + j] = acc;
              }
        });
      },
  };
  return table;
}

inline void install() {
  static constexpr detail::MemorySpace space{&allocate, &deallocate, &zero, &copy};
  detail::cuda_memory_space() = &space;
  detail::cuda_backend_slot() = &backend();
}

}  // namespace dtensor::test::emulated
