// The host launchers of kernels.hpp: argument checks, the one DType switch per call,
// the fast paths that need no kernel (copies, memsets), and the launches themselves.
// Every launch goes through launch (launch.cuh), which checks it as DTENSOR_CUDA_LAUNCHED
// does, every empty input returns before any CUDA call, and grids are capped (the kernels
// loop over the rest).
#include "dtensor/cuda/kernels.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attention.cuh"
#include "block_copy.cuh"
#include "dtensor/cuda/error.hpp"
#include "dtensor/util/error.hpp"
#include "elementwise.cuh"
#include "grid.cuh"
#include "half_convert.cuh"
#include "launch.cuh"
#include "neighborhood_attention.cuh"
#include "optimizer.cuh"
#include "pool.cuh"
#include "random.cuh"
#include "reduce.cuh"
#include "row_stats.cuh"
#include "rows.cuh"
#include "softmax.cuh"
#include "spectral_mix.cuh"
#include "stencil.cuh"
#include "upsample.cuh"
#include "window_copy.cuh"

namespace dtensor::cuda::kernels {
namespace {

using detail::blocks_for;
using detail::Grid;
using detail::kMaxBlocks;
using detail::kThreads;
using detail::launch;
using detail::Runs;
using detail::runs_of;

constexpr const char* name(Binary op) {
  constexpr const char* names[] = {"add", "sub", "mul", "div"};
  return names[static_cast<int>(op)];
}
// Calls f(std::integral_constant<Binary, op>{}): the operator as a kernel's template argument.
template <class F>
void visit_binary(Binary op, F&& f) {
  switch (op) {
    case Binary::Add: return f(std::integral_constant<Binary, Binary::Add>{});
    case Binary::Sub: return f(std::integral_constant<Binary, Binary::Sub>{});
    case Binary::Mul: return f(std::integral_constant<Binary, Binary::Mul>{});
    case Binary::Div: return f(std::integral_constant<Binary, Binary::Div>{});
  }
}
using ::dtensor::name;  // of a UnaryFn, from its table entry

void check_size(int64_t n, const char* fn) {
  DTENSOR_CHECK(n >= 0, InvalidArgument, "cuda::kernels::", fn, ": negative size ", n);
}

void check_blocks(const StridedBlock& s, const StridedBlock& d, const char* fn) {
  DTENSOR_CHECK(s.count >= 0 && s.len >= 0 && d.count >= 0 && d.len >= 0, InvalidArgument, "cuda::kernels::", fn,
                ": a block with a negative count or run length");
  DTENSOR_CHECK(s.numel() == d.numel(), InvalidArgument, "cuda::kernels::", fn, ": the source block holds ",
                s.numel(), " elements and the destination block ", d.numel());
}

// Calls f(W{}) with the unsigned integer type W that moves an element of `bytes` bytes.
template <class F>
void visit_width(std::size_t bytes, F&& f) {
  switch (bytes) {
    case 1: return f(std::uint8_t{});
    case 2: return f(std::uint16_t{});
    case 4: return f(std::uint32_t{});
    default: return f(std::uint64_t{});
  }
}

// Stream-ordered scratch memory: allocated and freed in the stream's order, so it
// never makes the host wait, and freed on every path out of the launcher.
template <class T>
class Scratch {
 public:
  Scratch(std::size_t n, cudaStream_t stream) : stream_(stream) {
    DTENSOR_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&p_), n * sizeof(T), stream));
  }
  ~Scratch() { (void)cudaFreeAsync(p_, stream_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  cudaStream_t stream_;
};

// cudaMemcpy2D rejects pitches past the device's cudaDevAttrMaxPitch, which is
// 2^31 - 1 bytes on every current GPU.
constexpr int64_t kMaxPitch = std::numeric_limits<int32_t>::max();
// Below this many bytes per run, a 2-D copy moves rows too narrow for the copy
// engine to be efficient; the index-mapping kernel is faster.
constexpr int64_t kMin2DRunBytes = 256;

template <class T, ReduceOp Op>
void launch_reduce_block(const void* src, Runs s, void* dst, Runs d, int64_t n, bool contiguous,
                         cudaStream_t stream) {
  using detail::Layout;
  const auto* in = static_cast<const T*>(src);
  auto* out = static_cast<T*>(dst);
  if (contiguous) launch(detail::reduce_runs<T, Op, Layout::Contiguous>, Grid{blocks_for(n)}, stream, in, s, out, d, n);
  else launch(detail::reduce_runs<T, Op, Layout::Strided>, Grid{blocks_for(n)}, stream, in, s, out, d, n);
}

// One partial result per grid block, then one block to combine them: no
// atomics, which 1-byte integers lack, and the same answer run to run.
template <class T, class Out, class Acc, class Map, class Op>
void reduce_to_scalar(const T* a, int64_t n, Out* out, Acc init, Map map, Op op, cudaStream_t stream) {
  const unsigned blocks = detail::partial_blocks(n);
  if (blocks == 1) {
    launch(detail::reduce_all<T, Acc, Out, Map, Op>, Grid{1}, stream, a, n, out, init, map, op);
    return;
  }
  Scratch<Acc> partials(blocks, stream);
  launch(detail::reduce_all<T, Acc, Acc, Map, Op>, Grid{blocks}, stream, a, n, partials.get(), init, map, op);
  launch(detail::finish_all<Acc, Out, Op>, Grid{1}, stream, partials.get(), static_cast<int64_t>(blocks), out, init,
         op);
}

template <class T, class A, class Op>
void launch_reduce_dim(const T* in, T* out, int64_t len, int64_t inner, int64_t outs, A init, Op op, A scale,
                       cudaStream_t stream) {
  if (detail::reduce_by_rows(len, inner, outs)) {
    const auto blocks = static_cast<unsigned>(std::min(outs, kMaxBlocks));
    launch(detail::reduce_rows<T, Op>, Grid{blocks}, stream, in, out, len, inner, outs, init, op, scale);
  } else {
    launch(detail::reduce_columns<T, Op>, Grid{blocks_for(outs)}, stream, in, out, len, inner, outs, init, op, scale);
  }
}

template <class T, bool Log>
void launch_softmax_shift(T* x, const T* max, T* sums, int64_t len, int64_t inner, int64_t outs,
                          cudaStream_t stream) {
  if (detail::reduce_by_rows(len, inner, outs)) {
    const auto blocks = static_cast<unsigned>(std::min(outs, kMaxBlocks));
    launch(detail::softmax_shift_rows<T, Log>, Grid{blocks}, stream, x, max, sums, len, inner, outs);
  } else {
    launch(detail::softmax_shift_columns<T, Log>, Grid{blocks_for(outs)}, stream, x, max, sums, len, inner, outs);
  }
}

// Calls f(T{}) with the C++ type of `t` for the types the kernels compute in: the
// integers, float and double, and bfloat16 and float16 (dtensor's own types, whose
// conversions are host-device functions: each element is loaded into float, computed
// on, and rounded once when stored; elementwise.cuh's load).
template <class F>
void visit_kernel_dtype(DType t, const char* fn, F&& f) {
  DTENSOR_CHECK(!is_complex(t), InvalidArgument, "cuda::kernels::", fn, ": ", ::dtensor::name(t),
                " elements are not computed on the GPU (they move, add in reductions and are Fourier transformed: "
                "spectral/; elementwise math on them is host-only)");
  visit_dtype(t, [&](auto tag) {
    if constexpr (!is_complex_v<decltype(tag)>) f(tag);
  });
}

// A block of complex elements as the block of their real and imaginary parts: what a
// sum or a division of complex numbers does to each part (Max and Min are refused
// before: complex numbers have no order).
DType as_reals(DType t, StridedBlock& b) {
  if (!is_complex(t)) return t;
  b.offset *= 2, b.stride *= 2, b.len *= 2;
  return t == DType::Complex64 ? DType::Float32 : DType::Float64;
}

void check_floating(DType t, const char* fn) {
  DTENSOR_CHECK(t == DType::Float32 || t == DType::Float64, InvalidArgument, "cuda::kernels::", fn,
                " is defined for float32 and float64, not ", ::dtensor::name(t));
}

// Calls f(float{}) or f(double{}) with the C++ type of a floating `t`, so that only the
// floating instantiations of f are compiled. Its callers reject the integer types first
// (check_floating), and for one of those it does nothing.
template <class F>
void visit_floating(DType t, F&& f) {
  switch (t) {
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    default: return;
  }
}

// The same for the kernels that also take bfloat16 and float16 (computing in float):
// refused unless floating, then visit_floating_dtype (core/dtype.hpp).
void check_floating_or_16(DType t, const char* fn) {
  DTENSOR_CHECK(is_floating(t), InvalidArgument, "cuda::kernels::", fn,
                " is defined for float32, float64, bfloat16 and float16, not ", ::dtensor::name(t));
}

}  // namespace

