#pragma once
// Convolutions on a GPU (compute/conv.hpp's device path) through cuDNN's descriptor
// API (cudnnConvolutionForward, ...BackwardData, ...BackwardFilter, ...BackwardBias;
// cuDNN 8 or 9), on the calling thread's stream.
//
// How ConvDims maps onto cuDNN, exactly. cuDNN pads symmetrically (one pad per dim,
// the same before and after) and computes its own output extent from it, while a
// ConvDims window starts anywhere (in_start < 0: zeros before the block; outputs that
// reach past its end: zeros after) and names its outputs (an OutBox). So the call is
// given, per spatial dim, the region of x its outputs read, with padding 0:
//   region start   lo = in_start + box.begin * stride
//   region extent  n  = (box extent - 1) * stride + dilation * (kernel - 1) + 1
// which makes cuDNN's output extent (n - span) / stride + 1 the box's extent exactly.
//   - lo >= 0 and lo + n <= in (a distributed layer's padded block, the usual case):
//     x is passed in place, at the region's first cell, with a descriptor of the
//     region's extents and the block's strides; y likewise at the box's first cell.
//   - a whole output whose region starts p >= 0 cells before x in each dim, where
//     cuDNN's own output extent with symmetric padding p is the output's (a single
//     rank's "same" convolution, a strided stem): x is passed whole with padding p,
//     the data gradient written whole by cuDNN (cudnn_pads);
//   - otherwise (zero padding on a single rank, or windows past the end): the region
//     is copied into a zeroed scratch first (kernels::window_copy, which reads zeros
//     outside x), and the backward data's result is cropped back out of one, every
//     cell of dx written (those no tap reads with 0).
// Should cuDNN offer no algorithm for the strided descriptors, the call falls back to
// packed copies of the region and of the output box. Why copies rather than cuDNN's padding
// in the other cases: a symmetric pad that covers in_start < 0 also pads the far end and makes
// cuDNN compute (and require room for) outputs outside the box; a copy costs one pass
// over the region, small beside the convolution, and is exact.
//
// Algorithms: cudnnGet*Algorithm_v7's heuristics (no trial runs: a first call costs no
// synchronisation), the first supported one within kMaxWorkspace bytes, preferring
// those that sum directly (GEMM-like, not FFT or Winograd: their results stay within
// fp32 rounding of the host's) and then deterministic ones, unless
// set_conv_algorithms(ConvAlgorithms::Fastest) takes cuDNN's first choice. The choice and the
// descriptors are cached per thread, keyed by every dim, stride and flag of the call;
// the workspace is a per-thread buffer that only grows. Float convolutions run in full
// fp32 (CUDNN_FMA_MATH) unless TF32 is asked for (cuda::set_tf32, DTENSOR_TF32=1), as
// the cuBLAS products do. bfloat16 and float16 convolutions run on tensor cores with a
// float compute type: 16-bit data, float sums, each output rounded once (the bias is
// added after that rounding, by dtensor's kernel: one more rounding of the biased value;
// the bias gradient is the host's double sum, cuDNN documenting neither for 16 bits).
//
// Without cuDNN at configure time (no DTENSOR_WITH_CUDNN), the functions throw an
// error that says so; pooling and upsampling are kernels of kernels/ and need no cuDNN.
#include <array>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/core/dtype.hpp"
#include "dtensor/compute/conv_dims.hpp"
#include "dtensor/cuda/blas.hpp"
#include "dtensor/cuda/kernels.hpp"
#include "dtensor/cuda/memory.hpp"
#include "dtensor/cuda/stream.hpp"
#include "dtensor/cuda/thread_handle.hpp"

#if defined(DTENSOR_WITH_CUDNN)
#include <cudnn.h>
#endif

namespace dtensor::cuda {

// How cuDNN's convolution algorithms are chosen. Reproducible (the default): among
// those cuDNN's heuristics offer, ones that sum directly (no FFT or Winograd transform,
// whose rounding can exceed plain fp32 sums' by orders of magnitude) and deterministic
// ones (the same bits every run) first. Fastest: cuDNN's first choice, as PyTorch
// takes it without cudnn.benchmark; a weight gradient may then add with atomics (bits
// that differ between runs). set_conv_algorithms, or DTENSOR_CONV_ALGOS=fastest.
enum class ConvAlgorithms : uint8_t { Reproducible, Fastest };

namespace detail {
inline std::atomic<ConvAlgorithms>& conv_algorithms_flag() {
  static std::atomic<ConvAlgorithms> c{[] {
    const char* v = std::getenv("DTENSOR_CONV_ALGOS");
    return v && std::string(v) == "fastest" ? ConvAlgorithms::Fastest : ConvAlgorithms::Reproducible;
  }()};
  return c;
}
}  // namespace detail

inline void set_conv_algorithms(ConvAlgorithms c) { detail::conv_algorithms_flag() = c; }
inline ConvAlgorithms conv_algorithms() { return detail::conv_algorithms_flag(); }

}  // namespace dtensor::cuda

