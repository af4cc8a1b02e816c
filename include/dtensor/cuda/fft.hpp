#pragma once
// Local Fourier transforms of device blocks through cuFFT: the CUDA backend's `fft`
// entry (compute/device_backend.hpp), which runs each stage of the distributed
// transforms (spectral/fft.hpp) described as a compute::FftDims.
//
// FFTW's guru interface (the host's, compute/fftw.hpp) takes any dims with any loops
// around them; cuFFT's advanced layout takes up to three consecutive dims with one
// stride and one batch distance. A stage is therefore cut into pieces cuFFT can plan,
// which compose because a DFT over several dims is the product of the DFTs over each:
//   C2C  the transformed dims in runs of consecutive dims, at most three per plan;
//   R2C  first the run that ends at the halved dim (real to half spectrum), then the
//        other runs in place on its output;
//   C2R  the other runs first, in place on a copy of the input (cuFFT's C2R
//        overwrites its input), then the halved dim alone. Before that last step the
//        imaginary parts of the bins that must be real (the zero bin and, for even n,
//        bin n/2) are cleared, as FFTW's C2R, numpy and PyTorch ignore them: cuFFT
//        does not say what it does with them, and a gradient's spectrum has them.
// Each piece runs over the elements after its dims (the stride) and, where there are
// elements before them too, is executed once per index of whichever side is shorter (a
// C2C), or once per block before it (an R2C or C2R: cuFFT's pointers must be aligned
// as the complex type, run_piece says how).
// Scale and paired-bin weights (kernels::scale_bins) run after an R2C and before a C2R,
// as the host's.
//
// Plans are made once per (device, geometry, type) and kept per thread: cuFFT runs
// plans concurrently only when each thread uses its own (the in-process runtime's ranks
// are threads). A plan holds no work area of its own: each execution takes one from
// the stream-ordered pool and gives it back after (cufftSetWorkArea), so idle plans
// cost no device memory.
#include <cufft.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "dtensor/compute/fft_dims.hpp"
#include "dtensor/core/dtype.hpp"
#include "dtensor/cuda/error.hpp"
#include "dtensor/cuda/kernels.hpp"
#include "dtensor/cuda/memory.hpp"
#include "dtensor/cuda/stream.hpp"

namespace dtensor::cuda::detail {

inline const char* cufft_error_name(cufftResult r) {
  switch (r) {
    case CUFFT_INVALID_PLAN: return "CUFFT_INVALID_PLAN";
    case CUFFT_ALLOC_FAILED: return "CUFFT_ALLOC_FAILED";
    case CUFFT_INVALID_VALUE: return "CUFFT_INVALID_VALUE";
    case CUFFT_INTERNAL_ERROR: return "CUFFT_INTERNAL_ERROR";
    case CUFFT_EXEC_FAILED: return "CUFFT_EXEC_FAILED";
    case CUFFT_SETUP_FAILED: return "CUFFT_SETUP_FAILED";
    case CUFFT_INVALID_SIZE: return "CUFFT_INVALID_SIZE";
    case CUFFT_NOT_SUPPORTED: return "CUFFT_NOT_SUPPORTED";
    default: return "a cuFFT error";
  }
}
inline void check_fft(cufftResult r, const char* call, const char* file, int line) {
  if (r != CUFFT_SUCCESS) throw_cuda("cuFFT", cufft_error_name(r), call, file, line);
}

}  // namespace dtensor::cuda::detail

#define DTENSOR_CUFFT(call) ::dtensor::cuda::detail::check_fft((call), #call, __FILE__, __LINE__)

