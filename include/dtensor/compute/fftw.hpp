#pragma once
// Local discrete Fourier transforms of a host block along one of its dims, through
// FFTW (Debian libfftw3-dev: fftw3 for double, fftw3f for float). The distributed
// transforms (spectral/fft.hpp) call these once per transformed dim, after the
// redistributions that make the dim whole on each rank.
//
//   compute::fft_c2c(in, out, shape, dim, Sign::Forward, scale)   complex -> complex
//   compute::fft_r2c(in, out, shape, dim, scale)                   real n -> complex n/2+1
//   compute::fft_c2r(in, out, shape, dim, scale)                   complex n/2+1 -> real n
//
// `shape` is the row-major shape of the real-space block (for r2c the input's, for
// c2r the output's); the spectral side has n/2 + 1 along `dim`. Every output element
// is multiplied by `scale` (the normalization is the caller's: spectral/norm.hpp).
//
// Plans as FFTW meant them: made once per (precision, kind, shape, dim, alignment),
// kept for the life of the process, executed on new arrays (fftw_execute_dft and
// friends, which are thread-safe; the planner is not, so making a plan takes a
// process-wide lock: the in-process runtime's ranks are threads). The guru interface
// describes the block as one transform of length n at stride `inner`, repeated over
// `outer` x `inner` positions, so no dim is ever copied to be contiguous.
//
// Planning rigour (FFTW_ESTIMATE by default) is set once per process with
// set_fft_planning(FftPlanning::Measure) before the first transform; a measured plan
// is made on scratch arrays of the same alignment (FFTW_MEASURE overwrites its arrays).
// c2r destroys its input in FFTW: fft_c2r copies it first into a scratch buffer.
#include <fftw3.h>

#include <array>
#include <atomic>
#include <complex>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

#include "dtensor/util/error.hpp"

namespace dtensor::compute {
// The sign of the exponent: Forward is e^{-2 pi i jk/n} (FFTW_FORWARD), Backward +.
enum class Sign { Forward = FFTW_FORWARD, Backward = FFTW_BACKWARD };

enum class FftPlanning { Estimate, Measure };
}  // namespace dtensor::compute

// (In dtensor::detail: a compute::detail would hide dtensor::detail from compute/ code.)
namespace dtensor::detail::fftw {
using compute::FftPlanning;

inline std::atomic<FftPlanning>& planning() {
  static std::atomic<FftPlanning> p{FftPlanning::Estimate};
  return p;
}
inline unsigned planner_flags() {
  return planning().load() == FftPlanning::Measure ? FFTW_MEASURE : FFTW_ESTIMATE;
}

// FFTW's two precisions behind one name.
template <class Real>
struct api;
template <>
struct api<double> {
  using plan = fftw_plan;
  using complex = fftw_complex;
  static plan c2c(const fftw_iodim64* d, const fftw_iodim64* h, complex* in, complex* out, int sign, unsigned f) {
    return fftw_plan_guru64_dft(1, d, 2, h, in, out, sign, f);
  }
  static plan r2c(const fftw_iodim64* d, const fftw_iodim64* h, double* in, complex* out, unsigned f) {
    return fftw_plan_guru64_dft_r2c(1, d, 2, h, in, out, f);
  }
  static plan c2r(const fftw_iodim64* d, const fftw_iodim64* h, complex* in, double* out, unsigned f) {
    return fftw_plan_guru64_dft_c2r(1, d, 2, h, in, out, f);
  }
  static void run(plan p, complex* in, complex* out) { fftw_execute_dft(p, in, out); }
  static void run(plan p, double* in, complex* out) { fftw_execute_dft_r2c(p, in, out); }
  static void run(plan p, complex* in, double* out) { fftw_execute_dft_c2r(p, in, out); }
  static void destroy(plan p) { fftw_destroy_plan(p); }
  static void* alloc(std::size_t bytes) { return fftw_malloc(bytes); }
  static void release(void* p) { fftw_free(p); }
};
template <>
struct api<float> {
  using plan = fftwf_plan;
  using complex = fftwf_complex;
  static plan c2c(const fftw_iodim64* d, const fftw_iodim64* h, complex* in, complex* out, int sign, unsigned f) {
    return fftwf_plan_guru64_dft(1, d, 2, h, in, out, sign, f);
  }
  static plan r2c(const fftw_iodim64* d, const fftw_iodim64* h, float* in, complex* out, unsigned f) {
    return fftwf_plan_guru64_dft_r2c(1, d, 2, h, in, out, f);
  }
  static plan c2r(const fftw_iodim64* d, const fftw_iodim64* h, complex* in, float* out, unsigned f) {
    return fftwf_plan_guru64_dft_c2r(1, d, 2, h, in, out, f);
  }
  static void run(plan p, complex* in, complex* out) { fftwf_execute_dft(p, in, out); }
  static void run(plan p, float* in, complex* out) { fftwf_execute_dft_r2c(p, in, out); }
  static void run(plan p, complex* in, float* out) { fftwf_execute_dft_c2r(p, in, out); }
  static void destroy(plan p) { fftwf_destroy_plan(p); }
  static void* alloc(std::size_t bytes) { return fftwf_malloc(bytes); }
  static void release(void* p) { fftwf_free(p); }
};

enum class Kind { C2C, R2C, C2R };

// A transform of length n at stride `inner`, over outer x inner positions: the block's
// dims before `dim` collapsed into outer, those after into inner.
struct Geometry {
  int64_t outer = 1, n = 1, inner = 1;
  int64_t in_n = 1, out_n = 1;  // extents along dim of the input and output blocks
  auto key() const { return std::tuple(outer, n, inner, in_n, out_n); }
};

template <std::size_t R>
Geometry geometry(const std::array<int64_t, R>& shape, int dim, Kind kind) {
  DTENSOR_CHECK(dim >= 0 && dim < static_cast<int>(R), InvalidArgument, "fft: dim ", dim, " of a ", R, "-dim block");
  Geometry g;
  for (int d = 0; d < dim; ++d) g.outer *= shape[d];
  for (int d = dim + 1; d < static_cast<int>(R); ++d) g.inner *= shape[d];
  g.n = shape[dim];
  const int64_t half = g.n / 2 + 1;
  g.in_n = kind == Kind::C2R ? half : g.n;
  g.out_n = kind == Kind::R2C ? half : g.n;
  return g;
}

// The plans of one precision, made under one lock and kept for the process.
template <class Real>
class PlanCache {
 public:
  using A = api<Real>;
  static PlanCache& instance() {
    static PlanCache cache;
    return cache;
  }
  ~PlanCache() {
    for (auto& [k, p] : plans_) A::destroy(p);
  }