namespace dtensor::cuda::dnn {

#if !defined(DTENSOR_WITH_CUDNN)

[[noreturn]] inline void no_cudnn() {
  throw InvalidArgument(
      "dtensor: convolutions on a GPU need cuDNN, and dtensor's CUDA backend was configured without it "
      "(CMake found no cudnn.h and libcudnn: install cuDNN 8 or 9 and reconfigure, or set DTENSOR_CUDNN_INCLUDE "
      "and DTENSOR_CUDNN_LIBRARY)");
}
inline void conv_forward(DType, const ConvDims&, const void*, const void*, const void*, void*, const OutBox&) {
  no_cudnn();
}
inline void conv_backward_data(DType, const ConvDims&, const void*, const void*, void*) { no_cudnn(); }
inline void conv_backward_weight(DType, const ConvDims&, const void*, const void*, void*, bool) { no_cudnn(); }
inline void conv_backward_bias(DType, const ConvDims&, const void*, void*, bool) { no_cudnn(); }

#else

namespace detail {

inline void check(cudnnStatus_t s, const char* call, const char* file, int line) {
  if (s != CUDNN_STATUS_SUCCESS) ::dtensor::cuda::detail::throw_cuda("cuDNN", cudnnGetErrorString(s), call, file, line);
}
#define DTENSOR_CUDNN(call) ::dtensor::cuda::dnn::detail::check((call), #call, __FILE__, __LINE__)

// The largest workspace an algorithm may ask for.
inline constexpr std::size_t kMaxWorkspace = std::size_t{1} << 30;

// cuDNN for ThreadHandle (cuda/thread_handle.hpp): one handle per thread (a rank),
// bound to the thread's stream and device.
struct Cudnn {
  using type = cudnnHandle_t;
  static void create(type* h) { DTENSOR_CUDNN(cudnnCreate(h)); }
  static void destroy(type h) noexcept { (void)cudnnDestroy(h); }
  static void set_stream(type h, cudaStream_t s) { DTENSOR_CUDNN(cudnnSetStream(h, s)); }
};
using Handle = ::dtensor::cuda::detail::ThreadHandle<Cudnn>;

// The thread's workspace: grown (freed and allocated again in stream order), never shrunk.
class Workspace {
 public:
  ~Workspace() { release(); }
  void* get(std::size_t bytes, int device) {
    if (bytes == 0) return nullptr;
    if (p_ && (bytes > bytes_ || device != device_)) release();
    if (!p_) {
      p_ = ::dtensor::cuda::detail::allocate(bytes, device);
      bytes_ = bytes, device_ = device;
    }
    return p_;
  }