namespace dtensor::cuda::fft_detail {

using compute::FftDims;
using compute::FftKind;

// One cuFFT plan: `rank` consecutive dims of real lengths n, inside blocks of extents
// in_embed / out_embed, `stride` apart, `batch` transforms `dist` apart.
struct PieceGeometry {
  cufftType type{};
  int rank = 0;
  std::array<long long, 3> n{}, in_embed{}, out_embed{};
  long long stride = 1, in_dist = 1, out_dist = 1, batch = 1;
  int device = 0;
  auto key() const {
    return std::vector<long long>{static_cast<long long>(type), rank, n[0], n[1], n[2], in_embed[0], in_embed[1],
                                  in_embed[2], out_embed[0], out_embed[1], out_embed[2], stride, in_dist, out_dist,
                                  batch, device};
  }
};

class Plan {
 public:
  explicit Plan(const PieceGeometry& g) {
    DTENSOR_CUFFT(cufftCreate(&h_));
    try {
      DTENSOR_CUFFT(cufftSetAutoAllocation(h_, 0));
      auto n = g.n, ie = g.in_embed, oe = g.out_embed;
      DTENSOR_CUFFT(cufftMakePlanMany64(h_, g.rank, n.data(), ie.data(), g.stride, g.in_dist, oe.data(), g.stride,
                                        g.out_dist, g.type, g.batch, &work_));
    } catch (...) {
      (void)cufftDestroy(h_);
      throw;
    }
  }
  ~Plan() { (void)cufftDestroy(h_); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // Runs the plan on the calling thread's stream with a work area from its pool.
  template <class Exec>
  void run(Exec&& exec) {
    cudaStream_t s = current_stream();
    DTENSOR_CUFFT(cufftSetStream(h_, s));
    void* work = nullptr;
    if (work_ > 0) {
      int device = 0;
      DTENSOR_CUDA(cudaGetDevice(&device));
      cuda::detail::malloc_async(&work, work_, device, s);  // with the pool's retry (memory.hpp)
    }
    try {
      if (work) DTENSOR_CUFFT(cufftSetWorkArea(h_, work));
      exec(h_);
    } catch (...) {
      if (work) (void)cudaFreeAsync(work, s);
      throw;
    }
    if (work) DTENSOR_CUDA(cudaFreeAsync(work, s));
  }

 private:
  cufftHandle h_{};
  std::size_t work_ = 0;
};

// At most kMaxPlans per thread: a program whose shapes keep changing (uneven blocks of
// many sizes) drops the plan it used least recently rather than holding one for each
// (a plan's own memory is small: its work area is taken per execution). The thread's
// stream is waited for first, so no queued execution still uses the plan.
inline constexpr std::size_t kMaxPlans = 64;

inline Plan& plan_for(const PieceGeometry& g) {
  struct Entry {
    std::unique_ptr<Plan> plan;
    uint64_t used = 0;
  };
  thread_local std::map<std::vector<long long>, Entry> plans;
  thread_local uint64_t clock = 0;
  auto key = g.key();
  auto it = plans.find(key);
  if (it == plans.end()) {
    if (plans.size() >= kMaxPlans) {
      auto oldest = plans.begin();
      for (auto p = plans.begin(); p != plans.end(); ++p)
        if (p->second.used < oldest->second.used) oldest = p;
      DTENSOR_CUDA(cudaStreamSynchronize(current_stream()));
      plans.erase(oldest);
    }
    it = plans.emplace(std::move(key), Entry{std::make_unique<Plan>(g), 0}).first;
  }
  it->second.used = ++clock;
  return *it->second.plan;
}

// The C++ element types of one precision and the cuFFT types and calls for them.
template <class Real>
struct Api;
template <>
struct Api<float> {
  using C = cufftComplex;
  static constexpr cufftType c2c = CUFFT_C2C, r2c = CUFFT_R2C, c2r = CUFFT_C2R;
  static void run_c2c(cufftHandle h, void* in, void* out, int sign) {
    DTENSOR_CUFFT(cufftExecC2C(h, static_cast<C*>(in), static_cast<C*>(out), sign));
  }
  static void run_r2c(cufftHandle h, void* in, void* out) {
    DTENSOR_CUFFT(cufftExecR2C(h, static_cast<cufftReal*>(in), static_cast<C*>(out)));
  }
  static void run_c2r(cufftHandle h, void* in, void* out) {
    DTENSOR_CUFFT(cufftExecC2R(h, static_cast<C*>(in), static_cast<cufftReal*>(out)));
  }
};
template <>
struct Api<double> {
  using C = cufftDoubleComplex;
  static constexpr cufftType c2c = CUFFT_Z2Z, r2c = CUFFT_D2Z, c2r = CUFFT_Z2D;
  static void run_c2c(cufftHandle h, void* in, void* out, int sign) {
    DTENSOR_CUFFT(cufftExecZ2Z(h, static_cast<C*>(in), static_cast<C*>(out), sign));
  }
  static void run_r2c(cufftHandle h, void* in, void* out) {
    DTENSOR_CUFFT(cufftExecD2Z(h, static_cast<cufftDoubleReal*>(in), static_cast<C*>(out)));
  }
  static void run_c2r(cufftHandle h, void* in, void* out) {
    DTENSOR_CUFFT(cufftExecZ2D(h, static_cast<C*>(in), static_cast<cufftDoubleReal*>(out)));
  }
};

// Dims [first, last] of the block, all transformed by one cuFFT plan.
struct Piece {
  int first = 0, last = 0;
  FftKind kind = FftKind::C2C;
};

// The pieces a stage runs, in order (see the top of this file).
inline std::vector<Piece> pieces_of(const FftDims& f) {
  std::array<bool, FftDims::kMaxRank> todo{};
  for (int k = 0; k < f.ndims; ++k) todo[f.dims[k]] = true;
  const int h = f.halved();
  std::vector<Piece> first_steps, c2c, last_steps;
  if (f.kind == FftKind::R2C) {  // the run ending at h, at most three dims
    int a = h;
    // (A halved dim of length 1 is planned alone: its one bin is the real value.)
    while (a > 0 && todo[a - 1] && f.shape[a - 1] != 1 && f.shape[h] != 1 && h - (a - 1) < 3) --a;
    for (int d = a; d <= h; ++d) todo[d] = false;
    first_steps.push_back({a, h, FftKind::R2C});
  } else if (f.kind == FftKind::C2R) {
    todo[h] = false;
    last_steps.push_back({h, h, FftKind::C2R});
  }
  // A DFT of length 1 is the identity: such dims leave the C2C pieces (cuFFT need not
  // plan them; a C2C with none left is a copy).
  for (int d = 0; d < f.rank; ++d)
    if (f.shape[d] == 1) todo[d] = false;
  for (int d = 0; d < f.rank;) {
    if (!todo[d]) {
      ++d;
      continue;
    }
    int b = d;
    while (b + 1 < f.rank && todo[b + 1] && b + 1 - d < 3) ++b;
    c2c.push_back({d, b, FftKind::C2C});
    d = b + 1;
  }
  std::vector<Piece> all = first_steps;
  all.insert(all.end(), c2c.begin(), c2c.end());
  all.insert(all.end(), last_steps.begin(), last_steps.end());
  return all;
}

// A device buffer in the calling thread's stream order.
class Buffer {
 public:
  explicit Buffer(std::size_t bytes) : bytes_(bytes) {
    DTENSOR_CUDA(cudaGetDevice(&device_));
    p_ = cuda::detail::allocate(bytes, device_);
  }
  ~Buffer() { cuda::detail::deallocate(p_, bytes_, device_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* get() const { return p_; }

 private:
  std::size_t bytes_;
  int device_ = 0;
  void* p_ = nullptr;
};

// Runs one piece from `in` (extents in_ext) to `out` (extents out_ext); the two differ
// only along the halved dim, which an R2C or C2R piece holds.
//
// cuFFT wants every pointer it is given aligned as the complex type (an R2C's real
// input too: a float64 one at 8 bytes past 16 is refused, cupy #9229), so the loop of
// an R2C or C2R piece steps over whole blocks of the dims from the piece on, and where
// such a block holds an odd number of reals, the real side goes through a scratch
// copy whose rows are padded to an even count.
template <class Real>
void run_piece(const Piece& p, const FftDims& f, const std::array<int64_t, FftDims::kMaxRank>& in_ext,
               const std::array<int64_t, FftDims::kMaxRank>& out_ext, void* in, void* out, int device) {
  using A = Api<Real>;
  const std::size_t in_elem = p.kind == FftKind::R2C ? sizeof(Real) : 2 * sizeof(Real);
  const std::size_t out_elem = p.kind == FftKind::C2R ? sizeof(Real) : 2 * sizeof(Real);
  int64_t outer = 1, inner = 1, run_in = 1, run_out = 1;
  for (int d = 0; d < p.first; ++d) outer *= in_ext[d];
  for (int d = p.last + 1; d < f.rank; ++d) inner *= in_ext[d];
  PieceGeometry g;
  g.type = p.kind == FftKind::C2C ? A::c2c : p.kind == FftKind::R2C ? A::r2c : A::c2r;
  g.rank = p.last - p.first + 1;
  g.device = device;
  for (int d = p.first; d <= p.last; ++d) {
    const int k = d - p.first;
    g.n[k] = f.shape[d];
    g.in_embed[k] = in_ext[d], g.out_embed[k] = out_ext[d];
    run_in *= in_ext[d], run_out *= out_ext[d];
  }
  g.stride = inner;
  // A C2C batches over the side with more transforms and loops over the other; a real
  // piece batches over the elements after it when there are any (see above), else over
  // the blocks before it in one execution (cuFFT takes an odd distance between the
  // transforms of one plan: only the pointers it is given must be aligned).
  const bool real_piece = p.kind != FftKind::C2C;
  const bool batch_inner = real_piece ? inner > 1 : inner >= outer;
  const int64_t loops = batch_inner ? outer : inner;
  int64_t in_step = batch_inner ? run_in * inner : 1, out_step = batch_inner ? run_out * inner : 1;
  // The real side's rows, padded to an even count of reals where the loop would
  // misalign them.
  const int64_t real_row = p.kind == FftKind::R2C ? in_step : out_step;
  const bool padded = real_piece && loops > 1 && real_row % 2 != 0;
  const int64_t pitch = padded ? real_row + 1 : real_row;
  cudaStream_t s = current_stream();
  std::optional<Buffer> scratch;
  void* src = in;
  void* dst = out;
  if (padded) {
    scratch.emplace(static_cast<std::size_t>(loops * pitch) * sizeof(Real));
    if (p.kind == FftKind::R2C) {
      kernels::copy_block(in, StridedBlock{0, loops, real_row, real_row}, scratch->get(),
                          StridedBlock{0, loops, pitch, real_row}, sizeof(Real), s);
      src = scratch->get(), in_step = pitch;
    } else {
      dst = scratch->get(), out_step = pitch;
    }
  }
  g.batch = batch_inner ? inner : outer;
  g.in_dist = batch_inner ? 1 : run_in * inner;
  g.out_dist = batch_inner ? 1 : run_out * inner;
  const int sign = static_cast<int>(f.sign);
  plan_for(g).run([&](cufftHandle h) {
    for (int64_t l = 0; l < loops; ++l) {
      void* i = static_cast<char*>(src) + static_cast<std::size_t>(l * in_step) * in_elem;
      void* o = static_cast<char*>(dst) + static_cast<std::size_t>(l * out_step) * out_elem;
      if (p.kind == FftKind::C2C) A::run_c2c(h, i, o, sign);
      else if (p.kind == FftKind::R2C) A::run_r2c(h, i, o);
      else A::run_c2r(h, i, o);
    }
  });
  if (padded && p.kind == FftKind::C2R)
    kernels::copy_block(scratch->get(), StridedBlock{0, loops, pitch, real_row}, out,
                        StridedBlock{0, loops, real_row, real_row}, sizeof(Real), s);
}

template <class Real>
void execute(const FftDims& f, const void* in_const, void* out) {
  if (f.in_count() == 0 || f.out_count() == 0) return;
  cudaStream_t s = current_stream();
  int device = 0;
  DTENSOR_CUDA(cudaGetDevice(&device));
  const DType real = sizeof(Real) == 4 ? DType::Float32 : DType::Float64;
  const int h = f.halved();
  const int64_t bins = f.shape[h] / 2 + 1, outer = f.outer_of(h), inner = f.inner_of(h);
  const auto in_ext = f.in_shape(), out_ext = f.out_shape();
  void* in = const_cast<void*>(in_const);
  const std::vector<Piece> pieces = pieces_of(f);

  if (f.kind == FftKind::C2R) {
    Buffer copy(f.may_destroy_input ? 0 : static_cast<std::size_t>(f.in_count()) * 2 * sizeof(Real));
    void* work = f.may_destroy_input ? in : copy.get();
    if (!f.may_destroy_input)
      DTENSOR_CUDA(cudaMemcpyAsync(work, in, static_cast<std::size_t>(f.in_count()) * 2 * sizeof(Real),
                                   cudaMemcpyDeviceToDevice, s));
    for (std::size_t k = 0; k + 1 < pieces.size(); ++k)
      run_piece<Real>(pieces[k], f, in_ext, in_ext, work, work, device);
    kernels::scale_bins(real, work, outer, bins, 2 * inner, f.shape[h], 1.0, f.paired_bin_weight, true, s);
    run_piece<Real>(pieces.back(), f, in_ext, out_ext, work, out, device);
    kernels::scale_bins(real, out, 1, 1, f.out_count(), 0, f.scale, 1.0, false, s);
    return;
  }
  if (pieces.empty())  // a C2C over dims of length 1 only: the identity
    DTENSOR_CUDA(cudaMemcpyAsync(out, in, static_cast<std::size_t>(f.in_count()) * 2 * sizeof(Real),
                                 cudaMemcpyDeviceToDevice, s));
  else
    run_piece<Real>(pieces.front(), f, in_ext, out_ext, in, out, device);
  for (std::size_t k = 1; k < pieces.size(); ++k) run_piece<Real>(pieces[k], f, out_ext, out_ext, out, out, device);
  if (f.kind == FftKind::R2C)
    kernels::scale_bins(real, out, outer, bins, 2 * inner, f.shape[h], f.scale, f.paired_bin_weight, false, s);
  else
    kernels::scale_bins(real, out, 1, 1, 2 * f.out_count(), 0, f.scale, 1.0, false, s);
}

}  // namespace dtensor::cuda::fft_detail

namespace dtensor::cuda {

// The backend's entry: `real` says the precision (float32: cuFFT's C2C/R2C/C2R,
// float64: Z2Z/D2Z/Z2D).
inline void fft(DType real, const compute::FftDims& f, const void* in, void* out) {
  DTENSOR_CHECK(real == DType::Float32 || real == DType::Float64, InvalidArgument,
                "cuda::fft: transforms of float32 or float64 data (complex64 or complex128), not ", name(real));
  DTENSOR_CHECK(f.rank >= 1 && f.rank <= compute::FftDims::kMaxRank && f.ndims >= 1 && f.ndims <= f.rank,
                InvalidArgument, "cuda::fft: a block of rank ", f.rank, " with ", f.ndims, " transformed dims");
  if (real == DType::Float32) fft_detail::execute<float>(f, in, out);
  else fft_detail::execute<double>(f, in, out);
}

}  // namespace dtensor::cuda