// --- data movement ---

void copy_block(const void* src, StridedBlock sb, void* dst, StridedBlock db, std::size_t elem, cudaStream_t stream) {
  check_blocks(sb, db, "copy_block");
  const int64_t n = sb.numel();
  if (n == 0 || elem == 0) return;
  const auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  const auto size = static_cast<int64_t>(elem);

  if (sb.is_contiguous() && db.is_contiguous()) {
    const std::byte* from = s + sb.offset * size;
    std::byte* to = d + db.offset * size;
    // cudaMemcpyDefault: the pointers' kinds come from unified addressing, so a
    // pinned host buffer works as well as device memory.
    if (from != to)
      DTENSOR_CUDA(cudaMemcpyAsync(to, from, static_cast<std::size_t>(n * size), cudaMemcpyDefault, stream));
    return;
  }

  // Equal runs on both sides (equal element counts make the run counts equal too).
  const int64_t run_bytes = sb.len * size;
  if (sb.len == db.len && sb.stride >= sb.len && db.stride >= db.len && run_bytes >= kMin2DRunBytes &&
      sb.stride * size <= kMaxPitch && db.stride * size <= kMaxPitch) {
    DTENSOR_CUDA(cudaMemcpy2DAsync(d + db.offset * size, static_cast<std::size_t>(db.stride * size),
                                   s + sb.offset * size, static_cast<std::size_t>(sb.stride * size),
                                   static_cast<std::size_t>(run_bytes), static_cast<std::size_t>(sb.count),
                                   cudaMemcpyDefault, stream));
    return;
  }

  // The index-mapping kernel (see word_copy).
  const detail::WordCopy c = detail::word_copy(src, sb, dst, db, size);
  visit_width(static_cast<std::size_t>(c.width), [&](auto tag) {
    using W = decltype(tag);
    launch(detail::copy_runs<W>, Grid{blocks_for(c.words)}, stream, static_cast<const W*>(src), c.src,
           static_cast<W*>(dst), c.dst, c.words);
  });
}

void reduce_block(DType t, ReduceOp op, const void* src, StridedBlock sb, void* dst, StridedBlock db,
                  cudaStream_t stream) {
  check_blocks(sb, db, "reduce_block");
  ::dtensor::detail::check_orderable(t, op, "cuda::kernels::reduce_block");
  (void)as_reals(t, sb);
  t = as_reals(t, db);
  const int64_t n = sb.numel();
  if (n == 0) return;
  const bool contiguous = sb.is_contiguous() && db.is_contiguous();
  const Runs s = runs_of(sb), d = runs_of(db);
  visit_kernel_dtype(t, "reduce_block", [&](auto tag) {
    using T = decltype(tag);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return launch_reduce_block<T, ReduceOp::Sum>(src, s, dst, d, n, contiguous, stream);
      case ReduceOp::Max: return launch_reduce_block<T, ReduceOp::Max>(src, s, dst, d, n, contiguous, stream);
      case ReduceOp::Min: return launch_reduce_block<T, ReduceOp::Min>(src, s, dst, d, n, contiguous, stream);
    }
  });
}

void divide_block(DType t, void* dst, StridedBlock db, int terms, cudaStream_t stream) {
  DTENSOR_CHECK(db.count >= 0 && db.len >= 0, InvalidArgument,
                "cuda::kernels::divide_block: a block with a negative count or run length");
  DTENSOR_CHECK(terms != 0, InvalidArgument, "cuda::kernels::divide_block: division by zero terms");
  t = as_reals(t, db);
  const int64_t n = db.numel();
  if (n == 0) return;
  const Runs d = runs_of(db);
  visit_kernel_dtype(t, "divide_block", [&](auto tag) {
    using T = decltype(tag);
    using detail::Layout;
    auto* p = static_cast<T*>(dst);
    const auto by = static_cast<accumulator_t<T>>(terms);
    if (db.is_contiguous())
      launch(detail::divide_runs<T, Layout::Contiguous>, Grid{blocks_for(n)}, stream, p, d, by, n);
    else
      launch(detail::divide_runs<T, Layout::Strided>, Grid{blocks_for(n)}, stream, p, d, by, n);
  });
}

