#pragma once
// Local discrete Fourier transforms of a host block along one or more of its dims,
// through FFTW (Debian libfftw3-dev: fftw3 for double, fftw3f for float). The
// distributed transforms (spectral/fft.hpp) call these once per stage, after the
// redistributions that make the stage's dims whole on each rank.
//
//   compute::fft_c2c(in, out, shape, dims, Sign::Forward, scale)   complex -> complex
//   compute::fft_r2c(in, out, shape, dims, scale)                  real -> complex, dims.back() n -> n/2+1
//   compute::fft_c2r(in, out, shape, dims, scale)                  complex -> real, dims.back() n/2+1 -> n
//   compute::fft<Real>(fft_dims, in, out)                          any of them as FftDims says
//
// `shape` is the row-major shape of the real-space block (for r2c the input's, for
// c2r the output's); the spectral side has n/2 + 1 along the last listed dim. `dims`
// (or one `dim`) are the transformed dims, in any order but the halved one last. Every
// output element is multiplied by `scale` (the normalization is the caller's:
// spectral/norm.hpp).
//
// Plans as FFTW meant them: made once per (precision, kind, shape, dims, alignment),
// kept for the life of the process, executed on new arrays (fftw_execute_dft and
// friends, which are thread-safe; the planner is not, so making a plan takes a
// process-wide lock: the in-process runtime's ranks are threads). The guru interface
// describes the block as it lies: each transformed dim with its strides, every other
// dim a loop of the plan (howmany), so no dim is ever copied to be contiguous and a
// multi-dim stage is one FFTW plan (FFTW's own multi-dim algorithm).
//
// Planning rigour (FFTW_ESTIMATE by default) is set per process with
// set_fft_planning(FftPlanning::Measure) (plans are kept per rigour); a measured plan
// is made on scratch arrays of the same alignment (FFTW_MEASURE overwrites its arrays).
// Measured plans are chosen by timing, so two MPI processes may round differently:
// where a transform's result is Replicate across processes, its copies may then differ
// in the last bits. FFTW_ESTIMATE's choice is deterministic, hence the default.
// c2r destroys its input in FFTW: fft_c2r copies it first into a scratch buffer,
// unless the caller says the input may be destroyed.
#include <fftw3.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <complex>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtensor/compute/fft_dims.hpp"
#include "dtensor/util/error.hpp"

