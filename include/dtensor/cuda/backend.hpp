#pragma once
// The CUDA device backend: fills dtensor's device-compute table (compute/
// device_backend.hpp) and memory space with the kernels of kernels/, cuBLAS, cuDNN
// (convolutions) and stream-ordered memory, and installs them when this header is
// included.
#include "dtensor/compute/device_backend.hpp"
#include "dtensor/cuda/blas.hpp"
#include "dtensor/cuda/dnn.hpp"
#include "dtensor/cuda/kernels.hpp"
#include "dtensor/cuda/memory.hpp"

namespace dtensor::cuda {

namespace detail {

// A reduction to one value, read back on the host (norms).
template <class Kernel>
double reduce_to_host(DType t, const void* a, int64_t n, Kernel&& kernel) {
  if (n == 0) return 0.0;
  cudaStream_t s = current_stream();
  int dev = 0;
  DTENSOR_CUDA(cudaGetDevice(&dev));
  void* out = allocate(8, dev);  // one element of any type
  double v = 0;
  try {
    kernel(t, a, n, out, s);
    visit_dtype(t, [&](auto tag) {  // the kernel wrote one element of type t
      decltype(tag) r{};
      DTENSOR_CUDA(cudaMemcpyAsync(&r, out, sizeof r, cudaMemcpyDeviceToHost, s));
      DTENSOR_CUDA(cudaStreamSynchronize(s));
      v = static_cast<double>(r);
    });
  } catch (...) {
    deallocate(out, 8, dev);
    throw;
  }
  deallocate(out, 8, dev);
  return v;
}

// Host arrays of doubles (compute/row_stats.hpp's per-row and per-column terms) in
// one device block of `total` doubles: each host array is copied in on the stream
// (pageable memory: cudaMemcpyAsync returns once it has taken the bytes, so the caller
// may reuse them at once), and the block is freed in stream order.
class HostArrays {
 public:
  explicit HostArrays(int64_t total) : bytes_(static_cast<std::size_t>(total) * sizeof(double)) {
    DTENSOR_CUDA(cudaGetDevice(&device_));
    p_ = static_cast<double*>(allocate(bytes_, device_));
  }
  ~HostArrays() { deallocate(p_, bytes_, device_); }
  HostArrays(const HostArrays&) = delete;
  HostArrays& operator=(const HostArrays&) = delete;

  // The next n doubles of the block, holding `host`'s values (null when host is null).
  double* upload(const double* host, int64_t n) {
    if (!host) return nullptr;
    double* d = take(n);
    DTENSOR_CUDA(cudaMemcpyAsync(d, host, static_cast<std::size_t>(n) * sizeof(double), cudaMemcpyHostToDevice,
                                 current_stream()));
    return d;
  }
  // The next n doubles, for the device to write.
  double* take(int64_t n) {
    double* d = p_ + used_;
    used_ += n;
    return d;
  }