void convert_block(DType from, const void* src, StridedBlock sb, DType to, void* dst, StridedBlock db,
                   cudaStream_t stream) {
  check_blocks(sb, db, "convert_block");
  DTENSOR_CHECK(is_floating(from) && is_floating(to), InvalidArgument,
                "cuda::kernels::convert_block: converts between float32, float64, bfloat16 and float16, not ",
                ::dtensor::name(from), " to ", ::dtensor::name(to));
  const int64_t n = sb.numel();
  if (n == 0) return;
  const bool contiguous = sb.is_contiguous() && db.is_contiguous();
  const Runs s = runs_of(sb), d = runs_of(db);
  visit_floating_dtype(from, [&](auto from_tag) {
    visit_floating_dtype(to, [&](auto to_tag) {
      using F = decltype(from_tag);
      using T = decltype(to_tag);
      using detail::Layout;
      const auto* in = static_cast<const F*>(src);
      auto* out = static_cast<T*>(dst);
      if (contiguous)
        launch(detail::convert_runs<F, T, Layout::Contiguous>, Grid{blocks_for(n)}, stream, in, s, out, d, n);
      else
        launch(detail::convert_runs<F, T, Layout::Strided>, Grid{blocks_for(n)}, stream, in, s, out, d, n);
    });
  });
}

void fill(DType t, void* dst, int64_t n, Scalar value, cudaStream_t stream) {
  check_size(n, "fill");
  if (n == 0) return;
  // A 16-bit float fills as its bit pattern: a fill is a copy of one element.
  if (is_float16(t)) {
    launch(detail::fill_kernel<std::uint16_t>, Grid{blocks_for(n)}, stream, static_cast<std::uint16_t*>(dst),
           value.as<std::uint16_t>(), n);
    return;
  }
  visit_kernel_dtype(t, "fill", [&](auto tag) {
    using T = decltype(tag);
    const T v = value.as<T>();
    // All-zero bits are zero in every dtype (but -0.0 is not all zeros).
    if (v == T(0) && !(std::is_floating_point_v<T> && std::signbit(static_cast<double>(v)))) {
      DTENSOR_CUDA(cudaMemsetAsync(dst, 0, static_cast<std::size_t>(n) * sizeof(T), stream));
      return;
    }
    launch(detail::fill_kernel<T>, Grid{blocks_for(n)}, stream, static_cast<T*>(dst), v, n);
  });
}

// --- elementwise ---

void binary(DType t, Binary op, const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  check_size(n, name(op));
  if (n == 0) return;
  visit_kernel_dtype(t, "binary", [&](auto tag) {
    using T = decltype(tag);
    const auto* x = static_cast<const T*>(a);
    const auto* y = static_cast<const T*>(b);
    auto* z = static_cast<T*>(out);
    visit_binary(op, [&](auto k) {
      launch(detail::binary_kernel<T, decltype(k)::value>, Grid{blocks_for(n)}, stream, x, y, z, n);
    });
  });
}

void binary_scalar(DType t, Binary op, const void* a, Scalar s, void* out, int64_t n, cudaStream_t stream) {
  check_size(n, name(op));
  if (n == 0) return;
  visit_kernel_dtype(t, "binary_scalar", [&](auto tag) {
    using T = decltype(tag);
    const auto* x = static_cast<const T*>(a);
    const auto v = s.as<accumulator_t<T>>();  // a 16-bit tensor's scalar is a float
    auto* z = static_cast<T*>(out);
    visit_binary(op, [&](auto k) {
      launch(detail::binary_scalar_kernel<T, decltype(k)::value>, Grid{blocks_for(n)}, stream, x, v, z, n);
    });
  });
}

void unary(DType t, Unary f, const void* a, void* out, int64_t n, cudaStream_t stream) {
  check_size(n, name(f));
  DTENSOR_CHECK(takes_integers(f) || is_floating(t), InvalidArgument, "cuda::kernels::unary: ", name(f),
                " is defined for floating-point elements, not ", ::dtensor::name(t));
  if (n == 0) return;
  visit_kernel_dtype(t, "unary", [&](auto tag) {
    using T = decltype(tag);
    const auto* x = static_cast<const T*>(a);
    auto* z = static_cast<T*>(out);
    visit_unary(f, [&](auto k) {
      constexpr Unary F = decltype(k)::value;
      if constexpr (FloatingElement<T> || ::dtensor::UnaryMath<F>::integers) {
        launch(detail::unary_kernel<T, F>, Grid{blocks_for(n)}, stream, x, z, n);
      }
    });
  });
}

void unary_backward(DType t, Unary f, const void* x, const void* dy, void* dx, int64_t n, cudaStream_t stream) {
  check_size(n, name(f));
  check_floating_or_16(t, "unary_backward");
  if (n == 0) return;
  visit_floating_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    visit_unary(f, [&](auto k) {
      launch(detail::unary_backward_kernel<T, decltype(k)::value>, Grid{blocks_for(n)}, stream,
             static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n);
    });
  });
}

void add_bias(DType t, const void* m, const void* v, void* out, int64_t rows, int64_t cols, bool along_rows,
              cudaStream_t stream) {
  check_size(rows, "add_bias");
  check_size(cols, "add_bias");
  const int64_t n = rows * cols;
  if (n == 0) return;
  visit_kernel_dtype(t, "add_bias", [&](auto tag) {
    using T = decltype(tag);
    const auto* x = static_cast<const T*>(m);
    const auto* b = static_cast<const T*>(v);
    auto* z = static_cast<T*>(out);
    if (along_rows) launch(detail::add_bias_kernel<T, true>, Grid{blocks_for(n)}, stream, x, b, z, cols, n);
    else launch(detail::add_bias_kernel<T, false>, Grid{blocks_for(n)}, stream, x, b, z, cols, n);
  });
}