namespace dtensor::compute {
static_assert(static_cast<int>(Sign::Forward) == FFTW_FORWARD && static_cast<int>(Sign::Backward) == FFTW_BACKWARD,
              "compute::Sign holds FFTW's exponent signs");

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
  static plan c2c(int r, const fftw_iodim64* d, int l, const fftw_iodim64* h, complex* in, complex* out, int sign,
                  unsigned f) {
    return fftw_plan_guru64_dft(r, d, l, h, in, out, sign, f);
  }
  static plan r2c(int r, const fftw_iodim64* d, int l, const fftw_iodim64* h, double* in, complex* out, unsigned f) {
    return fftw_plan_guru64_dft_r2c(r, d, l, h, in, out, f);
  }
  static plan c2r(int r, const fftw_iodim64* d, int l, const fftw_iodim64* h, complex* in, double* out, unsigned f) {
    return fftw_plan_guru64_dft_c2r(r, d, l, h, in, out, f);
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
  static plan c2c(int r, const fftw_iodim64* d, int l, const fftw_iodim64* h, complex* in, complex* out, int sign,
                  unsigned f) {
    return fftwf_plan_guru64_dft(r, d, l, h, in, out, sign, f);
  }
  static plan r2c(int r, const fftw_iodim64* d, int l, const fftw_iodim64* h, float* in, complex* out, unsigned f) {
    return fftwf_plan_guru64_dft_r2c(r, d, l, h, in, out, f);
  }
  static plan c2r(int r, const fftw_iodim64* d, int l, const fftw_iodim64* h, complex* in, float* out, unsigned f) {
    return fftwf_plan_guru64_dft_c2r(r, d, l, h, in, out, f);
  }
  static void run(plan p, complex* in, complex* out) { fftwf_execute_dft(p, in, out); }
  static void run(plan p, float* in, complex* out) { fftwf_execute_dft_r2c(p, in, out); }
  static void run(plan p, complex* in, float* out) { fftwf_execute_dft_c2r(p, in, out); }
  static void destroy(plan p) { fftwf_destroy_plan(p); }
  static void* alloc(std::size_t bytes) { return fftwf_malloc(bytes); }
  static void release(void* p) { fftwf_free(p); }
};

enum class Kind { C2C, R2C, C2R };

// The block as FFTW's guru interface sees it: the transformed dims (the halved one
// last) and every other dim as a loop, each with its input and output strides.
struct Geometry {
  std::vector<fftw_iodim64> dims, loops;
  int64_t in_count = 1, out_count = 1;  // elements of the input and output blocks
  std::vector<int64_t> key;             // what identifies the plan, alignments aside
};

template <std::size_t R>
Geometry geometry(const std::array<int64_t, R>& shape, std::span<const int> dims, Kind kind) {
  constexpr int Rank = static_cast<int>(R);
  DTENSOR_CHECK(!dims.empty(), InvalidArgument, "fft: no dim to transform");
  std::array<bool, R> listed{};
  for (int d : dims) {
    DTENSOR_CHECK(d >= 0 && d < Rank && !listed[d], InvalidArgument, "fft: dim ", d,
                  " is not a dim of a ", R, "-dim block, or is listed twice");
    listed[d] = true;
  }
  const int halved = dims.back();
  std::array<int64_t, R> in_ext = shape, out_ext = shape;
  if (kind == Kind::C2R) in_ext[halved] = shape[halved] / 2 + 1;
  if (kind == Kind::R2C) out_ext[halved] = shape[halved] / 2 + 1;
  std::array<int64_t, R> is{}, os{};
  int64_t a = 1, b = 1;
  for (int d = Rank - 1; d >= 0; --d) {
    is[d] = a, os[d] = b;
    a *= in_ext[d], b *= out_ext[d];
  }
  Geometry g;
  g.in_count = a, g.out_count = b;
  for (int d : dims) g.dims.push_back({shape[d], is[d], os[d]});
  for (int d = 0; d < Rank; ++d)
    if (!listed[d] && shape[d] != 1) g.loops.push_back({shape[d], is[d], os[d]});
  g.key = {static_cast<int64_t>(kind), Rank};
  for (int d = 0; d < Rank; ++d) g.key.push_back(shape[d]);
  for (int d : dims) g.key.push_back(d);
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
  typename A::plan get(const Geometry& g, int sign, In* in, Out* out) {
    const unsigned flags = planner_flags();
    std::vector<int64_t> key = g.key;
    key.push_back(sign);
    key.push_back(alignment(in));
    key.push_back(alignment(out));
    key.push_back(static_cast<int64_t>(flags));
    std::lock_guard lock(mutex_);
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    // FFTW_ESTIMATE never touches the arrays: the call's own. FFTW_MEASURE writes them:
    // scratch arrays with the same alignment (a plan for arrays of one alignment may use
    // SIMD code another cannot run).
    std::optional<Scratch> si, so;
    In* pi = in;
    Out* po = out;
    if (flags != FFTW_ESTIMATE) {
      si.emplace(static_cast<std::size_t>(g.in_count) * sizeof(In) + 64);
      so.emplace(static_cast<std::size_t>(g.out_count) * sizeof(Out) + 64);
      pi = reinterpret_cast<In*>(si->bytes + alignment(in));
      po = reinterpret_cast<Out*>(so->bytes + alignment(out));
    }
    const int rank = static_cast<int>(g.dims.size()), loops = static_cast<int>(g.loops.size());
    typename A::plan p{};
    if constexpr (std::is_same_v<In, Out>) p = A::c2c(rank, g.dims.data(), loops, g.loops.data(), pi, po, sign, flags);
    else if constexpr (std::is_same_v<In, Real>) p = A::r2c(rank, g.dims.data(), loops, g.loops.data(), pi, po, flags);
    else p = A::c2r(rank, g.dims.data(), loops, g.loops.data(), pi, po, flags);
    DTENSOR_CHECK(p != nullptr, InvalidArgument, "fft: FFTW could not plan a transform of ", rank, " dims over ", loops,
                  " loops");
    try {
      plans_.emplace(std::move(key), p);
    } catch (...) {
      A::destroy(p);
      throw;
    }
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
  std::map<std::vector<int64_t>, typename A::plan> plans_;
};

template <class T, class Real>
void scale_all(T* p, int64_t n, Real s) {
  if (s == Real(1)) return;
  for (int64_t i = 0; i < n; ++i) p[i] *= s;
}

// Calls f(offset_a, offset_b) for every row (all dims but the last) of a block of
// extents `ext`, with the rows' offsets under strides `sa` and `sb`.
template <std::size_t R, class F>
void for_each_row(const std::array<int64_t, R>& ext, const std::array<int64_t, R>& sa,
                  const std::array<int64_t, R>& sb, F&& f) {
  int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < R; ++d) rows *= ext[d];
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rest = r, oa = 0, ob = 0;
    for (int d = static_cast<int>(R) - 2; d >= 0; --d) {
      const int64_t i = rest % ext[d];
      rest /= ext[d];
      oa += i * sa[d], ob += i * sb[d];
    }
    f(oa, ob);
  }
}