 private:
  std::size_t bytes_;
  int device_ = 0;
  double* p_ = nullptr;
  int64_t used_ = 0;
};

inline void row_moments(DType t, const void* a, const void* b, const double* shift, int64_t rows, int64_t cols,
                        double* out) {
  if (rows == 0) return;
  cudaStream_t s = current_stream();
  HostArrays dev(3 * rows);  // [shift | out (2 rows)]
  const double* d_shift = dev.upload(shift, rows);
  double* d_out = dev.take(2 * rows);
  kernels::row_moments(t, a, b, d_shift, rows, cols, d_out, s);
  DTENSOR_CUDA(cudaMemcpyAsync(out, d_out, static_cast<std::size_t>(2 * rows) * sizeof(double),
                               cudaMemcpyDeviceToHost, s));
  DTENSOR_CUDA(cudaStreamSynchronize(s));
}

inline void row_affine(DType t, const void* a, const void* b, const RowTerms& terms, int64_t rows, int64_t cols,
                       void* out) {
  if (rows == 0 || cols == 0) return;
  HostArrays dev(4 * rows + 2 * cols);
  RowTerms d;
  d.center = dev.upload(terms.center, rows);
  d.scale = dev.upload(terms.scale, rows);
  d.b_scale = dev.upload(b ? terms.b_scale : nullptr, rows);
  d.offset = dev.upload(terms.offset, rows);
  d.col_scale = dev.upload(terms.col_scale, cols);
  d.col_offset = dev.upload(terms.col_offset, cols);
  kernels::row_affine(t, a, b, d, rows, cols, out, current_stream());
}

// Data movement on the device (tensor/device_movement.hpp).
inline const ::dtensor::detail::DeviceMovement& movement_table() {
  namespace k = kernels;
  static constexpr ::dtensor::detail::DeviceMovement table{
      .bind_thread = [](int device) { set_device(device); },
      .use_device =
          [](int device) {
            const auto& ts = thread_stream();
            if (ts.stream && ts.device == device) return;
            if (!ts.stream) return set_device(device);  // this thread's first device work
            throw InvalidArgument(::dtensor::detail::cat(
                "dtensor: a tensor on cuda:", device, " is used by a thread that works on cuda:", ts.device,
                "; each rank works on one GPU (call dtensor::cuda::set_device(", device, ") in that thread first)"));
          },
      .synchronize = [] { synchronize(); },
      .copy_block = [](const void* src, Block sb, void* dst, Block db,
                       std::size_t elem) { k::copy_block(src, sb, dst, db, elem, current_stream()); },
      .reduce_block = [](DType t, ReduceOp op, const void* src, Block sb, void* dst,
                         Block db) { k::reduce_block(t, op, src, sb, dst, db, current_stream()); },
      .divide_block = [](DType t, void* dst, Block db,
                         int terms) { k::divide_block(t, dst, db, terms, current_stream()); },
      .fill = [](DType t, void* dst, int64_t n, Scalar v) { k::fill(t, dst, n, v, current_stream()); },
  };
  return table;
}

// The math (compute/device_backend.hpp).
inline const ::dtensor::detail::DeviceBackend& backend_table() {
  namespace k = kernels;
  static constexpr ::dtensor::detail::DeviceBackend table{
      .random_fill = [](DType t, void* dst, const CounterBox& box,
                        const CounterDraw& draw) { k::random_fill(t, dst, box, draw, current_stream()); },
      .binary = [](DType t, BinaryOp op, const void* a, const void* b, void* out,
                   int64_t n) { k::binary(t, op, a, b, out, n, current_stream()); },
      .binary_scalar = [](DType t, BinaryOp op, const void* a, Scalar s, void* out,
                          int64_t n) { k::binary_scalar(t, op, a, s, out, n, current_stream()); },
      .unary = [](DType t, UnaryFn f, const void* a, void* out,
                  int64_t n) { k::unary(t, f, a, out, n, current_stream()); },
      .unary_backward = [](DType t, UnaryFn f, const void* x, const void* dy, void* dx,
                           int64_t n) { k::unary_backward(t, f, x, dy, dx, n, current_stream()); },
      .add_bias = [](DType t, const void* m, const void* v, void* out, int64_t rows, int64_t cols,
                     bool along_rows) { k::add_bias(t, m, v, out, rows, cols, along_rows, current_stream()); },
      .transpose = [](DType t, const void* in, void* out, int64_t rows,
                      int64_t cols) { k::transpose(t, in, out, rows, cols, current_stream()); },
      .reduce_dim = [](DType t, ReduceOp r, const void* in, void* out, int64_t outer, int64_t len,
                       int64_t inner) {
        k::reduce_dim(t, r, in, out, outer, len, inner, current_stream());
      },
      .where_equal = [](DType t, const void* x, const void* y, const void* v, void* out, int64_t outer, int64_t len,
                        int64_t inner) { k::where_equal(t, x, y, v, out, outer, len, inner, current_stream()); },
      .sum_squares = [](DType t, const void* a, int64_t n) { return reduce_to_host(t, a, n, k::sum_squares); },
      .max_abs = [](DType t, const void* a, int64_t n) { return reduce_to_host(t, a, n, k::max_abs); },
      .softmax_shift = [](DType t, void* x, const void* max, void* sums, int64_t outer, int64_t len, int64_t inner,
                          bool log) { k::softmax_shift(t, x, max, sums, outer, len, inner, log, current_stream()); },
      .softmax_finish = [](DType t, void* x, const void* sums, int64_t outer, int64_t len, int64_t inner,
                           bool log) { k::softmax_finish(t, x, sums, outer, len, inner, log, current_stream()); },
      .row_moments = [](DType t, const void* a, const void* b, const double* shift, int64_t rows, int64_t cols,
                        double* out) { row_moments(t, a, b, shift, rows, cols, out); },
      .row_affine = [](DType t, const void* a, const void* b, const RowTerms& terms, int64_t rows, int64_t cols,
                       void* out) { row_affine(t, a, b, terms, rows, cols, out); },
      .sgd_update = [](DType t, void* w, const void* g, void* buf, int64_t n,
                       const SgdStep& step) { k::sgd_update(t, w, g, buf, n, step, current_stream()); },
      .adamw_update = [](DType t, void* w, const void* g, void* m, void* v, int64_t n,
                         const AdamWStep& step) { k::adamw_update(t, w, g, m, v, n, step, current_stream()); },
      .gather_rows = [](DType t, const void* table, int64_t table_rows, int64_t cols, const int64_t* index,
                        int64_t rows, int64_t lo,
                        void* out) { k::gather_rows(t, table, table_rows, cols, index, rows, lo, out, current_stream()); },
      .scatter_add_rows = [](DType t, const void* dy, const int64_t* index, int64_t rows, int64_t cols, int64_t lo,
                             void* table, int64_t table_rows) {
        k::scatter_add_rows(t, dy, index, rows, cols, lo, table, table_rows, current_stream());
      },
      .take_along_last = [](DType t, const void* x, int64_t rows, int64_t cols, const int64_t* target, int64_t lo,
                            void* out) { k::take_along_last(t, x, rows, cols, target, lo, out, current_stream()); },
      .add_along_last = [](DType t, const void* g, const int64_t* target, int64_t lo, void* x, int64_t rows,
                           int64_t cols) { k::add_along_last(t, g, target, lo, x, rows, cols, current_stream()); },
      .gemm = [](DType t, const GemmDims& dims, Scalar alpha, const void* a, const void* b, Scalar beta,
                 void* c) { gemm(t, dims, alpha, a, b, beta, c); },
      .conv_forward = [](DType t, const ConvDims& d, const void* x, const void* w, const void* bias, void* y,
                         const OutBox& box) { dnn::conv_forward(t, d, x, w, bias, y, box); },
      .conv_backward_data = [](DType t, const ConvDims& d, const void* dy, const void* w,
                               void* dx) { dnn::conv_backward_data(t, d, dy, w, dx); },
      .conv_backward_weight = [](DType t, const ConvDims& d, const void* x, const void* dy, void* dw,
                                 bool accumulate) { dnn::conv_backward_weight(t, d, x, dy, dw, accumulate); },
      .conv_backward_bias = [](DType t, const ConvDims& d, const void* dy, void* db,
                               bool accumulate) { dnn::conv_backward_bias(t, d, dy, db, accumulate); },
      .pool_forward = [](DType t, const PoolDims& p, const void* x, void* y,
                         const OutBox& box) { k::pool_forward(t, p, x, y, box, current_stream()); },
      .pool_backward = [](DType t, const PoolDims& p, const void* x, const void* dy,
                          void* dx) { k::pool_backward(t, p, x, dy, dx, current_stream()); },
      .upsample_forward = [](DType t, const UpsampleDims& u, const void* x,
                             void* y) { k::upsample_forward(t, u, x, y, current_stream()); },
      .upsample_backward = [](DType t, const UpsampleDims& u, const void* dy,
                              void* dx) { k::upsample_backward(t, u, dy, dx, current_stream()); },
      .attention_forward =
          [](DType t, const compute::AttentionDims& d, const void* q, const void* kk, const void* v, const void* mask,
             void* o, void* lse) { k::attention_forward(t, d, q, kk, v, mask, o, lse, current_stream()); },
      .attention_backward =
          [](DType t, const compute::AttentionDims& d, const void* q, const void* kk, const void* v, const void* mask,
             const void* o, const void* lse, const void* dout, void* dq, void* dk, void* dv) {
            k::attention_backward(t, d, q, kk, v, mask, o, lse, dout, dq, dk, dv, current_stream());
          },
      .attention_merge = [](DType t, void* o, void* lse, const void* ob, const void* lb, int64_t rows,
                            int64_t dim) { k::attention_merge(t, o, lse, ob, lb, rows, dim, current_stream()); },
  };
  return table;
}

}  // namespace detail

// Makes device tensors usable: called when dtensor/cuda.hpp is included.
inline bool install() {
  ::dtensor::detail::cuda_memory_space() = &memory_space();
  ::dtensor::detail::cuda_movement_slot() = &detail::movement_table();
  ::dtensor::detail::cuda_backend_slot() = &detail::backend_table();
  return true;
}

namespace detail {
inline const bool installed = install();  // once per program, before main
}

}  // namespace dtensor::cuda