void transpose(DType t, const void* in, void* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  check_size(rows, "transpose");
  check_size(cols, "transpose");
  const int64_t n = rows * cols;
  if (n == 0) return;
  DTENSOR_CHECK(!is_complex(t), InvalidArgument, "cuda::kernels::transpose: ", ::dtensor::name(t),
                " elements are not computed on the GPU (they move, add in reductions and are Fourier transformed)");
  const std::size_t elem = size_of(t);
  if (rows == 1 || cols == 1) {  // a vector: the same elements in the same order
    if (in != out)
      DTENSOR_CUDA(cudaMemcpyAsync(out, in, static_cast<std::size_t>(n) * elem, cudaMemcpyDefault, stream));
    return;
  }
  using detail::kTile;
  const int64_t tiles_c = (cols + kTile - 1) / kTile;
  const int64_t tiles = (rows + kTile - 1) / kTile * tiles_c;
  const auto blocks = static_cast<unsigned>(std::min(tiles, kMaxBlocks));
  const dim3 threads(kTile, detail::kTileRows);
  visit_width(elem, [&](auto tag) {
    using W = decltype(tag);
    launch(detail::transpose_kernel<W>, Grid{blocks, threads}, stream, static_cast<const W*>(in), static_cast<W*>(out),
           rows, cols, tiles_c, tiles);
  });
}

// --- reductions ---

void reduce_dim(DType t, Reduce r, const void* in, void* out, int64_t outer, int64_t len, int64_t inner, Scalar scale,
                cudaStream_t stream) {
  check_size(outer, "reduce_dim");
  check_size(len, "reduce_dim");
  check_size(inner, "reduce_dim");
  const int64_t outs = outer * inner;
  if (outs == 0) return;
  visit_kernel_dtype(t, "reduce_dim", [&](auto tag) {
    using T = decltype(tag);
    const auto* x = static_cast<const T*>(in);
    auto* y = static_cast<T*>(out);
    using A = accumulator_t<T>;
    const A init = detail::identity<A>(r);
    const A s = scale.as<A>();
    switch (r) {
      case Reduce::Sum:
      case Reduce::Avg: return launch_reduce_dim(x, y, len, inner, outs, init, detail::SumOp{}, s, stream);
      case Reduce::Max: return launch_reduce_dim(x, y, len, inner, outs, init, detail::MaxOp{}, s, stream);
      case Reduce::Min: return launch_reduce_dim(x, y, len, inner, outs, init, detail::MinOp{}, s, stream);
    }
  });
}

void where_equal(DType t, const void* x, const void* y, const void* v, void* out, int64_t outer, int64_t len,
                 int64_t inner, cudaStream_t stream) {
  check_size(outer, "where_equal");
  check_size(len, "where_equal");
  check_size(inner, "where_equal");
  const int64_t n = outer * len * inner;
  if (n == 0) return;
  visit_kernel_dtype(t, "where_equal", [&](auto tag) {
    using T = decltype(tag);
    launch(detail::where_equal_kernel<T>, Grid{blocks_for(n)}, stream, static_cast<const T*>(x),
           static_cast<const T*>(y), static_cast<const T*>(v), static_cast<T*>(out), len, inner, n);
  });
}

// --- rows picked by index ---

void gather_rows(DType t, const void* table, int64_t table_rows, int64_t cols, const int64_t* index, int64_t rows,
                 int64_t lo, void* out, cudaStream_t stream) {
  check_size(table_rows, "gather_rows");
  check_size(cols, "gather_rows");
  check_size(rows, "gather_rows");
  const int64_t n = rows * cols;
  if (n == 0) return;
  visit_kernel_dtype(t, "gather_rows", [&](auto tag) {
    using T = decltype(tag);
    launch(detail::gather_rows_kernel<T>, Grid{blocks_for(n)}, stream, static_cast<const T*>(table), table_rows, cols,
           index, lo, static_cast<T*>(out), n);
  });
}

void scatter_add_rows(DType t, const void* dy, const int64_t* index, int64_t rows, int64_t cols, int64_t lo,
                      void* table, int64_t table_rows, cudaStream_t stream) {
  check_size(table_rows, "scatter_add_rows");
  check_size(cols, "scatter_add_rows");
  check_size(rows, "scatter_add_rows");
  if (rows == 0 || cols == 0 || table_rows == 0) return;
  const int64_t chunk = detail::scatter_chunk(table_rows, cols);
  const int64_t items = (table_rows + chunk - 1) / chunk * cols;
  visit_kernel_dtype(t, "scatter_add_rows", [&](auto tag) {
    using T = decltype(tag);
    const auto* g = static_cast<const T*>(dy);
    if constexpr (is_float16_v<T>) {
      // The table widened into float scratch (exact), the sums there, then rounded back
      // once: an embedding row hit by many tokens must not add in 16 bits. The cost is
      // the whole table's float copy and two passes over it per call, however few rows
      // are hit (widening only the touched rows is the next step, if a GPU run says so).
      const int64_t n = table_rows * cols;
      const Runs all = runs_of(StridedBlock::contiguous(0, n));
      Scratch<float> wide(static_cast<std::size_t>(n), stream);
      using detail::Layout;
      launch(detail::convert_runs<T, float, Layout::Contiguous>, Grid{blocks_for(n)}, stream,
             static_cast<const T*>(table), all, wide.get(), all, n);
      launch(detail::scatter_add_rows_kernel<T, float>, Grid{blocks_for(items)}, stream, g, index, rows, cols, lo,
             wide.get(), table_rows, chunk, items);
      launch(detail::convert_runs<float, T, Layout::Contiguous>, Grid{blocks_for(n)}, stream,
             static_cast<const float*>(wide.get()), all, static_cast<T*>(table), all, n);
    } else {
      launch(detail::scatter_add_rows_kernel<T>, Grid{blocks_for(items)}, stream, g, index, rows, cols, lo,
             static_cast<T*>(table), table_rows, chunk, items);
    }
  });
}

void take_along_last(DType t, const void* x, int64_t rows, int64_t cols, const int64_t* target, int64_t lo, void* out,
                     cudaStream_t stream) {
  check_size(rows, "take_along_last");
  check_size(cols, "take_along_last");
  if (rows == 0) return;
  visit_kernel_dtype(t, "take_along_last", [&](auto tag) {
    using T = decltype(tag);
    launch(detail::take_along_last_kernel<T>, Grid{blocks_for(rows)}, stream, static_cast<const T*>(x), rows, cols,
           target, lo, static_cast<T*>(out));
  });
}