// A transform whose first dim has a long stride (a slab's dim 0 after its transpose:
// n1 x n2/2+1 elements apart) runs through FFTW's loops at one element per cache line
// and page. Above this stride the block is cut along the loop dims between the first
// transformed dim and the last dim, and each piece is copied to a contiguous buffer,
// transformed there and copied back: two cheap passes for a transform that stays in
// cache (7x faster for 256^3 on this project's CPU; bench/bench_fft).
inline constexpr int64_t kChunkStrideBytes = 64 * 1024;

// out = the transform of in (kind, sign) over `dims` of a block of real-space `shape`.
template <class Real, class In, class Out, std::size_t R>
void execute(Kind kind, int sign, const In* in, Out* out, const std::array<int64_t, R>& shape, std::span<const int> dims,
             bool may_destroy_input) {
  using A = api<Real>;
  using Fin = std::conditional_t<std::is_same_v<In, Real>, Real, typename A::complex>;
  using Fout = std::conditional_t<std::is_same_v<Out, Real>, Real, typename A::complex>;
  const Geometry g = geometry(shape, dims, kind);
  if (g.in_count == 0 || g.out_count == 0) return;
  constexpr int Rank = static_cast<int>(R);
  const int halved = dims.back();
  std::array<int64_t, R> in_ext = shape, out_ext = shape;
  if (kind == Kind::C2R) in_ext[halved] = shape[halved] / 2 + 1;
  if (kind == Kind::R2C) out_ext[halved] = shape[halved] / 2 + 1;
  std::array<int64_t, R> is{}, os{};
  for (int64_t d = Rank - 1, a = 1, b = 1; d >= 0; --d) {
    is[d] = a, os[d] = b;
    a *= in_ext[d], b *= out_ext[d];
  }
  std::array<bool, R> listed{};
  int first = Rank;
  for (int d : dims) listed[d] = true, first = std::min(first, d);
  std::array<bool, R> chunk{};
  bool chunked = false;
  if (is[first] * static_cast<int64_t>(sizeof(In)) >= kChunkStrideBytes)
    for (int d = first + 1; d < Rank - 1; ++d)
      if (!listed[d] && shape[d] > 1) chunk[d] = chunked = true;

  auto run_on = [&](const Geometry& geo, In* src, Out* dst) {
    auto* i = reinterpret_cast<Fin*>(src);
    auto* o = reinterpret_cast<Fout*>(dst);
    A::run(PlanCache<Real>::instance().get(geo, sign, i, o), i, o);
  };
  struct Buffer {
    explicit Buffer(std::size_t bytes) : p(A::alloc(bytes)) {
      DTENSOR_CHECK(p != nullptr, InvalidArgument, "fft: cannot allocate a ", bytes, "-byte buffer");
    }
    ~Buffer() { A::release(p); }
    void* p;
  };
  if (!chunked) {
    if (kind == Kind::C2R && !may_destroy_input) {  // FFTW's c2r overwrites its input
      Buffer copy(static_cast<std::size_t>(g.in_count) * sizeof(In));
      std::memcpy(copy.p, static_cast<const void*>(in), static_cast<std::size_t>(g.in_count) * sizeof(In));
      run_on(g, static_cast<In*>(copy.p), out);
    } else {
      run_on(g, const_cast<In*>(in), out);
    }
    return;
  }
  // One piece per index of the chunk dims; the piece is the block with those dims at 1.
  std::array<int64_t, R> piece = shape, pin = in_ext, pout = out_ext;
  for (int d = 0; d < Rank; ++d)
    if (chunk[d]) piece[d] = pin[d] = pout[d] = 1;
  const Geometry gp = geometry(piece, dims, kind);
  std::array<int64_t, R> pis{}, pos{};
  for (int64_t d = Rank - 1, a = 1, b = 1; d >= 0; --d) {
    pis[d] = a, pos[d] = b;
    a *= pin[d], b *= pout[d];
  }
  Buffer bi(static_cast<std::size_t>(gp.in_count) * sizeof(In)), bo(static_cast<std::size_t>(gp.out_count) * sizeof(Out));
  auto* pi = static_cast<In*>(bi.p);
  auto* po = static_cast<Out*>(bo.p);
  int64_t pieces = 1;
  for (int d = 0; d < Rank; ++d)
    if (chunk[d]) pieces *= shape[d];
  const std::size_t in_run = static_cast<std::size_t>(pin[Rank - 1]) * sizeof(In);
  const std::size_t out_run = static_cast<std::size_t>(pout[Rank - 1]) * sizeof(Out);
  for (int64_t c = 0; c < pieces; ++c) {
    int64_t rest = c, in_off = 0, out_off = 0;
    for (int d = Rank - 1; d >= 0; --d)
      if (chunk[d]) {
        const int64_t i = rest % shape[d];
        rest /= shape[d];
        in_off += i * is[d], out_off += i * os[d];
      }
    for_each_row(pin, is, pis, [&](int64_t src, int64_t dst) {
      std::memcpy(static_cast<void*>(pi + dst), static_cast<const void*>(in + in_off + src), in_run);
    });
    run_on(gp, pi, po);
    for_each_row(pout, os, pos, [&](int64_t dst, int64_t src) {
      std::memcpy(static_cast<void*>(out + out_off + dst), static_cast<const void*>(po + src), out_run);
    });
  }
}

}  // namespace dtensor::detail::fftw