 private:
  void release() noexcept {
    if (p_) ::dtensor::cuda::detail::deallocate(p_, bytes_, device_);
    p_ = nullptr, bytes_ = 0;
  }
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = -1;
};

struct Thread {
  Handle handle;
  Workspace workspace;
};
inline Thread& thread() {
  (void)current_stream();  // the stream first, so that it outlives the handle and the workspace at thread exit
  thread_local Thread t;
  return t;
}

// Stream-ordered scratch of n elements, freed on every way out.
class Scratch {
 public:
  Scratch(std::size_t bytes, int device)
      : p_(::dtensor::cuda::detail::allocate(bytes, device)), bytes_(bytes), device_(device) {}
  ~Scratch() { ::dtensor::cuda::detail::deallocate(p_, bytes_, device_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return p_; }

 private:
  void* p_;
  std::size_t bytes_;
  int device_;
};

inline int to_int(int64_t v, const char* what) {
  DTENSOR_CHECK(v >= 0 && v <= INT_MAX, InvalidArgument, "cuDNN convolution: ", what, " ", v,
                " does not fit cuDNN's int sizes; split the batch or the image");
  return static_cast<int>(v);
}

inline cudnnDataType_t data_type(DType t) {
  if (t == DType::Float32) return CUDNN_DATA_FLOAT;
  if (t == DType::Float64) return CUDNN_DATA_DOUBLE;
  if (t == DType::BFloat16) return CUDNN_DATA_BFLOAT16;
  if (t == DType::Float16) return CUDNN_DATA_HALF;
  throw InvalidArgument(::dtensor::detail::cat("dtensor: cuDNN convolutions take floating-point elements, not ",
                                               name(t)));
}
// The convolution's compute type: float for the 16-bit types (cuDNN's "pseudo half"
// and "pseudo bfloat16" configurations: 16-bit data, float products and sums, each
// output rounded once), the data type otherwise.
inline cudnnDataType_t compute_type(DType t) { return is_float16(t) ? CUDNN_DATA_FLOAT : data_type(t); }
// cuDNN's scaling factors (alpha, beta) are floats for every data type but double.
template <class T>
using scaling_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// RAII descriptors.
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { DTENSOR_CUDNN(cudnnCreateTensorDescriptor(&d)); }
  ~TensorDesc() { (void)cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  void set(cudnnDataType_t t, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
    std::vector<int> a(dims.size()), s(dims.size());
    for (std::size_t i = 0; i < dims.size(); ++i)
      a[i] = to_int(dims[i], "an extent"), s[i] = to_int(strides[i], "a stride");
    DTENSOR_CUDNN(cudnnSetTensorNdDescriptor(d, t, static_cast<int>(a.size()), a.data(), s.data()));
  }
};
struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc() { DTENSOR_CUDNN(cudnnCreateFilterDescriptor(&d)); }
  ~FilterDesc() { (void)cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};
struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc() { DTENSOR_CUDNN(cudnnCreateConvolutionDescriptor(&d)); }
  ~ConvDesc() { (void)cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

enum class Pass { Forward, BackwardData, BackwardFilter };

// One call's shape: the x region (its extents, and the strides it is read with), the y
// box likewise, and the convolution; nd = cuDNN's spatial dims (1-D runs as 2-D with
// a trailing extent of 1).
struct Shape {
  DType type;
  int nd;
  int64_t batch, cin, cout, groups;
  std::array<int64_t, 3> x_ext, x_strides, y_ext, y_strides, kernel, stride, dilation;
  std::array<int64_t, 3> pad{0, 0, 0};  // cuDNN's symmetric zero padding (0: the region is read as it is)
  int64_t x_batch_stride, x_channel_stride, y_batch_stride, y_channel_stride;

  std::vector<int64_t> key(Pass p, int device, bool tf32, ConvAlgorithms choice) const {
    std::vector<int64_t> k{static_cast<int64_t>(p),
                           device,
                           tf32,
                           static_cast<int64_t>(choice),
                           static_cast<int64_t>(type),
                           nd,
                           batch,
                           cin,
                           cout,
                           groups,
                           x_batch_stride,
                           x_channel_stride,
                           y_batch_stride,
                           y_channel_stride};
    for (const auto* a : {&x_ext, &x_strides, &y_ext, &y_strides, &kernel, &stride, &dilation, &pad})
      k.insert(k.end(), a->begin(), a->end());
    return k;
  }
};

// The cached descriptors and algorithm of one shape.
struct Plan {
  TensorDesc x, y, bias;
  FilterDesc w;
  ConvDesc conv;
  int algo = -1;  // the pass's algorithm enum, or -1: none supports the descriptors
  std::size_t workspace = 0;
};

// Whether an algorithm computes the sums directly (implicit or explicit GEMM, direct),
// rather than through a transform (FFT, Winograd), whose float rounding error grows
// with the transform and can exceed fp32 rounding of the plain sums by orders of
// magnitude: results must match the host's.
inline bool exact(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}
inline bool exact(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}
inline bool exact(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

// The first supported algorithm (the heuristics list them fastest first) within
// kMaxWorkspace: under ConvAlgorithms::Reproducible preferring exact ones, then
// deterministic ones; under Fastest the first (as PyTorch without cudnn.benchmark);
// -1 for none.
template <class Perf>
int pick(const Perf* perf, int count, ConvAlgorithms choice, std::size_t& workspace, cudnnMathType_t& math) {
  int best = -1, rank = -1;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > kMaxWorkspace) continue;
    const int r = choice == ConvAlgorithms::Fastest
                      ? 0
                      : 2 * exact(perf[i].algo) + (perf[i].determinism == CUDNN_DETERMINISTIC);
    if (r > rank) best = i, rank = r;
  }
  if (best < 0) return -1;
  workspace = perf[best].memory, math = perf[best].mathType;
  return static_cast<int>(perf[best].algo);
}

inline Plan& plan(Pass p, const Shape& s) {
  Thread& t = thread();
  cudnnHandle_t h = t.handle.get();
  const bool tf = s.type == DType::Float32 && tf32();
  const ConvAlgorithms choice = conv_algorithms();
  thread_local std::map<std::vector<int64_t>, std::unique_ptr<Plan> > cache;
  auto& slot = cache[s.key(p, t.handle.device(), tf, choice)];
  if (slot) return *slot;
  auto pl = std::make_unique<Plan>();
  const cudnnDataType_t dt = data_type(s.type);
  const int nd = s.nd;
  std::vector<int64_t> xd{s.batch, s.cin}, xs{s.x_batch_stride, s.x_channel_stride};
  std::vector<int64_t> yd{s.batch, s.cout}, ys{s.y_batch_stride, s.y_channel_stride};
  std::vector<int> wd{to_int(s.cout, "out_channels"), to_int(s.cin / s.groups, "channels per group")};
  std::vector<int> pad(nd, 0), str(nd), dil(nd);
  std::vector<int64_t> bd{1, s.cout}, bs{s.cout, 1};
  for (int i = 0; i < nd; ++i) {
    xd.push_back(s.x_ext[i]), xs.push_back(s.x_strides[i]);
    yd.push_back(s.y_ext[i]), ys.push_back(s.y_strides[i]);
    wd.push_back(to_int(s.kernel[i], "a kernel extent"));
    str[i] = to_int(s.stride[i], "a stride"), dil[i] = to_int(s.dilation[i], "a dilation");
    pad[i] = to_int(s.pad[i], "a padding");
    bd.push_back(1), bs.push_back(1);
  }
  pl->x.set(dt, xd, xs);
  pl->y.set(dt, yd, ys);
  pl->bias.set(dt, bd, bs);
  DTENSOR_CUDNN(cudnnSetFilterNdDescriptor(pl->w.d, dt, CUDNN_TENSOR_NCHW, nd + 2, wd.data()));
  DTENSOR_CUDNN(
      cudnnSetConvolutionNdDescriptor(pl->conv.d, nd, pad.data(), str.data(), dil.data(), CUDNN_CROSS_CORRELATION,
                                      compute_type(s.type)));
  DTENSOR_CUDNN(cudnnSetConvolutionGroupCount(pl->conv.d, to_int(s.groups, "groups")));
  // 16-bit data on tensor cores (float accumulation, as the compute type says).
  cudnnMathType_t math = s.type == DType::Float32 ? (tf ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH)
                         : is_float16(s.type)     ? CUDNN_TENSOR_OP_MATH
                                                  : CUDNN_DEFAULT_MATH;
  DTENSOR_CUDNN(cudnnSetConvolutionMathType(pl->conv.d, math));
  int count = 0;
  switch (p) {
    case Pass::Forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      DTENSOR_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(h, pl->x.d, pl->w.d, pl->conv.d, pl->y.d,
                                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf));
      pl->algo = pick(perf, count, choice, pl->workspace, math);
      break;
    }
    case Pass::BackwardData: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      DTENSOR_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, pl->w.d, pl->y.d, pl->conv.d, pl->x.d,
                                                                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf));
      pl->algo = pick(perf, count, choice, pl->workspace, math);
      break;
    }
    case Pass::BackwardFilter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      DTENSOR_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          h, pl->x.d, pl->y.d, pl->conv.d, pl->w.d, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf));
      pl->algo = pick(perf, count, choice, pl->workspace, math);
      break;
    }
  }
  if (pl->algo >= 0) DTENSOR_CUDNN(cudnnSetConvolutionMathType(pl->conv.d, math));
  slot = std::move(pl);
  return *slot;
}

