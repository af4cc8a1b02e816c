#pragma once
// The CUDA device backend: fills dtensor's device-compute table (compute/
// device_backend.hpp) and memory space with the kernels of kernels/, cuBLAS, cuDNN
// (convolutions, fused attention), cuFFT (the spectral operators' local transforms) and
// stream-ordered memory, and installs them when this header is included.
#include "dtensor/compute/device_backend.hpp"
#include "dtensor/cuda/blas.hpp"
#include "dtensor/cuda/dnn.hpp"
#include "dtensor/cuda/fft.hpp"
#include "dtensor/cuda/fused_attention.hpp"
#include "dtensor/cuda/kernels.hpp"
#include "dtensor/cuda/memory.hpp"

namespace dtensor::cuda {

namespace detail {

// A reduction to one value, read back on the host (norms): one element of type t, or a
// double where the kernel writes one for a 16-bit t (sum_squares: `wide_16`).
template <class Kernel>
double reduce_to_host(DType t, const void* a, int64_t n, Kernel&& kernel, bool wide_16 = false) {
  if (n == 0) return 0.0;
  cudaStream_t s = current_stream();
  int dev = 0;
  DTENSOR_CUDA(cudaGetDevice(&dev));
  void* out = allocate(8, dev);  // one element of any type
  double v = 0;
  try {
    kernel(t, a, n, out, s);
    auto read = [&](auto r) {  // one value of the type the kernel wrote
      DTENSOR_CUDA(cudaMemcpyAsync(&r, out, sizeof r, cudaMemcpyDeviceToHost, s));
      DTENSOR_CUDA(cudaStreamSynchronize(s));
      if constexpr (is_float16_v<decltype(r)>) v = static_cast<double>(static_cast<float>(r));
      else v = static_cast<double>(r);
    };
    visit_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (is_complex_v<T>)
        throw InvalidArgument("dtensor: a norm of complex elements on a device (the kernels refuse them first)");
      else if (is_float16_v<T> && wide_16) read(double{});
      else read(T{});
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

// A kernel of kernels.hpp as a table entry: the entry's arguments, then the calling
// thread's stream. A captureless generic lambda takes the entry's exact signature
// (its parameters are deduced from the table's function type), so the many entries
// that only add the stream are written once each, without their signatures.
template <auto Kernel>
inline constexpr auto on_stream = [](auto... args) { return Kernel(args..., current_stream()); };

// Data movement on the device (tensor/device_movement.hpp).
struct CudaMovement {
  static void bind_thread(int device) { set_device(device); }
  static void use_device(int device) {
    const auto& ts = thread_stream();
    if (ts.stream && ts.device == device) return;
    if (!ts.stream) return set_device(device);  // this thread's first device work
    throw InvalidArgument(::dtensor::detail::cat(
        "dtensor: a tensor on cuda:", device, " is used by a thread that works on cuda:", ts.device,
        "; each rank works on one GPU (call dtensor::cuda::set_device(", device, ") in that thread first)"));
  }
  static void synchronize() { ::dtensor::cuda::synchronize(); }
  static constexpr auto copy_block = on_stream<kernels::copy_block>;
  static constexpr auto reduce_block = on_stream<kernels::reduce_block>;
  static constexpr auto divide_block = on_stream<kernels::divide_block>;
  static constexpr auto convert_block = on_stream<kernels::convert_block>;
  static constexpr auto fill = on_stream<kernels::fill>;
  // Markers are events without timing (the cheapest kind to record and wait on).
  static void* new_marker() {
    cudaEvent_t e = nullptr;
    DTENSOR_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  static void delete_marker(void* e) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(e)); }  // may be pending
  static void record_marker(void* e) { DTENSOR_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(e), current_stream())); }
  static void wait_marker(void* e) {
    DTENSOR_CUDA(cudaStreamWaitEvent(current_stream(), static_cast<cudaEvent_t>(e), 0));
  }
};

// The solvers' grid kernels with a sum: the sums land in device doubles, then come to
// the host (the one wait of a dot or a norm; an update without a sum does not wait).
inline void read_sums(const double* device_sums, double* host, int n, cudaStream_t s) {
  DTENSOR_CUDA(cudaMemcpyAsync(host, device_sums, n * sizeof(double), cudaMemcpyDeviceToHost, s));
  DTENSOR_CUDA(cudaStreamSynchronize(s));
}
inline double stencil_apply(DType t, const compute::StencilApply& ap) {
  cudaStream_t s = current_stream();
  if (!ap.epilogue.sums()) {
    kernels::stencil_apply(t, ap, nullptr, s);
    return 0;
  }
  HostArrays buf(1);
  double* d = buf.take(1);
  kernels::stencil_apply(t, ap, d, s);
  double v = 0;
  read_sums(d, &v, 1, s);
  return v;
}
inline compute::GridSums grid_update(DType t, const compute::GridUpdate& g) {
  cudaStream_t s = current_stream();
  compute::GridSums out;
  if (!g.sums()) {
    kernels::grid_update(t, g, nullptr, s);
    return out;
  }
  HostArrays buf(3);
  double* d = buf.take(3);
  kernels::grid_update(t, g, d, s);
  read_sums(d, out.s, 3, s);
  return out;
}

// The math (compute/device_backend.hpp): the kernels of kernels/, cuBLAS and cuDNN.
struct CudaMath {
  static constexpr auto random_fill = on_stream<kernels::random_fill>;
  static constexpr auto binary = on_stream<kernels::binary>;
  static constexpr auto binary_scalar = on_stream<kernels::binary_scalar>;
  static constexpr auto unary = on_stream<kernels::unary>;
  static constexpr auto unary_backward = on_stream<kernels::unary_backward>;
  static constexpr auto add_bias = on_stream<kernels::add_bias>;
  static constexpr auto transpose = on_stream<kernels::transpose>;
  static constexpr auto reduce_dim = on_stream<kernels::reduce_dim>;
  static constexpr auto where_equal = on_stream<kernels::where_equal>;
  static double sum_squares(DType t, const void* a, int64_t n) {
    return reduce_to_host(t, a, n, kernels::sum_squares, true);
  }
  static double max_abs(DType t, const void* a, int64_t n) { return reduce_to_host(t, a, n, kernels::max_abs); }
  static constexpr auto softmax_shift = on_stream<kernels::softmax_shift>;
  static constexpr auto softmax_finish = on_stream<kernels::softmax_finish>;
  static constexpr auto row_moments = detail::row_moments;  // host arrays staged through the device
  static constexpr auto row_affine = detail::row_affine;
  static constexpr auto sgd_update = on_stream<kernels::sgd_update>;
  static constexpr auto adamw_update = on_stream<kernels::adamw_update>;
  static constexpr auto gather_rows = on_stream<kernels::gather_rows>;
  static constexpr auto scatter_add_rows = on_stream<kernels::scatter_add_rows>;
  static constexpr auto take_along_last = on_stream<kernels::take_along_last>;
  static constexpr auto add_along_last = on_stream<kernels::add_along_last>;
  static constexpr auto gemm = cuda::gemm;  // cuBLAS (blas.hpp)
  static constexpr auto conv_forward = dnn::conv_forward;  // cuDNN (dnn.hpp)
  static constexpr auto conv_backward_data = dnn::conv_backward_data;
  static constexpr auto conv_backward_weight = dnn::conv_backward_weight;
  static constexpr auto conv_backward_bias = dnn::conv_backward_bias;
  static constexpr auto pool_forward = on_stream<kernels::pool_forward>;
  static constexpr auto pool_backward = on_stream<kernels::pool_backward>;
  static constexpr auto upsample_forward = on_stream<kernels::upsample_forward>;
  static constexpr auto upsample_backward = on_stream<kernels::upsample_backward>;
  static constexpr auto attention_forward = detail::attention_forward;  // cuDNN or kernels (fused_attention.hpp)
  static constexpr auto attention_backward = detail::attention_backward;
  static constexpr auto attention_merge = on_stream<kernels::attention_merge>;
  static constexpr auto neighborhood_attention_forward = on_stream<kernels::neighborhood_attention_forward>;
  static constexpr auto neighborhood_attention_backward = on_stream<kernels::neighborhood_attention_backward>;
  static constexpr auto stencil_apply = detail::stencil_apply;  // sums read back (above)
  static constexpr auto stencil_diagonal = on_stream<kernels::stencil_diagonal>;
  static constexpr auto grid_update = detail::grid_update;
  static constexpr auto grid_restrict = on_stream<kernels::grid_restrict>;
  static constexpr auto grid_prolong = on_stream<kernels::grid_prolong>;
  static constexpr auto fft = cuda::fft;  // cuFFT (fft.hpp)
  static constexpr auto spectral_mix = on_stream<kernels::spectral_mix>;
  static constexpr auto spectral_weight_terms = on_stream<kernels::spectral_weight_terms>;
};

inline const ::dtensor::detail::DeviceMovement& movement_table() {
  static constexpr auto table = ::dtensor::detail::device_movement_of<CudaMovement>();
  return table;
}
inline const ::dtensor::detail::DeviceBackend& backend_table() {
  static constexpr auto table = ::dtensor::detail::device_backend_of<CudaMath>();
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
