#pragma once
// One local Fourier transform of one rank's block, as the host (compute/fftw.hpp,
// FFTW) and the device backend (cuFFT, cuda/fft.hpp) both take it: the distributed
// transforms (spectral/fft.hpp) describe each stage once, in these terms, and hand it
// to whichever runs the block. Plain data, no FFTW or CUDA type, so the device table
// (compute/device_backend.hpp) can carry it.
//
// The block is row-major, `shape` its extents in real space; the spectral side holds
// n/2 + 1 bins along the halved dim (the last listed) for R2C's output and C2R's input.
// Every output element is multiplied by `scale`. `paired_bin_weight` multiplies the
// bins that stand for two frequencies (k > 0, 2k != n along the halved dim): after an
// R2C, before a C2R (the backward passes' weights, spectral/fft.hpp).
#include <array>
#include <cstdint>

namespace dtensor::compute {

// The sign of the exponent: Forward is e^{-2 pi i jk/n}, Backward e^{+...} (FFTW's
// FFTW_FORWARD and FFTW_BACKWARD, cuFFT's CUFFT_FORWARD and CUFFT_INVERSE).
enum class Sign { Forward = -1, Backward = 1 };

enum class FftKind { C2C, R2C, C2R };

struct FftDims {
  static constexpr int kMaxRank = 8;
  FftKind kind = FftKind::C2C;
  Sign sign = Sign::Forward;
  int rank = 0;                              // of the block
  std::array<int64_t, kMaxRank> shape{};     // the block in real space
  int ndims = 0;                             // transformed dims
  std::array<int, kMaxRank> dims{};          // in any order, the halved one last
  double scale = 1.0;
  double paired_bin_weight = 1.0;
  bool may_destroy_input = false;            // a C2R may use its input as scratch

  constexpr int halved() const { return dims[ndims - 1]; }
  // Extents of the input and output blocks.
  constexpr std::array<int64_t, kMaxRank> in_shape() const {
    auto s = shape;
    if (kind == FftKind::C2R) s[halved()] = shape[halved()] / 2 + 1;
    return s;
  }
  constexpr std::array<int64_t, kMaxRank> out_shape() const {
    auto s = shape;
    if (kind == FftKind::R2C) s[halved()] = shape[halved()] / 2 + 1;
    return s;
  }
  constexpr int64_t in_count() const { return count(in_shape()); }
  constexpr int64_t out_count() const { return count(out_shape()); }
  // Elements before and after the halved dim, and its bins: the half spectrum as
  // [outer, bins, inner].
  constexpr int64_t outer_of(int dim) const {
    int64_t o = 1;
    for (int d = 0; d < dim; ++d) o *= shape[d];
    return o;
  }
  constexpr int64_t inner_of(int dim) const {
    int64_t i = 1;
    for (int d = dim + 1; d < rank; ++d) i *= shape[d];
    return i;
  }

 private:
  constexpr int64_t count(const std::array<int64_t, kMaxRank>& s) const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= s[d];
    return n;
  }
};

// Whether bin k of a half spectrum of real length n stands for two frequencies (k and
// n - k), which a C2R counts twice.
constexpr bool is_paired_bin(int64_t k, int64_t n) { return k > 0 && 2 * k != n; }

// Multiplies the paired bins of a half spectrum laid out [outer, bins, inner] (real
// length n along bins) by w: the host's form, which the device's kernel mirrors.
template <class C, class R>
void weight_paired_bins(C* p, int64_t outer, int64_t bins, int64_t inner, int64_t n, R w) {
  for (int64_t a = 0; a < outer; ++a)
    for (int64_t k = 1; k < bins; ++k) {
      if (!is_paired_bin(k, n)) continue;
      C* row = p + (a * bins + k) * inner;
      for (int64_t i = 0; i < inner; ++i) row[i] *= w;
    }
}

}  // namespace dtensor::compute