void add_along_last(DType t, const void* g, const int64_t* target, int64_t lo, void* x, int64_t rows, int64_t cols,
                    cudaStream_t stream) {
  check_size(rows, "add_along_last");
  check_size(cols, "add_along_last");
  if (rows == 0 || cols == 0) return;
  visit_kernel_dtype(t, "add_along_last", [&](auto tag) {
    using T = decltype(tag);
    launch(detail::add_along_last_kernel<T>, Grid{blocks_for(rows)}, stream, static_cast<const T*>(g), target, lo,
           static_cast<T*>(x), rows, cols);
  });
}

void sum_squares(DType t, const void* a, int64_t n, void* out, cudaStream_t stream) {
  check_size(n, "sum_squares");
  if (n == 0) {  // the empty sum, written without a launch (all-zero bits are zero in every dtype)
    DTENSOR_CUDA(cudaMemsetAsync(out, 0, is_float16(t) ? sizeof(double) : size_of(t), stream));
    return;
  }
  visit_kernel_dtype(t, "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    // float accumulates in double: a thread may add up thousands of squares before the
    // tree, and the loads, not the arithmetic, bound the kernel. A 16-bit type's sum is
    // written as the double itself: rounded to 16 bits it would lose its digits (and a
    // float16 sum past 65504 would be infinite, a GradScaler's "overflow").
    using Acc = std::conditional_t<std::is_same_v<T, float> || is_float16_v<T>, double, detail::wrap_t<T>>;
    using Out = std::conditional_t<is_float16_v<T>, double, T>;
    reduce_to_scalar(static_cast<const T*>(a), n, static_cast<Out*>(out), Acc(0), detail::Square<Acc>{},
                     detail::SumOp{}, stream);
  });
}

void max_abs(DType t, const void* a, int64_t n, void* out, cudaStream_t stream) {
  check_size(n, "max_abs");
  if (n == 0) {
    DTENSOR_CUDA(cudaMemsetAsync(out, 0, size_of(t), stream));
    return;
  }
  visit_kernel_dtype(t, "max_abs", [&](auto tag) {
    using T = decltype(tag);
    reduce_to_scalar(static_cast<const T*>(a), n, static_cast<T*>(out), accumulator_t<T>(0), detail::Magnitude{},
                     detail::MaxNanOp{}, stream);
  });
}

void softmax_shift(DType t, void* x, const void* max, void* sums, int64_t outer, int64_t len, int64_t inner, bool log,
                   cudaStream_t stream) {
  check_floating(t, "softmax_shift");
  check_size(outer, "softmax_shift");
  check_size(len, "softmax_shift");
  check_size(inner, "softmax_shift");
  const int64_t outs = outer * inner;
  if (outs == 0) return;
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    auto* p = static_cast<T*>(x);
    const auto* m = static_cast<const T*>(max);
    auto* s = static_cast<T*>(sums);
    if (log) launch_softmax_shift<T, true>(p, m, s, len, inner, outs, stream);
    else launch_softmax_shift<T, false>(p, m, s, len, inner, outs, stream);
  });
}

void softmax_finish(DType t, void* x, const void* sums, int64_t outer, int64_t len, int64_t inner, bool log,
                    cudaStream_t stream) {
  check_floating(t, "softmax_finish");
  check_size(outer, "softmax_finish");
  check_size(len, "softmax_finish");
  check_size(inner, "softmax_finish");
  const int64_t n = outer * len * inner;
  if (n == 0) return;
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    auto* p = static_cast<T*>(x);
    const auto* s = static_cast<const T*>(sums);
    if (log) launch(detail::softmax_finish_kernel<T, true>, Grid{blocks_for(n)}, stream, p, s, len, inner, n);
    else launch(detail::softmax_finish_kernel<T, false>, Grid{blocks_for(n)}, stream, p, s, len, inner, n);
  });
}

void random_fill(DType t, void* dst, const CounterBox& box, const CounterDraw& draw, cudaStream_t stream) {
  check_floating(t, "random_fill");
  DTENSOR_CHECK(box.rank >= 0 && box.rank <= CounterBox::kMaxRank, InvalidArgument, "cuda::kernels::random_fill: ",
                box.rank, " dims (at most ", CounterBox::kMaxRank, ")");
  const int64_t n = box.numel();
  check_size(n, "random_fill");
  if (n == 0) return;
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    launch(detail::random_fill_kernel<T>, Grid{blocks_for(n)}, stream, static_cast<T*>(dst), box, draw, n);
  });
}

void row_moments(DType t, const void* a, const void* b, const double* shift, int64_t rows, int64_t cols, double* out,
                 cudaStream_t stream) {
  check_floating_or_16(t, "row_moments");
  check_size(rows, "row_moments");
  check_size(cols, "row_moments");
  if (rows == 0) return;
  visit_floating_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(rows, kMaxBlocks));
    launch(detail::row_moments_kernel<T>, Grid{blocks}, stream, static_cast<const T*>(a), static_cast<const T*>(b),
           shift, rows, cols, out);
  });
}

void row_affine(DType t, const void* a, const void* b, const RowTerms& terms, int64_t rows, int64_t cols, void* out,
                cudaStream_t stream) {
  check_floating_or_16(t, "row_affine");
  check_size(rows, "row_affine");
  check_size(cols, "row_affine");
  const int64_t n = rows * cols;
  if (n == 0) return;
  visit_floating_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    launch(detail::row_affine_kernel<T>, Grid{blocks_for(n)}, stream, static_cast<const T*>(a),
           static_cast<const T*>(b), terms, cols, static_cast<T*>(out), n);
  });
}

void sgd_update(DType t, void* w, const void* g, void* buf, int64_t n, const SgdStep& s, cudaStream_t stream) {
  check_floating(t, "sgd_update");
  check_size(n, "sgd_update");
  if (n == 0) return;
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    launch(detail::sgd_update_kernel<T>, Grid{blocks_for(n)}, stream, static_cast<T*>(w), static_cast<const T*>(g),
           static_cast<T*>(buf), n, static_cast<T>(s.lr), static_cast<T>(s.momentum), static_cast<T>(s.weight_decay),
           s.nesterov, s.first);
  });
}

