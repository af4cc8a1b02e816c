#pragma once
// The frequency mixing of a Fourier layer (nn/image/spectral_conv.hpp) on one rank's
// block of a spectrum, element by element, one copy compiled for the host and, by
// nvcc, for the device: the host loops below (what host blocks and the emulated device
// run) and the CUDA kernels (kernels/spectral_mix.cuh) call the same functions.
//
// Layouts: a spectrum block is [batch, channels, cells] complex numbers stored as pairs
// of reals (re, im), `cells` the block's spatial extents row-major; the weight is
// [2, Cin, Cout, weight modes...] reals (the real plane, then the imaginary one), one
// complex Cin x Cout matrix per retained frequency. Retained: the lowest modes[d]
// frequencies at both ends of each spatial dim but the last, the lowest modes[S-1] of
// the last (a half spectrum); the others are dropped (zero out, no weight term). A
// weight mode index counts the retained frequencies in order (retained_modes), so the
// retained frequencies of a block of the spectrum meet one range of weight modes per
// dim: the weight passed in may be just that block of the weight (weight_block,
// weight_offset), as a layer whose weights are sharded like its spectrum holds it.
//
//   forward     out[b, o, k] = sum_i in[b, i, k] W[i, o, k]            (in = X, out = Y)
//   conjugate   out[b, i, k] = sum_o in[b, o, k] conj(W[i, o, k])      (in = dY, out = dX)
//   weights     g[i, o, k]  += sum_b conj(X[b, i, k]) dY[b, o, k]      (accumulated)
// Each output element and each weight term is written by exactly one index (distinct
// frequencies of a block have distinct weight cells), so the kernels need no atomics.
#include <cstdint>

#include "dtensor/util/error.hpp"
#include "dtensor/util/host_device.hpp"

namespace dtensor::compute {

// The weight modes of the frequencies [lo, hi) along a spatial dim of real extent n
// keeping m frequencies (at both ends, or the lowest m of a half spectrum): the range
// [first, last) of mode indices, first = how many retained frequencies lie below lo.
struct ModeRange {
  int64_t first = 0, last = 0;
};
DTENSOR_HOST_DEVICE constexpr ModeRange retained_modes(int64_t lo, int64_t hi, int64_t n, int64_t m, bool half) {
  auto below = [&](int64_t k) {
    int64_t c = k < m ? k : m;
    if (!half) c += k <= n - m ? 0 : k - (n - m) < m ? k - (n - m) : m;
    return c < 0 ? int64_t{0} : c;
  };
  return {below(lo), below(hi)};
}

struct SpectralMixDims {
  int spatial = 1;                           // S, 1 to 3
  int64_t batch = 0;
  int64_t in_channels = 0, out_channels = 0;  // of `in` and `out` (conjugate: Cout and Cin)
  int64_t weight_in = 0, weight_out = 0;      // the weight's Cin and Cout
  int64_t block[3] = {1, 1, 1};               // the block's spatial extents (1 past S)
  int64_t offset[3] = {0, 0, 0};              // its global frequency offsets
  int64_t real[3] = {1, 1, 1};                // the real-space extents of the spatial dims
  int64_t modes[3] = {1, 1, 1};               // retained frequencies per spatial dim
  // The block of the weight passed in: its mode extents (-1: every mode of the dim) and
  // the first mode index along each dim; it must hold every retained frequency of the
  // spectrum's block.
  int64_t weight_block[3] = {-1, -1, -1};
  int64_t weight_offset[3] = {0, 0, 0};
  bool conjugate = false;

  // That the dims describe a mixing the functions below can run without reading past
  // a buffer (every backend checks before it runs one): 1-3 spatial dims, channels as
  // the weight has them in this direction, the block inside the spectrum (the last
  // spatial dim a half spectrum), at least one retained frequency per dim.
  void check(const char* who) const {
    bool ok = spatial >= 1 && spatial <= 3 && batch >= 0 && weight_in > 0 && weight_out > 0 &&
              in_channels == (conjugate ? weight_out : weight_in) && out_channels == (conjugate ? weight_in : weight_out);
    for (int d = 0; d < 3 && ok; ++d) {
      const int64_t extent = d + 1 < spatial ? real[d] : d + 1 == spatial ? real[d] / 2 + 1 : 1;
      ok = block[d] >= 0 && offset[d] >= 0 && real[d] >= 1 && modes[d] >= 1 && offset[d] + block[d] <= extent &&
           (d + 1 < spatial ? 2 * modes[d] <= real[d] : true);
      if (ok && d < spatial) {
        const ModeRange need = retained_modes(offset[d], offset[d] + block[d], real[d], modes[d], d + 1 == spatial);
        ok = weight_offset[d] >= 0 && weight_extent(d) >= 0 && weight_offset[d] + weight_extent(d) <= weight_modes(d) &&
             (need.first == need.last ||
              (weight_offset[d] <= need.first && need.last <= weight_offset[d] + weight_extent(d)));
      }
    }
    DTENSOR_CHECK(ok, InvalidArgument, who, ": a spectral mixing of ", spatial, " spatial dims, ", in_channels, " -> ",
                  out_channels, " channels (weight ", weight_in, " x ", weight_out,
                  "), whose block, offsets, extents or modes do not fit its spectrum, or whose weight block does "
                  "not hold the block's retained frequencies");
  }