inline std::string to_string_dims(const ConvDims& d) {
  std::string s = ::dtensor::detail::cat("batch ", d.batch, ", channels ", d.in_channels, " -> ", d.out_channels,
                                         ", groups ", d.groups);
  for (int i = 0; i < d.spatial; ++i)
    s += ::dtensor::detail::cat("; dim ", i, ": in ", d.in[i], ", out ", d.out[i], ", kernel ", d.kernel[i],
                                ", stride ", d.stride[i], ", dilation ", d.dilation[i]);
  return s;
}

// The row-major strides of a [c, e0, e1, e2] block: channel, then each spatial dim.
inline std::array<int64_t, 4> strides_of(const std::array<int64_t, 3>& e) {
  return {e[0] * e[1] * e[2], e[1] * e[2], e[2], 1};
}

// x's region and y's box of one call (see the header comment), in ConvDims order.
struct Region {
  std::array<int64_t, 3> lo{0, 0, 0}, n{1, 1, 1};  // x region: start (may be outside x) and extents
  std::array<int64_t, 3> b{0, 0, 0}, e{1, 1, 1};   // y box: start and extents
  bool inside = true;                              // the region lies in x
};
inline Region region_of(const ConvDims& d, const OutBox& box) {
  Region r;
  for (int i = 0; i < 3; ++i) {
    r.b[i] = box.begin[i], r.e[i] = box.end[i] - box.begin[i];
    r.lo[i] = d.in_start[i] + box.begin[i] * d.stride[i];
    r.n[i] = (r.e[i] - 1) * d.stride[i] + d.dilation[i] * (d.kernel[i] - 1) + 1;
    r.inside = r.inside && r.lo[i] >= 0 && r.lo[i] + r.n[i] <= d.in[i];
  }
  return r;
}