void adamw_update(DType t, void* w, const void* g, void* m, void* v, int64_t n, const AdamWStep& s,
                  cudaStream_t stream) {
  check_floating(t, "adamw_update");
  check_size(n, "adamw_update");
  if (n == 0) return;
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    launch(detail::adamw_update_kernel<T>, Grid{blocks_for(n)}, stream, static_cast<T*>(w), static_cast<const T*>(g),
           static_cast<T*>(m), static_cast<T*>(v), n, static_cast<T>(s.lr), static_cast<T>(s.beta1),
           static_cast<T>(s.beta2), static_cast<T>(s.eps), static_cast<T>(s.weight_decay),
           static_cast<T>(s.bias_correction1), static_cast<T>(s.bias_correction2));
  });
}

// --- sliding windows and upsampling ---

void pool_forward(DType t, const PoolDims& p, const void* x, void* y, const OutBox& box, cudaStream_t stream) {
  check_floating_or_16(t, "pool_forward");
  const detail::PoolGeo g = detail::pool_geo(p, box);
  const int64_t n = g.planes * g.box_cells;
  if (n == 0) return;
  visit_floating_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    launch(detail::pool_forward_kernel<T>, Grid{blocks_for(n)}, stream, static_cast<const T*>(x), static_cast<T*>(y),
           g, n);
  });
}

void pool_backward(DType t, const PoolDims& p, const void* x, const void* dy, void* dx, cudaStream_t stream) {
  check_floating_or_16(t, "pool_backward");
  const detail::PoolGeo g = detail::pool_geo(p, OutBox{}.resolved(p.window));
  const int64_t n = g.planes * g.in_cells, outs = g.planes * g.out_cells;
  if (n == 0) return;
  visit_floating_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const auto* xs = static_cast<const T*>(x);
    if (g.max && outs > 0) {  // each output's winning tap, then the gather
      Scratch<int32_t> arg(static_cast<std::size_t>(outs), stream);
      launch(detail::pool_argmax_kernel<T>, Grid{blocks_for(outs)}, stream, xs, arg.get(), g, outs);
      launch(detail::pool_backward_kernel<T>, Grid{blocks_for(n)}, stream, arg.get(), static_cast<const T*>(dy),
             static_cast<T*>(dx), g, n);
      return;
    }
    launch(detail::pool_backward_kernel<T>, Grid{blocks_for(n)}, stream, static_cast<const int32_t*>(nullptr),
           static_cast<const T*>(dy), static_cast<T*>(dx), g, n);
  });
}

void upsample_forward(DType t, const UpsampleDims& u, const void* x, void* y, cudaStream_t stream) {
  check_floating_or_16(t, "upsample_forward");
  const detail::UpGeo g = detail::up_geo(u);
  const int64_t n = g.planes * g.out_cells;
  if (n == 0) return;
  visit_floating_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    launch(detail::upsample_forward_kernel<T>, Grid{blocks_for(n)}, stream, static_cast<const T*>(x),
           static_cast<T*>(y), g, n);
  });
}

void upsample_backward(DType t, const UpsampleDims& u, const void* dy, void* dx, cudaStream_t stream) {
  check_floating_or_16(t, "upsample_backward");
  const detail::UpGeo g = detail::up_geo(u);
  const int64_t n = g.planes * g.in_cells;
  if (n == 0) return;
  visit_floating_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    launch(detail::upsample_backward_kernel<T>, Grid{blocks_for(n)}, stream, static_cast<const T*>(dy),
           static_cast<T*>(dx), g, n);
  });
}

void window_copy(DType t, int64_t planes, const std::array<int64_t, 3>& box, const void* src,
                 const std::array<int64_t, 3>& src_ext, const std::array<int64_t, 3>& src_start, void* dst,
                 const std::array<int64_t, 3>& dst_ext, const std::array<int64_t, 3>& dst_start, cudaStream_t stream) {
  check_size(planes, "window_copy");
  detail::WindowCopy c{};
  c.planes = planes;
  // Unused trailing dims (extent 1 everywhere) move to the front: consecutive threads
  // then walk the last used dim, which is contiguous.
  int used = 3;
  while (used > 0 && box[used - 1] == 1 && src_ext[used - 1] == 1 && dst_ext[used - 1] == 1 &&
         src_start[used - 1] == 0 && dst_start[used - 1] == 0)
    --used;
  const int shift = 3 - used;
  for (int i = 0; i < 3; ++i) {
    const int j = i - shift;
    c.ext[i] = j >= 0 ? box[j] : 1;
    c.src_ext[i] = j >= 0 ? src_ext[j] : 1, c.src_start[i] = j >= 0 ? src_start[j] : 0;
    c.dst_ext[i] = j >= 0 ? dst_ext[j] : 1, c.dst_start[i] = j >= 0 ? dst_start[j] : 0;
    DTENSOR_CHECK(c.ext[i] >= 0 && c.dst_start[i] >= 0 && c.dst_start[i] + c.ext[i] <= c.dst_ext[i],
                  InvalidArgument, "cuda::kernels::window_copy: the box leaves the destination block");
  }
  c.src_plane = c.src_ext[0] * c.src_ext[1] * c.src_ext[2];
  c.dst_plane = c.dst_ext[0] * c.dst_ext[1] * c.dst_ext[2];
  const int64_t n = planes * c.ext[0] * c.ext[1] * c.ext[2];
  if (n == 0) return;
  visit_width(size_of(t), [&](auto tag) {
    using W = decltype(tag);
    launch(detail::window_copy_kernel<W>, Grid{blocks_for(n)}, stream, static_cast<const W*>(src), static_cast<W*>(dst),
           c, n);
  });
}

// --- attention ---

namespace {

// The tile of one attention kernel for d's head dim, or an error naming the head dim
// that does not fit a block's shared memory.
int64_t attention_tile_for(const compute::AttentionDims& d, int64_t elem, int rows, int pairs, int scalars,
                           const char* fn) {
  const int64_t tile = detail::attention_tile(d.head_dim, elem, rows, pairs, scalars);
  DTENSOR_CHECK(tile > 0, InvalidArgument, "cuda::kernels::", fn, ": head dim ", d.head_dim, " of ", elem,
                "-byte elements does not fit the kernel's shared memory (", detail::kAttentionSharedBytes,
                " bytes for one row of each tile); use a smaller head dim");
  return tile;
}

unsigned attention_blocks(int64_t jobs) { return static_cast<unsigned>(std::min<int64_t>(jobs, kMaxBlocks)); }

}  // namespace