namespace dtensor::compute {

// How hard FFTW plans (process-wide; set before the first transform of a shape).
inline void set_fft_planning(FftPlanning p) { detail::fftw::planning().store(p); }

// out = scale * DFT over `dims` of in (Sign::Forward: e^{-2 pi i jk/n}; Backward: +),
// a row-major block of `shape`; in and out do not overlap.
template <class Real, std::size_t R>
void fft_c2c(const std::complex<Real>* in, std::complex<Real>* out, const std::array<int64_t, R>& shape,
             std::span<const int> dims, Sign sign, Real scale) {
  static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>,
                "dtensor::compute::fft_c2c: FFTW transforms std::complex<float> and std::complex<double>");
  dtensor::detail::fftw::execute<Real>(dtensor::detail::fftw::Kind::C2C, static_cast<int>(sign), in, out, shape, dims,
                                       false);
  int64_t count = 1;
  for (auto e : shape) count *= e;
  dtensor::detail::fftw::scale_all(out, count, scale);
}

// out (n/2 + 1 along dims.back()) = scale * DFT over `dims` of a real block: the
// non-negative frequencies of the last listed dim.
template <class Real, std::size_t R>
void fft_r2c(const Real* in, std::complex<Real>* out, const std::array<int64_t, R>& shape, std::span<const int> dims,
             Real scale) {
  static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>,
                "dtensor::compute::fft_r2c: FFTW transforms float and double");
  dtensor::detail::fftw::execute<Real>(dtensor::detail::fftw::Kind::R2C, FFTW_FORWARD, in, out, shape, dims, false);
  int64_t count = 1;
  for (auto e : shape) count *= e;
  count = shape[dims.back()] == 0 ? 0 : count / shape[dims.back()] * (shape[dims.back()] / 2 + 1);
  dtensor::detail::fftw::scale_all(out, count, scale);
}