// cuDNN's symmetric zero padding, per dim, that makes a whole-output call read the
// region exactly: the region starts p cells before x (p >= 0) and cuDNN's own output
// extent (in + 2p - span) / stride + 1 is the output's. Then x is passed whole, with
// padding p, and no zero-padded copy is made (a single rank's "same" convolution, a
// strided stem). False otherwise (a distributed layer's padded block is inside x).
inline bool cudnn_pads(const ConvDims& d, const Region& r, std::array<int64_t, 3>& pad) {
  if (r.e != d.out) return false;
  for (int i = 0; i < 3; ++i) {
    const int64_t p = -r.lo[i], span = d.dilation[i] * (d.kernel[i] - 1) + 1;
    if (p < 0 || d.in[i] + 2 * p < span || (d.in[i] + 2 * p - span) / d.stride[i] + 1 != d.out[i]) return false;
    pad[i] = p;
  }
  return true;
}

// The shape of a call on x (full extents xin, read at the region) and y (full extents
// yout, written at the box); packed: x is a packed copy of the region, y of the box.
inline Shape shape_of(DType t, const ConvDims& d, const Region& r, bool x_packed, bool y_packed) {
  Shape s{};
  s.type = t, s.nd = d.spatial == 3 ? 3 : 2;
  s.batch = d.batch, s.cin = d.in_channels, s.cout = d.out_channels, s.groups = d.groups;
  const auto xs = strides_of(x_packed ? r.n : d.in);
  const auto ys = strides_of(y_packed ? r.e : d.out);
  s.x_channel_stride = xs[0], s.x_batch_stride = xs[0] * d.in_channels;
  s.y_channel_stride = ys[0], s.y_batch_stride = ys[0] * d.out_channels;
  for (int i = 0; i < 3; ++i) {
    s.x_ext[i] = r.n[i], s.x_strides[i] = xs[i + 1];
    s.y_ext[i] = r.e[i], s.y_strides[i] = ys[i + 1];
    s.kernel[i] = d.kernel[i], s.stride[i] = d.stride[i], s.dilation[i] = d.dilation[i];
  }
  return s;
}

// The shape of a whole-output call on all of x with cuDNN's padding `pad`.
inline Shape padded_shape_of(DType t, const ConvDims& d, const std::array<int64_t, 3>& pad) {
  Region whole;
  whole.n = d.in, whole.e = d.out;
  Shape s = shape_of(t, d, whole, false, false);
  s.pad = pad;
  return s;
}

inline int64_t offset_of(const std::array<int64_t, 3>& at, const std::array<int64_t, 3>& ext) {
  return (at[0] * ext[1] + at[1]) * ext[2] + at[2];
}

// A packed copy of x's region (zeros outside x), or the reverse (dst_ext: x's
// extents, every cell written); or a packed box placed into y.
inline void copy_window(DType t, int64_t planes, const std::array<int64_t, 3>& box, const void* src,
                        const std::array<int64_t, 3>& src_ext, const std::array<int64_t, 3>& src_start, void* dst,
                        const std::array<int64_t, 3>& dst_ext, const std::array<int64_t, 3>& dst_start) {
  kernels::window_copy(t, planes, box, src, src_ext, src_start, dst, dst_ext, dst_start, current_stream());
}

// y += the bias, per output channel, over `batch` x cout contiguous planes of `cells`
// (a whole output, or a packed box): cudnnAddTensor for float and double; for the
// 16-bit types dtensor's kernel (a float add, rounded once; cuDNN documents no 16-bit
// AddTensor), after the convolution's own rounding of y.
template <class T>
void add_bias(cudnnHandle_t h, const Plan& pl, DType t, const T* bias, T* y, int64_t batch, int64_t cout,
              int64_t cells) {
  if constexpr (is_float16_v<T>) {
    for (int64_t b = 0; b < batch; ++b)
      kernels::add_bias(t, y + b * cout * cells, bias, y + b * cout * cells, cout, cells, false, current_stream());
  } else {
    const scaling_t<T> one = 1;
    DTENSOR_CUDNN(cudnnAddTensor(h, &one, pl.bias.d, bias, &one, pl.y.d, y));
  }
}