void float_to_half(HalfKind kind, const float* src, void* dst, int64_t n, cudaStream_t stream) {
  check_size(n, "float_to_half");
  if (n == 0) return;
  if (kind == HalfKind::BFloat16)
    launch(detail::float_to_half_kernel<__nv_bfloat16>, Grid{blocks_for(n)}, stream, src,
           static_cast<__nv_bfloat16*>(dst), n);
  else
    launch(detail::float_to_half_kernel<__half>, Grid{blocks_for(n)}, stream, src, static_cast<__half*>(dst), n);
}

void half_to_float(HalfKind kind, const void* src, float* dst, int64_t n, cudaStream_t stream) {
  check_size(n, "half_to_float");
  if (n == 0) return;
  if (kind == HalfKind::BFloat16)
    launch(detail::half_to_float_kernel<__nv_bfloat16>, Grid{blocks_for(n)}, stream,
           static_cast<const __nv_bfloat16*>(src), dst, n);
  else
    launch(detail::half_to_float_kernel<__half>, Grid{blocks_for(n)}, stream, static_cast<const __half*>(src), dst,
           n);
}

void attention_forward(DType t, const compute::AttentionDims& dims, const void* q, const void* k, const void* v,
                       const void* mask, void* o, void* lse, cudaStream_t stream) {
  check_floating(t, "attention_forward");
  dims.check("cuda::kernels::attention_forward");
  compute::AttentionDims d = dims;
  d.scale = d.softmax_scale();
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    const int64_t tile = attention_tile_for(d, sizeof(T), detail::kForwardRows, detail::kForwardPairs,
                                            detail::kForwardScalars, "attention_forward");
    const int64_t jobs = d.batch * d.heads * ((d.q_len + tile - 1) / tile);
    if (jobs == 0) return;
    const auto bytes = static_cast<std::size_t>(
        detail::attention_shared_elems(tile, d.head_dim, detail::kForwardRows, detail::kForwardPairs,
                                       detail::kForwardScalars) * static_cast<int64_t>(sizeof(T)));
    launch(detail::attention_forward_kernel<T>, Grid{attention_blocks(jobs), kThreads, bytes}, stream, d,
           static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<const T*>(mask),
           static_cast<T*>(o), static_cast<T*>(lse), tile);
  });
}

void attention_backward(DType t, const compute::AttentionDims& dims, const void* q, const void* k, const void* v,
                        const void* mask, const void* o, const void* lse, const void* dout, void* dq, void* dk,
                        void* dv, cudaStream_t stream) {
  check_floating(t, "attention_backward");
  dims.check("cuda::kernels::attention_backward");
  compute::AttentionDims d = dims;
  d.scale = d.softmax_scale();
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    const auto* qs = static_cast<const T*>(q);
    const auto* ks = static_cast<const T*>(k);
    const auto* vs = static_cast<const T*>(v);
    const auto* ms = static_cast<const T*>(mask);
    const auto* os = static_cast<const T*>(o);
    const auto* ls = static_cast<const T*>(lse);
    const auto* dos = static_cast<const T*>(dout);
    const int64_t elem = sizeof(T);
    const int64_t q_tile = attention_tile_for(d, elem, detail::kDqRows, detail::kBackwardPairs,
                                              detail::kBackwardScalars, "attention_backward");
    const int64_t q_jobs = d.batch * d.heads * ((d.q_len + q_tile - 1) / q_tile);
    if (q_jobs > 0) {
      const auto bytes = static_cast<std::size_t>(
          detail::attention_shared_elems(q_tile, d.head_dim, detail::kDqRows, detail::kBackwardPairs,
                                         detail::kBackwardScalars) * elem);
      launch(detail::attention_dq_kernel<T>, Grid{attention_blocks(q_jobs), kThreads, bytes}, stream, d, qs, ks, vs,
             ms, os, ls, dos, static_cast<T*>(dq), q_tile);
    }
    const int64_t kv_tile = attention_tile_for(d, elem, detail::kDkvRows, detail::kBackwardPairs,
                                               detail::kBackwardScalars, "attention_backward");
    const int64_t kv_jobs = d.batch * d.kv_heads * ((d.kv_len + kv_tile - 1) / kv_tile);
    if (kv_jobs > 0) {
      const auto bytes = static_cast<std::size_t>(
          detail::attention_shared_elems(kv_tile, d.head_dim, detail::kDkvRows, detail::kBackwardPairs,
                                         detail::kBackwardScalars) * elem);
      launch(detail::attention_dkv_kernel<T>, Grid{attention_blocks(kv_jobs), kThreads, bytes}, stream, d, qs, ks,
             vs, ms, os, ls, dos, static_cast<T*>(dk), static_cast<T*>(dv), kv_tile);
    }
  });
}

void attention_merge(DType t, void* o, void* lse, const void* ob, const void* lb, int64_t rows, int64_t dim,
                     cudaStream_t stream) {
  check_floating(t, "attention_merge");
  check_size(rows, "attention_merge");
  check_size(dim, "attention_merge");
  if (rows == 0) return;
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    launch(detail::attention_merge_kernel<T>, Grid{blocks_for(rows)}, stream, static_cast<T*>(o),
           static_cast<T*>(lse), static_cast<const T*>(ob), static_cast<const T*>(lb), rows, dim);
  });
}

void neighborhood_attention_forward(DType t, const compute::NeighborhoodDims& dims, const void* q, const void* k,
                                    const void* v, void* o, cudaStream_t stream) {
  check_floating(t, "neighborhood_attention_forward");
  dims.check("cuda::kernels::neighborhood_attention_forward");
  dims.check_key_block("cuda::kernels::neighborhood_attention_forward");  // the kernels read inside it
  const detail::NeighborhoodGeo g = detail::neighborhood_geo(dims);
  if (g.queries * g.heads == 0) return;
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    launch(detail::neighborhood_forward_kernel<T>, Grid{blocks_for(g.queries * g.heads)}, stream, g,
           static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(o));
  });
}