  // The plan for this geometry, kind and sign, for arrays aligned as in and out are.
  template <class In, class Out>
  typename A::plan get(const Geometry& g, Kind kind, int sign, In* in, Out* out) {
    const int ia = alignment(in), oa = alignment(out);
    const auto key = std::tuple(g.key(), static_cast<int>(kind), sign, ia, oa);
    std::lock_guard lock(mutex_);
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    // Planned on scratch arrays with the same alignment (FFTW_MEASURE writes them; a
    // plan for arrays of one alignment may use SIMD code another cannot run).
    const std::size_t in_bytes = static_cast<std::size_t>(g.outer * g.in_n * g.inner) * sizeof(In);
    const std::size_t out_bytes = static_cast<std::size_t>(g.outer * g.out_n * g.inner) * sizeof(Out);
    Scratch si(in_bytes + 64), so(out_bytes + 64);
    auto* pi = reinterpret_cast<In*>(si.bytes + ia);
    auto* po = reinterpret_cast<Out*>(so.bytes + oa);
    const fftw_iodim64 dim{g.n, g.inner, g.inner};
    const fftw_iodim64 many[2] = {{g.outer, g.in_n * g.inner, g.out_n * g.inner}, {g.inner, 1, 1}};
    const unsigned flags = planner_flags();
    typename A::plan p{};
    if constexpr (std::is_same_v<In, Out>) p = A::c2c(&dim, many, pi, po, sign, flags);
    else if constexpr (std::is_same_v<In, Real>) p = A::r2c(&dim, many, pi, po, flags);
    else p = A::c2r(&dim, many, pi, po, flags);
    DTENSOR_CHECK(p != nullptr, InvalidArgument, "fft: FFTW could not plan a transform of length ", g.n, " over ",
                  g.outer, " x ", g.inner, " positions");
    plans_.emplace(key, p);
    return p;
  }