template <class T>
void forward_typed(DType t, const ConvDims& d, const T* x, const T* w, const T* bias, T* y, const OutBox& box) {
  const Region r = region_of(d, box);
  if (d.batch == 0 || r.e[0] * r.e[1] * r.e[2] == 0) return;
  Thread& th = thread();
  cudnnHandle_t h = th.handle.get();
  const int dev = th.handle.device();
  const bool full_box = r.e == d.out;
  std::array<int64_t, 3> pad{};
  if (!r.inside && cudnn_pads(d, r, pad)) {  // cuDNN pads: no copy of x
    Plan& pp = plan(Pass::Forward, padded_shape_of(t, d, pad));
    if (pp.algo >= 0) {
      const scaling_t<T> one = 1, zero = 0;
      void* ws = th.workspace.get(pp.workspace, dev);
      DTENSOR_CUDNN(cudnnConvolutionForward(h, &one, pp.x.d, x, pp.w.d, w, pp.conv.d,
                                            static_cast<cudnnConvolutionFwdAlgo_t>(pp.algo), ws, pp.workspace, &zero,
                                            pp.y.d, y));
      if (bias) add_bias(h, pp, t, bias, y, d.batch, d.out_channels, d.out_cells());
      return;
    }
  }
  // packed: x's region and y's box both copied; from the start for a 16-bit box with a
  // bias (its kernel adds over whole planes).
  bool packed = is_float16_v<T> && bias && !full_box;
  Plan* pl = &plan(Pass::Forward, shape_of(t, d, r, packed || !r.inside, packed));
  if (pl->algo < 0 && !packed) {
    packed = true;
    pl = &plan(Pass::Forward, shape_of(t, d, r, true, true));
  }
  DTENSOR_CHECK(pl->algo >= 0, CudaError, "cuDNN has no forward algorithm for ", to_string_dims(d));
  const bool copy_x = packed || !r.inside, copy_y = packed && !full_box;
  const int64_t planes_x = d.batch * d.in_channels, planes_y = d.batch * d.out_channels;
  std::unique_ptr<Scratch> xs, ys;
  const T* xin = x + offset_of(r.lo, d.in);
  if (copy_x) {
    xs = std::make_unique<Scratch>(planes_x * r.n[0] * r.n[1] * r.n[2] * sizeof(T), dev);
    copy_window(t, planes_x, r.n, x, d.in, r.lo, xs->get(), r.n, {0, 0, 0});
    xin = static_cast<const T*>(xs->get());
  }
  T* yout = y + offset_of(r.b, d.out);
  if (copy_y) {
    ys = std::make_unique<Scratch>(planes_y * r.e[0] * r.e[1] * r.e[2] * sizeof(T), dev);
    yout = static_cast<T*>(ys->get());
  }
  const scaling_t<T> one = 1, zero = 0;
  void* ws = th.workspace.get(pl->workspace, dev);
  DTENSOR_CUDNN(cudnnConvolutionForward(h, &one, pl->x.d, xin, pl->w.d, w, pl->conv.d,
                                        static_cast<cudnnConvolutionFwdAlgo_t>(pl->algo), ws, pl->workspace, &zero,
                                        pl->y.d, yout));
  if (bias) add_bias(h, *pl, t, bias, yout, d.batch, d.out_channels, r.e[0] * r.e[1] * r.e[2]);
  if (copy_y) copy_window(t, planes_y, r.e, yout, r.e, {0, 0, 0}, y, d.out, r.b);
}