void neighborhood_attention_backward(DType t, const compute::NeighborhoodDims& dims, const void* q, const void* k,
                                     const void* v, const void* dout, void* stats, void* dq, void* dk, void* dv,
                                     cudaStream_t stream) {
  check_floating(t, "neighborhood_attention_backward");
  dims.check("cuda::kernels::neighborhood_attention_backward");
  dims.check_key_block("cuda::kernels::neighborhood_attention_backward");
  const detail::NeighborhoodGeo g = detail::neighborhood_geo(dims);
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    const auto *qs = static_cast<const T*>(q), *ks = static_cast<const T*>(k), *vs = static_cast<const T*>(v);
    const auto* dos = static_cast<const T*>(dout);
    auto* st = static_cast<T*>(stats);
    if (g.queries * g.heads > 0)
      launch(detail::neighborhood_dq_kernel<T>, Grid{blocks_for(g.queries * g.heads)}, stream, g, qs, ks, vs, dos, st,
             static_cast<T*>(dq));
    if (g.keys * g.heads > 0)
      launch(detail::neighborhood_dkv_kernel<T>, Grid{blocks_for(g.keys * g.heads)}, stream, g, qs, ks, vs, dos,
             static_cast<const T*>(st), static_cast<T*>(dk), static_cast<T*>(dv));
  });
}

// --- the solvers' grid kernels ---

namespace {
// Combines `blocks` partial sums per value (value k's at partials + k * blocks) into
// out[0..values).
void finish_sums(const double* partials, unsigned blocks, int values, double* out, cudaStream_t stream) {
  for (int k = 0; k < values; ++k)
    launch(detail::finish_all<double, double, detail::SumOp>, Grid{1}, stream, partials + k * blocks,
           static_cast<int64_t>(blocks), out + k, 0.0, detail::SumOp{});
}
}  // namespace

void stencil_apply(DType t, const compute::StencilApply& ap, double* sum, cudaStream_t stream) {
  check_floating(t, "stencil_apply");
  const int64_t n = ap.cells();
  const bool sums = ap.epilogue.sums();
  if (n == 0) {
    if (sums) DTENSOR_CUDA(cudaMemsetAsync(sum, 0, sizeof(double), stream));
    return;
  }
  const unsigned blocks = blocks_for(n);
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    if (!sums) return launch(detail::stencil_apply_kernel<T>, Grid{blocks}, stream, ap, nullptr);
    Scratch<double> partials(blocks, stream);
    launch(detail::stencil_apply_kernel<T>, Grid{blocks}, stream, ap, partials.get());
    finish_sums(partials.get(), blocks, 1, sum, stream);
  });
}

void stencil_diagonal(DType t, const compute::StencilApply& ap, cudaStream_t stream) {
  check_floating(t, "stencil_diagonal");
  if (ap.cells() == 0) return;
  visit_floating(t, [&](auto tag) {
    launch(detail::stencil_diagonal_kernel<decltype(tag)>, Grid{blocks_for(ap.cells())}, stream, ap);
  });
}

void grid_update(DType t, const compute::GridUpdate& g, double* sums, cudaStream_t stream) {
  check_floating(t, "grid_update");
  const int64_t n = g.cells();
  if (n == 0) {
    if (g.sums()) DTENSOR_CUDA(cudaMemsetAsync(sums, 0, 3 * sizeof(double), stream));
    return;
  }
  const unsigned blocks = blocks_for(n);
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    if (!g.sums()) return launch(detail::grid_update_kernel<T>, Grid{blocks}, stream, g, nullptr);
    Scratch<double> partials(3 * static_cast<std::size_t>(blocks), stream);
    launch(detail::grid_update_kernel<T>, Grid{blocks}, stream, g, partials.get());
    finish_sums(partials.get(), blocks, 3, sums, stream);
  });
}

void grid_restrict(DType t, const compute::GridTransfer& g, cudaStream_t stream) {
  check_floating(t, "grid_restrict");
  if (g.coarse_cells() == 0) return;
  visit_floating(t, [&](auto tag) {
    launch(detail::restrict_kernel<decltype(tag)>, Grid{blocks_for(g.coarse_cells())}, stream, g);
  });
}

void grid_prolong(DType t, const compute::GridTransfer& g, cudaStream_t stream) {
  check_floating(t, "grid_prolong");
  if (g.fine_cells() == 0) return;
  visit_floating(t, [&](auto tag) {
    launch(detail::prolong_kernel<decltype(tag)>, Grid{blocks_for(g.fine_cells())}, stream, g);
  });
}

// --- the spectral operators' scaling ---

void scale_bins(DType t, void* p, int64_t outer, int64_t bins, int64_t inner, int64_t n, double scale, double weight,
                bool real_bins, cudaStream_t stream) {
  check_floating(t, "scale_bins");
  DTENSOR_CHECK(outer >= 0 && bins >= 0 && inner >= 0 && (!real_bins || inner % 2 == 0), InvalidArgument,
                "cuda::kernels::scale_bins: negative extents, or complex elements cut in half");
  const int64_t count = outer * bins * inner;
  const bool weighted = weight != 1.0 && bins > 1;
  if (count == 0 || (scale == 1.0 && !weighted && !real_bins)) return;
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    launch(detail::scale_bins_kernel<T>, Grid{blocks_for(count)}, stream, static_cast<T*>(p), bins, inner, n,
           static_cast<T>(scale), static_cast<T>(weight), scale != 1.0, weighted, real_bins, count);
  });
}

// --- the Fourier layer's frequency mixing ---

void spectral_mix(DType t, const compute::SpectralMixDims& d, const void* in, const void* w, void* out,
                  cudaStream_t stream) {
  check_floating(t, "spectral_mix");
  d.check("cuda::kernels::spectral_mix");
  const int64_t n = d.batch * d.out_channels * d.cells();
  if (n == 0) return;
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    launch(detail::spectral_mix_kernel<T>, Grid{blocks_for(n)}, stream, d, static_cast<const T*>(in),
           static_cast<const T*>(w), static_cast<T*>(out), n);
  });
}

void spectral_weight_terms(DType t, const compute::SpectralMixDims& d, const void* X, const void* dY, void* g,
                           cudaStream_t stream) {
  check_floating(t, "spectral_weight_terms");
  d.check("cuda::kernels::spectral_weight_terms");
  const int64_t n = d.weight_in * d.weight_out * d.cells();
  if (n == 0) return;
  visit_floating(t, [&](auto tag) {
    using T = decltype(tag);
    launch(detail::spectral_weight_terms_kernel<T>, Grid{blocks_for(n)}, stream, d, static_cast<const T*>(X),
           static_cast<const T*>(dY), static_cast<T*>(g), n);
  });
}

}  // namespace dtensor::cuda::kernels