 private:
  struct Scratch {
    explicit Scratch(std::size_t n) : bytes(static_cast<unsigned char*>(A::alloc(n))) {
      DTENSOR_CHECK(bytes != nullptr, InvalidArgument, "fft: cannot allocate ", n, " bytes to plan a transform");
    }
    ~Scratch() { A::release(bytes); }
    unsigned char* bytes;
  };
  // Bytes past the largest SIMD alignment FFTW uses (fftw_alignment_of: 16 on x86).
  template <class P>
  static int alignment(P* p) {
    if constexpr (std::is_same_v<Real, double>) return fftw_alignment_of(reinterpret_cast<double*>(p));
    else return fftwf_alignment_of(reinterpret_cast<float*>(p));
  }
  std::mutex mutex_;
  std::map<std::tuple<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>, int, int, int, int>,
           typename A::plan>
      plans_;
};

template <class T, class Real>
void scale_all(T* p, int64_t n, Real s) {
  if (s == Real(1)) return;
  for (int64_t i = 0; i < n; ++i) p[i] *= s;
}

}  // namespace dtensor::detail::fftw

namespace dtensor::compute {

// How hard FFTW plans (process-wide; set before the first transform of a shape).
inline void set_fft_planning(FftPlanning p) { detail::fftw::planning().store(p); }

// out = scale * DFT_dim(in) (Sign::Forward) or its conjugate sum (Sign::Backward), along
// `dim` of a row-major block of `shape`; in and out do not overlap.
template <class Real, std::size_t R>
void fft_c2c(const std::complex<Real>* in, std::complex<Real>* out, const std::array<int64_t, R>& shape, int dim,
             Sign sign, Real scale) {
  static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>,
                "dtensor::compute::fft_c2c: FFTW transforms std::complex<float> and std::complex<double>");
  using A = detail::fftw::api<Real>;
  const auto g = detail::fftw::geometry(shape, dim, detail::fftw::Kind::C2C);
  const int64_t total = g.outer * g.n * g.inner;
  if (total == 0) return;
  auto* i = reinterpret_cast<typename A::complex*>(const_cast<std::complex<Real>*>(in));
  auto* o = reinterpret_cast<typename A::complex*>(out);
  const auto plan = detail::fftw::PlanCache<Real>::instance().get(g, detail::fftw::Kind::C2C, static_cast<int>(sign), i, o);
  A::run(plan, i, o);
  detail::fftw::scale_all(out, total, scale);
}

// out (n/2 + 1 along dim) = scale * DFT_dim(in), the non-negative frequencies of a real block.
template <class Real, std::size_t R>
void fft_r2c(const Real* in, std::complex<Real>* out, const std::array<int64_t, R>& shape, int dim, Real scale) {
  static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>,
                "dtensor::compute::fft_r2c: FFTW transforms float and double");
  using A = detail::fftw::api<Real>;
  const auto g = detail::fftw::geometry(shape, dim, detail::fftw::Kind::R2C);
  if (g.outer * g.n * g.inner == 0) return;
  auto* i = const_cast<Real*>(in);
  auto* o = reinterpret_cast<typename A::complex*>(out);
  const auto plan = detail::fftw::PlanCache<Real>::instance().get(g, detail::fftw::Kind::R2C, FFTW_FORWARD, i, o);
  A::run(plan, i, o);
  detail::fftw::scale_all(out, g.outer * g.out_n * g.inner, scale);
}

// out (n along dim, the real block of `shape`) = scale * the Hermitian inverse DFT of
// in (n/2 + 1 along dim). As FFTW (and numpy, PyTorch) define it, the imaginary parts
// of the zero bin, and of the n/2 bin for even n, do not contribute.
template <class Real, std::size_t R>
void fft_c2r(const std::complex<Real>* in, Real* out, const std::array<int64_t, R>& shape, int dim, Real scale) {
  static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>,
                "dtensor::compute::fft_c2r: FFTW transforms float and double");
  using A = detail::fftw::api<Real>;
  const auto g = detail::fftw::geometry(shape, dim, detail::fftw::Kind::C2R);
  if (g.outer * g.n * g.inner == 0) return;
  // FFTW's c2r overwrites its input.
  const std::size_t count = static_cast<std::size_t>(g.outer * g.in_n * g.inner);
  auto* scratch = static_cast<std::complex<Real>*>(A::alloc(count * sizeof(std::complex<Real>)));
  DTENSOR_CHECK(scratch != nullptr, InvalidArgument, "fft_c2r: cannot allocate its scratch copy");
  std::memcpy(static_cast<void*>(scratch), in, count * sizeof(std::complex<Real>));
  auto* i = reinterpret_cast<typename A::complex*>(scratch);
  try {
    const auto plan = detail::fftw::PlanCache<Real>::instance().get(g, detail::fftw::Kind::C2R, FFTW_BACKWARD, i, out);
    A::run(plan, i, out);
  } catch (...) {
    A::release(scratch);
    throw;
  }
  A::release(scratch);
  detail::fftw::scale_all(out, g.outer * g.n * g.inner, scale);
}

}  // namespace dtensor::compute