template <class T>
void backward_data_typed(DType t, const ConvDims& d, const T* dy, const T* w, T* dx) {
  if (d.x_size() == 0) return;
  if (d.batch == 0 || d.out_cells() == 0) {
    DTENSOR_CUDA(cudaMemsetAsync(dx, 0, d.x_size() * sizeof(T), current_stream()));
    return;
  }
  Thread& th = thread();
  cudnnHandle_t h = th.handle.get();
  const int dev = th.handle.device();
  const Region r = region_of(d, OutBox{}.resolved(d));
  const scaling_t<T> one = 1, zero = 0;
  std::array<int64_t, 3> pad{};
  if (!r.inside && cudnn_pads(d, r, pad)) {  // cuDNN pads: dx written whole, no copy
    Plan& pp = plan(Pass::BackwardData, padded_shape_of(t, d, pad));
    if (pp.algo >= 0) {
      void* ws = th.workspace.get(pp.workspace, dev);
      DTENSOR_CUDNN(cudnnConvolutionBackwardData(h, &one, pp.w.d, w, pp.y.d, dy, pp.conv.d,
                                                 static_cast<cudnnConvolutionBwdDataAlgo_t>(pp.algo), ws,
                                                 pp.workspace, &zero, pp.x.d, dx));
      return;
    }
  }
  Plan* pl = &plan(Pass::BackwardData, shape_of(t, d, r, !r.inside, false));
  bool copy = !r.inside;
  if (pl->algo < 0) {
    copy = true;
    pl = &plan(Pass::BackwardData, shape_of(t, d, r, true, false));
    DTENSOR_CHECK(pl->algo >= 0, CudaError, "cuDNN has no backward data algorithm for ", to_string_dims(d));
  }
  const int64_t planes = d.batch * d.in_channels;
  void* ws = th.workspace.get(pl->workspace, dev);
  if (!copy) {
    // dx outside the region: no tap reads it, its gradient is 0.
    if (r.n != d.in) DTENSOR_CUDA(cudaMemsetAsync(dx, 0, d.x_size() * sizeof(T), current_stream()));
    DTENSOR_CUDNN(cudnnConvolutionBackwardData(h, &one, pl->w.d, w, pl->y.d, dy, pl->conv.d,
                                               static_cast<cudnnConvolutionBwdDataAlgo_t>(pl->algo), ws, pl->workspace,
                                               &zero, pl->x.d, dx + offset_of(r.lo, d.in)));
    return;
  }
  Scratch xs(planes * r.n[0] * r.n[1] * r.n[2] * sizeof(T), dev);
  DTENSOR_CUDNN(cudnnConvolutionBackwardData(h, &one, pl->w.d, w, pl->y.d, dy, pl->conv.d,
                                             static_cast<cudnnConvolutionBwdDataAlgo_t>(pl->algo), ws, pl->workspace,
                                             &zero, pl->x.d, xs.get()));
  // dx[p] = region[p - lo], 0 outside the region: every cell of dx.
  const std::array<int64_t, 3> back{-r.lo[0], -r.lo[1], -r.lo[2]};
  copy_window(t, planes, d.in, xs.get(), r.n, back, dx, d.in, {0, 0, 0});
}

template <class T>
void backward_weight_typed(DType t, const ConvDims& d, const T* x, const T* dy, T* dw, bool accumulate) {
  if (d.batch == 0 || d.out_cells() == 0) {
    if (!accumulate) DTENSOR_CUDA(cudaMemsetAsync(dw, 0, d.w_size() * sizeof(T), current_stream()));
    return;
  }
  Thread& th = thread();
  cudnnHandle_t h = th.handle.get();
  const int dev = th.handle.device();
  const Region r = region_of(d, OutBox{}.resolved(d));
  const scaling_t<T> one = 1, beta = accumulate ? 1 : 0;
  std::array<int64_t, 3> pad{};
  if (!r.inside && cudnn_pads(d, r, pad)) {  // cuDNN pads: x read in place
    Plan& pp = plan(Pass::BackwardFilter, padded_shape_of(t, d, pad));
    if (pp.algo >= 0) {
      void* ws = th.workspace.get(pp.workspace, dev);
      DTENSOR_CUDNN(cudnnConvolutionBackwardFilter(h, &one, pp.x.d, x, pp.y.d, dy, pp.conv.d,
                                                   static_cast<cudnnConvolutionBwdFilterAlgo_t>(pp.algo), ws,
                                                   pp.workspace, &beta, pp.w.d, dw));
      return;
    }
  }
  Plan* pl = &plan(Pass::BackwardFilter, shape_of(t, d, r, !r.inside, false));
  bool copy = !r.inside;
  if (pl->algo < 0) {
    copy = true;
    pl = &plan(Pass::BackwardFilter, shape_of(t, d, r, true, false));
    DTENSOR_CHECK(pl->algo >= 0, CudaError, "cuDNN has no backward filter algorithm for ", to_string_dims(d));
  }
  const int64_t planes = d.batch * d.in_channels;
  std::unique_ptr<Scratch> xs;
  const T* xin = x + offset_of(r.lo, d.in);
  if (copy) {
    xs = std::make_unique<Scratch>(planes * r.n[0] * r.n[1] * r.n[2] * sizeof(T), dev);
    copy_window(t, planes, r.n, x, d.in, r.lo, xs->get(), r.n, {0, 0, 0});
    xin = static_cast<const T*>(xs->get());
  }
  void* ws = th.workspace.get(pl->workspace, dev);
  DTENSOR_CUDNN(cudnnConvolutionBackwardFilter(h, &one, pl->x.d, xin, pl->y.d, dy, pl->conv.d,
                                               static_cast<cudnnConvolutionBwdFilterAlgo_t>(pl->algo), ws,
                                               pl->workspace, &beta, pl->w.d, dw));
}