// out (the real block of `shape`) = scale * the Hermitian inverse DFT over `dims` of in
// (n/2 + 1 along dims.back()). As FFTW (and numpy, PyTorch) define it, the imaginary
// parts of the bins that must be real (the zero bin, and the n/2 bin for even n, of
// the last dim) do not contribute. `in` is left as it was unless `may_destroy_input`.
template <class Real, std::size_t R>
void fft_c2r(const std::complex<Real>* in, Real* out, const std::array<int64_t, R>& shape, std::span<const int> dims,
             Real scale, bool may_destroy_input = false) {
  static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>,
                "dtensor::compute::fft_c2r: FFTW transforms float and double");
  dtensor::detail::fftw::execute<Real>(dtensor::detail::fftw::Kind::C2R, FFTW_BACKWARD, in, out, shape, dims,
                                       may_destroy_input);
  int64_t count = 1;
  for (auto e : shape) count *= e;
  dtensor::detail::fftw::scale_all(out, count, scale);
}

// The same along one dim.
template <class Real, std::size_t R>
void fft_c2c(const std::complex<Real>* in, std::complex<Real>* out, const std::array<int64_t, R>& shape, int dim,
             Sign sign, Real scale) {
  fft_c2c(in, out, shape, std::span<const int>(&dim, 1), sign, scale);
}
template <class Real, std::size_t R>
void fft_r2c(const Real* in, std::complex<Real>* out, const std::array<int64_t, R>& shape, int dim, Real scale) {
  fft_r2c(in, out, shape, std::span<const int>(&dim, 1), scale);
}
template <class Real, std::size_t R>
void fft_c2r(const std::complex<Real>* in, Real* out, const std::array<int64_t, R>& shape, int dim, Real scale) {
  fft_c2r(in, out, shape, std::span<const int>(&dim, 1), scale);
}

// The transform `f` describes (compute/fft_dims.hpp), of `in` into `out`, Real float or
// double (the complex sides std::complex<Real>): what a host block's stage runs
// (spectral/fft.hpp), and the tests' emulated device too, so the two agree bit for bit.
template <class Real>
void fft(const FftDims& f, const void* in, void* out) {
  static_assert(std::is_same_v<Real, float> || std::is_same_v<Real, double>,
                "dtensor::compute::fft: FFTW transforms float and double");
  using C = std::complex<Real>;
  DTENSOR_CHECK(f.rank >= 1 && f.rank <= FftDims::kMaxRank && f.ndims >= 1 && f.ndims <= f.rank, InvalidArgument,
                "fft: a block of rank ", f.rank, " with ", f.ndims, " transformed dims");
  const std::span<const int> dims(f.dims.data(), static_cast<std::size_t>(f.ndims));
  const Real scale = static_cast<Real>(f.scale);
  const int h = f.halved();
  const Real w = static_cast<Real>(f.paired_bin_weight);
  [&]<std::size_t... R>(std::index_sequence<R...>) {
    (void)((f.rank == static_cast<int>(R + 1) ? ([&] {
      std::array<int64_t, R + 1> shape{};
      for (std::size_t d = 0; d <= R; ++d) shape[d] = f.shape[d];
      switch (f.kind) {
        case FftKind::C2C:
          fft_c2c(static_cast<const C*>(in), static_cast<C*>(out), shape, dims, f.sign, scale);
          return;
        case FftKind::R2C:
          fft_r2c(static_cast<const Real*>(in), static_cast<C*>(out), shape, dims, scale);
          if (f.paired_bin_weight != 1.0)
            weight_paired_bins(static_cast<C*>(out), f.outer_of(h), shape[h] / 2 + 1, f.inner_of(h), shape[h], w);
          return;
        case FftKind::C2R:
          if (f.paired_bin_weight != 1.0) {  // the weights go on a copy
            std::vector<C> weighted(static_cast<const C*>(in), static_cast<const C*>(in) + f.in_count());
            weight_paired_bins(weighted.data(), f.outer_of(h), shape[h] / 2 + 1, f.inner_of(h), shape[h], w);
            fft_c2r(weighted.data(), static_cast<Real*>(out), shape, dims, scale, /*may_destroy_input=*/true);
          } else {
            fft_c2r(static_cast<const C*>(in), static_cast<Real*>(out), shape, dims, scale, f.may_destroy_input);
          }
          return;
      }
    }(), true) : false) || ...);
  }(std::make_index_sequence<FftDims::kMaxRank>{});
}

}  // namespace dtensor::compute