  DTENSOR_HOST_DEVICE int64_t cells() const { return block[0] * block[1] * block[2]; }
  DTENSOR_HOST_DEVICE int64_t weight_modes(int d) const { return d + 1 < spatial ? 2 * modes[d] : modes[d]; }
  DTENSOR_HOST_DEVICE int64_t weight_extent(int d) const { return weight_block[d] < 0 ? weight_modes(d) : weight_block[d]; }
  // The mode cells of the weight block passed in.
  DTENSOR_HOST_DEVICE int64_t mode_cells() const {
    int64_t n = 1;
    for (int d = 0; d < spatial; ++d) n *= weight_extent(d);
    return n;
  }
  // The weight block's flat cell of the block's cell c, or -1 where its frequency is
  // dropped.
  DTENSOR_HOST_DEVICE int64_t weight_cell(int64_t c) const {
    int64_t k[3] = {0, 0, 0};
    for (int d = spatial - 1; d >= 0; --d) k[d] = offset[d] + c % block[d], c /= block[d];
    int64_t cell = 0;
    for (int d = 0; d < spatial; ++d) {
      const int64_t m = modes[d], n = real[d];
      int64_t j = -1;
      if (d + 1 == spatial) j = k[d] < m ? k[d] : -1;
      else if (k[d] < m) j = k[d];
      else if (k[d] >= n - m) j = m + (k[d] - (n - m));
      if (j < 0) return -1;
      cell = cell * weight_extent(d) + (j - weight_offset[d]);
    }
    return cell;
  }
};

// Output element e of the mixing (forward or conjugate): e = (b out_channels + o) cells + c.
template <class T>
DTENSOR_HOST_DEVICE inline void spectral_mix_at(const SpectralMixDims& d, const T* in, const T* w, T* out,
                                                int64_t e) {
  const int64_t cells = d.cells();
  const int64_t c = e % cells, o = (e / cells) % d.out_channels, b = e / (cells * d.out_channels);
  const int64_t cell = d.weight_cell(c), mc = d.mode_cells();
  const int64_t plane = d.weight_in * d.weight_out * mc;
  T re = T(0), im = T(0);
  if (cell >= 0)
    for (int64_t i = 0; i < d.in_channels; ++i) {
      // W[ci, co, cell] with (ci, co) = (i, o) forward, (o, i) for dX.
      const int64_t wi = d.conjugate ? (o * d.weight_out + i) * mc + cell : (i * d.weight_out + o) * mc + cell;
      const T wr = w[wi], wm = d.conjugate ? -w[plane + wi] : w[plane + wi];
      const T* x = in + 2 * ((b * d.in_channels + i) * cells + c);
      re += x[0] * wr - x[1] * wm;
      im += x[0] * wm + x[1] * wr;
    }
  out[2 * e] = re;
  out[2 * e + 1] = im;
}

// Weight term e = (i weight_out + o) cells + c: g at (i, o, c's cell) += sum_b conj(X) dY.
template <class T>
DTENSOR_HOST_DEVICE inline void spectral_weight_term_at(const SpectralMixDims& d, const T* X, const T* dY, T* g,
                                                        int64_t e) {
  const int64_t cells = d.cells();
  const int64_t c = e % cells, o = (e / cells) % d.weight_out, i = e / (cells * d.weight_out);
  const int64_t cell = d.weight_cell(c);
  if (cell < 0) return;
  T re = T(0), im = T(0);
  for (int64_t b = 0; b < d.batch; ++b) {
    const T* x = X + 2 * ((b * d.weight_in + i) * cells + c);
    const T* y = dY + 2 * ((b * d.weight_out + o) * cells + c);
    re += x[0] * y[0] + x[1] * y[1];
    im += x[0] * y[1] - x[1] * y[0];
  }
  const int64_t mc = d.mode_cells(), wi = (i * d.weight_out + o) * mc + cell;
  g[wi] += re;
  g[d.weight_in * d.weight_out * mc + wi] += im;
}

// The host loops (host blocks, and the emulated device).
template <class T>
void spectral_mix(const SpectralMixDims& d, const T* in, const T* w, T* out) {
  d.check("compute::spectral_mix");
  const int64_t n = d.batch * d.out_channels * d.cells();
  for (int64_t e = 0; e < n; ++e) spectral_mix_at(d, in, w, out, e);
}
template <class T>
void spectral_weight_terms(const SpectralMixDims& d, const T* X, const T* dY, T* g) {
  d.check("compute::spectral_weight_terms");
  const int64_t n = d.weight_in * d.weight_out * d.cells();
  for (int64_t e = 0; e < n; ++e) spectral_weight_term_at(d, X, dY, g, e);
}

}  // namespace dtensor::compute