template <class T>
void backward_bias_typed(DType t, const ConvDims& d, const T* dy, T* db, bool accumulate) {
  if (d.batch == 0 || d.out_cells() == 0) {
    if (!accumulate) DTENSOR_CUDA(cudaMemsetAsync(db, 0, d.out_channels * sizeof(T), current_stream()));
    return;
  }
  if constexpr (is_float16_v<T>) {
    // cuDNN documents no 16-bit bias gradient: the host's rule instead (compute/conv.hpp
    // backward_bias), db = its old value (accumulate) plus every plane's sum, in double,
    // rounded once. Rows of one double block: [db or 0; the planes' sums, batch x cout].
    const int64_t cout = d.out_channels, planes = d.batch * cout;
    const cudaStream_t s = current_stream();
    int dev = 0;  // this thread's device (no cuDNN call here has bound the handle to it)
    DTENSOR_CUDA(cudaGetDevice(&dev));
    Scratch buf(static_cast<std::size_t>(2 * cout + 2 * planes) * sizeof(double), dev);
    auto* rows = static_cast<double*>(buf.get());
    double* sums = rows + cout + 2 * planes;
    const StridedBlock channels = StridedBlock::contiguous(0, cout);
    if (accumulate) kernels::convert_block(t, db, channels, DType::Float64, rows, channels, s);
    else DTENSOR_CUDA(cudaMemsetAsync(rows, 0, static_cast<std::size_t>(cout) * sizeof(double), s));
    kernels::row_moments(t, dy, nullptr, nullptr, planes, d.out_cells(), rows + cout, s);  // sums, then squares
    kernels::reduce_dim(DType::Float64, ReduceOp::Sum, rows, sums, 1, d.batch + 1, cout, Scalar::of(1.0), s);
    kernels::convert_block(DType::Float64, sums, channels, t, db, channels, s);
    return;
  }
  cudnnHandle_t h = thread().handle.get();
  const Region r = region_of(d, OutBox{}.resolved(d));
  // Only the y and bias descriptors are used; the plan of the forward shape has them.
  const Plan& pl = plan(Pass::Forward, shape_of(t, d, r, true, false));
  const scaling_t<T> one = 1, beta = accumulate ? 1 : 0;
  DTENSOR_CUDNN(cudnnConvolutionBackwardBias(h, &one, pl.y.d, dy, &beta, pl.bias.d, db));
}

template <class F>
void typed(DType t, F&& f) {
  if (is_floating(t)) return visit_floating_dtype(t, f);
  (void)data_type(t);  // throws, naming the type
}

}  // namespace detail

// The device backend's entries (compute/device_backend.hpp); dims validated, the box resolved.
inline void conv_forward(DType t, const ConvDims& d, const void* x, const void* w, const void* bias, void* y,
                         const OutBox& box) {
  detail::typed(t, [&](auto tag) {
    using T = decltype(tag);
    detail::forward_typed(t, d, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias),
                          static_cast<T*>(y), box);
  });
}
inline void conv_backward_data(DType t, const ConvDims& d, const void* dy, const void* w, void* dx) {
  detail::typed(t, [&](auto tag) {
    using T = decltype(tag);
    detail::backward_data_typed(t, d, static_cast<const T*>(dy), static_cast<const T*>(w), static_cast<T*>(dx));
  });
}
inline void conv_backward_weight(DType t, const ConvDims& d, const void* x, const void* dy, void* dw, bool accumulate) {
  detail::typed(t, [&](auto tag) {
    using T = decltype(tag);
    detail::backward_weight_typed(t, d, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dw),
                                  accumulate);
  });
}
inline void conv_backward_bias(DType t, const ConvDims& d, const void* dy, void* db, bool accumulate) {
  detail::typed(t, [&](auto tag) {
    using T = decltype(tag);
    detail::backward_bias_typed(t, d, static_cast<const T*>(dy), static_cast<T*>(db), accumulate);
  });
}

#endif  // DTENSOR_WITH_CUDNN

}  // namespace dtensor::cuda::dnn
