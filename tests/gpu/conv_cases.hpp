#pragma once
// The cases of local convolution, pooling and upsampling (compute/conv.hpp, pool.hpp,
// upsample.hpp), written once for any device: test_compute_conv runs them on the host
// (a larger sample, and both host algorithms), test_device_emulated on the emulated
// device, gpu_test_device_compute on a GPU (cuDNN and the kernels of kernels/). Every
// result is checked against plain nested loops written here from the definitions, in
// double, never against the library.
//
// The sweep is a deterministic sample (a fixed generator) of: spatial 1, 2, 3; sizes 1,
// 2, 5, 15, 16; kernels 1, 2, 3, 5, 7; strides 1, 2, 3; dilations 1, 2; groups 1, 2
// and depthwise; in_start negative, zero and positive; outputs that reach past the
// input; output boxes; batches 0, 1, 2. sweep_coverage() lists which values a sample
// met, so a test can require all of them.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <dtensor/compute/conv.hpp>
#include <dtensor/compute/pool.hpp>
#include <dtensor/compute/upsample.hpp>
#include <dtensor/dtensor.hpp>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace dtensor::test::conv_cases {

// --- data on a device ---

template <class T>
Tensor<T, 1> on(Device d, const std::vector<T>& v) {
  Tensor<T, 1> t({static_cast<int64_t>(v.size())}, v);
  return t.to(d);
}
template <class T>
std::vector<T> back(const Tensor<T, 1>& t) {
  const auto h = t.to(Device::host());
  return std::vector<T>(h.data(), h.data() + h.numel());
}

// A small deterministic generator (splitmix64).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  int64_t in(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }  // [lo, hi]
  template <class V>
  auto pick(const V& v) {
    return v[static_cast<std::size_t>(below(static_cast<int64_t>(v.size())))];
  }
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(next() >> 11) / 9007199254740992.0;
  }
};

template <class T>
std::vector<T> values(int64_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = static_cast<T>(r.uniform(-2, 2));
  return v;
}

// A factor on tol(): 1, but for cases run with algorithms that may transform the sums
// (cuDNN's Fastest choice: Winograd, FFT), whose rounding is larger.
inline double& tol_scale() {
  static double f = 1;
  return f;
}
template <class T>
double tol() {
  return (std::is_same_v<T, float> ? 1e-5 : 1e-12) * tol_scale();
}

// |got - want| <= tol * mag (mag: the sum of the magnitudes of want's terms), with a
// floor for sums of nothing (exact zeros).
template <class T>
void expect_close(const std::vector<T>& got, const std::vector<double>& want, const std::vector<double>& mag,
                  const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]);
    if (err <= tol<T>() * mag[i] + 1e-300) continue;  // false for NaN too
    FAIL_CHECK(std::string(what), ": element ", i, " is ", double(got[i]), ", want ", want[i], " (error ", err,
               ", magnitude ", mag[i], ")");
    return;  // one element per check is enough to read
  }
}

// --- references ---

inline int64_t xi(const ConvDims& d, int64_t n, int64_t c, int64_t p0, int64_t p1, int64_t p2) {
  return (((n * d.in_channels + c) * d.in[0] + p0) * d.in[1] + p1) * d.in[2] + p2;
}
inline int64_t yi(const ConvDims& d, int64_t n, int64_t c, int64_t o0, int64_t o1, int64_t o2) {
  return (((n * d.out_channels + c) * d.out[0] + o0) * d.out[1] + o1) * d.out[2] + o2;
}
inline int64_t wi(const ConvDims& d, int64_t co, int64_t cl, int64_t k0, int64_t k1, int64_t k2) {
  return (((co * (d.in_channels / d.groups) + cl) * d.kernel[0] + k0) * d.kernel[1] + k1) * d.kernel[2] + k2;
}
inline bool in_box(const OutBox& b, int64_t o0, int64_t o1, int64_t o2) {
  return o0 >= b.begin[0] && o0 < b.end[0] && o1 >= b.begin[1] && o1 < b.end[1] && o2 >= b.begin[2] && o2 < b.end[2];
}

// Calls f(n, co, ci, o[3], k[3], p[3]) for every tap of every output that reads a
// stored input (the others read zeros).
template <class F>
void each_tap(const ConvDims& d, F&& f) {
  const int64_t cg = d.in_channels / d.groups, cog = d.out_channels / d.groups;
  for (int64_t n = 0; n < d.batch; ++n)
    for (int64_t co = 0; co < d.out_channels; ++co)
      for (int64_t o0 = 0; o0 < d.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < d.out[1]; ++o1)
          for (int64_t o2 = 0; o2 < d.out[2]; ++o2)
            for (int64_t cl = 0; cl < cg; ++cl)
              for (int64_t k0 = 0; k0 < d.kernel[0]; ++k0)
                for (int64_t k1 = 0; k1 < d.kernel[1]; ++k1)
                  for (int64_t k2 = 0; k2 < d.kernel[2]; ++k2) {
                    const std::array<int64_t, 3> o{o0, o1, o2}, k{k0, k1, k2};
                    std::array<int64_t, 3> p{};
                    bool inside = true;
                    for (int i = 0; i < 3; ++i) {
                      p[i] = d.in_start[i] + o[i] * d.stride[i] + k[i] * d.dilation[i];
                      inside = inside && p[i] >= 0 && p[i] < d.in[i];
                    }
                    if (inside) f(n, co, (co / cog) * cg + cl, cl, o, k, p);
                  }
}

struct Ref {
  std::vector<double> v, mag;
  explicit Ref(int64_t n) : v(static_cast<std::size_t>(n), 0.0), mag(static_cast<std::size_t>(n), 0.0) {}
  void add(int64_t i, double t) { v[i] += t, mag[i] += std::abs(t); }
};

template <class T>
Ref ref_forward(const ConvDims& d, const std::vector<T>& x, const std::vector<T>& w, const std::vector<T>* bias) {
  Ref y(d.y_size());
  if (bias)
    for (int64_t n = 0; n < d.batch; ++n)
      for (int64_t co = 0; co < d.out_channels; ++co)
        for (int64_t j = 0; j < d.out_cells(); ++j) y.add((n * d.out_channels + co) * d.out_cells() + j, (*bias)[co]);
  each_tap(d, [&](int64_t n, int64_t co, int64_t ci, int64_t cl, auto o, auto k, auto p) {
    y.add(yi(d, n, co, o[0], o[1], o[2]),
          double(w[wi(d, co, cl, k[0], k[1], k[2])]) * double(x[xi(d, n, ci, p[0], p[1], p[2])]));
  });
  return y;
}
template <class T>
Ref ref_backward_data(const ConvDims& d, const std::vector<T>& dy, const std::vector<T>& w) {
  Ref dx(d.x_size());
  each_tap(d, [&](int64_t n, int64_t co, int64_t ci, int64_t cl, auto o, auto k, auto p) {
    dx.add(xi(d, n, ci, p[0], p[1], p[2]),
           double(w[wi(d, co, cl, k[0], k[1], k[2])]) * double(dy[yi(d, n, co, o[0], o[1], o[2])]));
  });
  return dx;
}
template <class T>
Ref ref_backward_weight(const ConvDims& d, const std::vector<T>& x, const std::vector<T>& dy) {
  Ref dw(d.w_size());
  each_tap(d, [&](int64_t n, int64_t co, int64_t ci, int64_t cl, auto o, auto k, auto p) {
    dw.add(wi(d, co, cl, k[0], k[1], k[2]),
           double(dy[yi(d, n, co, o[0], o[1], o[2])]) * double(x[xi(d, n, ci, p[0], p[1], p[2])]));
  });
  return dw;
}

// --- the sweep ---

struct ConvCase {
  ConvDims d;
  OutBox box;  // resolved
  bool bias;
  // What the case exercises, for the coverage check.
  int64_t size, kernel, group_kind, start_kind;
};

inline std::string describe(const ConvDims& d) {
  std::string s = "spatial " + std::to_string(d.spatial) + ", batch " + std::to_string(d.batch) + ", channels " +
                  std::to_string(d.in_channels) + " -> " + std::to_string(d.out_channels) + ", groups " +
                  std::to_string(d.groups);
  for (int i = 0; i < d.spatial; ++i)
    s += "; dim " + std::to_string(i) + ": in " + std::to_string(d.in[i]) + " out " + std::to_string(d.out[i]) +
         " kernel " + std::to_string(d.kernel[i]) + " stride " + std::to_string(d.stride[i]) + " dilation " +
         std::to_string(d.dilation[i]) + " in_start " + std::to_string(d.in_start[i]);
  return s;
}
inline std::string describe(const OutBox& b) {
  std::string s = "box";
  for (int i = 0; i < 3; ++i) s += " [" + std::to_string(b.begin[i]) + ", " + std::to_string(b.end[i]) + ")";
  return s;
}

inline const std::vector<int64_t>& sweep_sizes() {
  static const std::vector<int64_t> v{1, 2, 5, 15, 16};
  return v;
}
inline const std::vector<int64_t>& sweep_kernels() {
  static const std::vector<int64_t> v{1, 2, 3, 5, 7};
  return v;
}

// One spatial dim of a window: a size, kernel, stride, dilation and in_start (kind 0:
// negative, 1: zero, 2: positive) with outputs that sometimes reach past the input.
inline void window_dim(Rng& r, ConvDims& d, int i, int64_t size, int64_t kernel, int start_kind) {
  d.in[i] = size, d.kernel[i] = kernel;
  d.stride[i] = r.in(1, 3), d.dilation[i] = r.in(1, 2);
  const int64_t span = d.dilation[i] * (kernel - 1) + 1;
  d.in_start[i] = start_kind == 0 ? -r.in(1, std::max<int64_t>(1, span - 1)) : start_kind == 1 ? 0 : r.in(1, 2);
  // Outputs whose windows end by the input's end plus a tail of zeros (0, or up to span - 1).
  const int64_t tail = r.below(3) == 0 ? r.in(0, span - 1) : 0;
  const int64_t room = size - d.in_start[i] + tail - span;
  d.out[i] = std::max<int64_t>(1, room < 0 ? 1 : room / d.stride[i] + 1);
}

// Case i of the convolution sweep; ops: a cap on the taps, so that the sweep stays quick.
inline ConvCase conv_case(uint64_t i, int64_t max_taps = 6000) {
  Rng r(1000 + i);
  for (;;) {
    ConvCase c{};
    ConvDims& d = c.d;
    d.spatial = static_cast<int>(r.in(1, 3));
    const int main = static_cast<int>(r.below(d.spatial));
    c.size = r.pick(sweep_sizes()), c.kernel = r.pick(sweep_kernels());
    c.start_kind = r.below(3);
    for (int j = 0; j < d.spatial; ++j) {
      const bool m = j == main;
      window_dim(r, d, j, m ? c.size : r.in(1, 5), m ? c.kernel : r.in(1, 3),
                 static_cast<int>(m ? c.start_kind : r.below(3)));
    }
    c.group_kind = r.below(3);
    if (c.group_kind == 0) {
      d.groups = 1, d.in_channels = r.in(1, 3), d.out_channels = r.in(1, 3);
    } else if (c.group_kind == 1) {
      d.groups = 2, d.in_channels = 2 * r.in(1, 2), d.out_channels = 2 * r.in(1, 2);
    } else {  // depthwise, with a channel multiplier of 1 or 2
      d.groups = d.in_channels = r.in(2, 3), d.out_channels = d.in_channels * r.in(1, 2);
    }
    d.batch = r.below(12) == 0 ? 0 : r.in(1, 2);
    c.bias = r.below(2) == 0;
    for (int j = 0; j < 3; ++j) {
      c.box.begin[j] = 0, c.box.end[j] = d.out[j];
      if (j < d.spatial && r.below(2) == 0) {
        c.box.begin[j] = r.in(0, d.out[j]);
        c.box.end[j] = r.in(c.box.begin[j], d.out[j]);
      }
    }
    const int64_t taps =
        std::max<int64_t>(1, d.batch) * d.out_channels * d.out_cells() * (d.in_channels / d.groups) * d.kernel_cells();
    if (taps <= max_taps) return c;
  }
}

// The values a sample of the sweep met, by parameter.
inline std::map<std::string, std::set<int64_t>> sweep_coverage(const std::vector<ConvCase>& cases) {
  std::map<std::string, std::set<int64_t>> m;
  for (const auto& c : cases) {
    const ConvDims& d = c.d;
    m["spatial"].insert(d.spatial);
    m["size"].insert(c.size);
    m["kernel"].insert(c.kernel);
    m["groups (0: 1, 1: 2, 2: depthwise)"].insert(c.group_kind);
    m["in_start (0: negative, 1: zero, 2: positive)"].insert(c.start_kind);
    m["batch"].insert(d.batch);
    bool partial = false, past = false;
    for (int j = 0; j < d.spatial; ++j) {
      m["stride"].insert(d.stride[j]);
      m["dilation"].insert(d.dilation[j]);
      partial = partial || c.box.begin[j] > 0 || c.box.end[j] < d.out[j];
      past = past || d.in_start[j] + (d.out[j] - 1) * d.stride[j] + d.dilation[j] * (d.kernel[j] - 1) >= d.in[j];
    }
    m["partial box"].insert(partial);
    m["empty box"].insert((c.box.end[0] - c.box.begin[0]) * (c.box.end[1] - c.box.begin[1]) *
                              (c.box.end[2] - c.box.begin[2]) ==
                          0);
    m["reads past the input"].insert(past);
  }
  return m;
}

// The host's two algorithms, oneDNN's (float; the host's own where it declines a window:
// compute/onednn_conv.hpp counts both), or the entry points (which pick one, or go to the
// device).
enum class Path { Entry, Gemm, Direct, Library };

template <class T>
void run_forward(Path path, Device dev, const ConvDims& d, const T* x, const T* w, const T* b, T* y, OutBox box) {
  if (path == Path::Entry) return compute::conv_forward(dev, d, x, w, b, y, box);
  d.validate("test");
  if (path == Path::Library && d.batch > 0 && !box.empty(d) &&
      detail::onednn::conv_forward(d, x, w, b, y, box.resolved(d)))
    return;
  detail::conv::forward(d, x, w, b, y, box.resolved(d),
                        path == Path::Gemm ? detail::conv::Algo::Gemm : detail::conv::Algo::Direct);
}
template <class T>
void run_backward_data(Path path, Device dev, const ConvDims& d, const T* dy, const T* w, T* dx) {
  if (path == Path::Entry) return compute::conv_backward_data(dev, d, dy, w, dx);
  if (path == Path::Library && d.batch > 0 && d.out_cells() > 0 && detail::onednn::conv_backward_data(d, dy, w, dx))
    return;
  detail::conv::backward_data(d, dy, w, dx, path == Path::Gemm ? detail::conv::Algo::Gemm : detail::conv::Algo::Direct);
}
template <class T>
void run_backward_weight(Path path, Device dev, const ConvDims& d, const T* x, const T* dy, T* dw, bool acc) {
  if (path == Path::Entry) return compute::conv_backward_weight(dev, d, x, dy, dw, acc);
  if (path == Path::Library && d.batch > 0 && d.out_cells() > 0 &&
      detail::onednn::conv_backward_weight(d, x, dy, dw, acc))
    return;
  detail::conv::backward_weight(d, x, dy, dw, acc,
                                path == Path::Gemm ? detail::conv::Algo::Gemm : detail::conv::Algo::Direct);
}

// Forward on the case's box (outputs outside it keep their sentinel, inside NaN before),
// backward data (dx NaN before: every cell written), weight (accumulating into values,
// and not: NaN before) and bias, each against the reference.
template <class T>
void check_conv(Device dev, const ConvCase& c, Path path, uint64_t seed) {
  const ConvDims& d = c.d;
  INFO(describe(d), "; ", describe(c.box), std::string(c.bias ? ", bias" : ""), "; on ", to_string(dev),
       std::string(path == Path::Gemm      ? " (im2col + GEMM)"
                   : path == Path::Direct  ? " (direct)"
                   : path == Path::Library ? " (oneDNN)"
                                           : ""));
  const T nan = std::numeric_limits<T>::quiet_NaN(), sentinel = T(7.25);
  const auto x = values<T>(d.x_size(), seed), w = values<T>(d.w_size(), seed + 1);
  const auto bias = values<T>(d.out_channels, seed + 2), dy = values<T>(d.y_size(), seed + 3);
  auto X = on(dev, x), W = on(dev, w), B = on(dev, bias), DY = on(dev, dy);

  // forward
  std::vector<T> y0(static_cast<std::size_t>(d.y_size()), sentinel);
  for (int64_t n = 0; n < d.batch; ++n)
    for (int64_t co = 0; co < d.out_channels; ++co)
      for (int64_t o0 = 0; o0 < d.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < d.out[1]; ++o1)
          for (int64_t o2 = 0; o2 < d.out[2]; ++o2)
            if (in_box(c.box, o0, o1, o2)) y0[yi(d, n, co, o0, o1, o2)] = nan;
  auto Y = on(dev, y0);
  run_forward<T>(path, dev, d, X.data(), W.data(), c.bias ? B.data() : nullptr, Y.data(), c.box);
  const auto y = back(Y);
  Ref want = ref_forward(d, x, w, c.bias ? &bias : nullptr);
  for (std::size_t i = 0; i < y0.size(); ++i)
    if (y0[i] == sentinel) want.v[i] = sentinel, want.mag[i] = 0;  // left alone
  expect_close(y, want.v, want.mag, "conv_forward");

  // backward data
  auto DX = on(dev, std::vector<T>(static_cast<std::size_t>(d.x_size()), nan));
  run_backward_data<T>(path, dev, d, DY.data(), W.data(), DX.data());
  const Ref dx = ref_backward_data(d, dy, w);
  expect_close(back(DX), dx.v, dx.mag, "conv_backward_data");

  // backward weight, fresh and accumulated
  const Ref dw = ref_backward_weight(d, x, dy);
  auto DW = on(dev, std::vector<T>(static_cast<std::size_t>(d.w_size()), nan));
  run_backward_weight<T>(path, dev, d, X.data(), DY.data(), DW.data(), false);
  expect_close(back(DW), dw.v, dw.mag, "conv_backward_weight");
  const auto prior = values<T>(d.w_size(), seed + 4);
  auto DW2 = on(dev, prior);
  run_backward_weight<T>(path, dev, d, X.data(), DY.data(), DW2.data(), true);
  Ref dw2 = dw;
  for (std::size_t i = 0; i < prior.size(); ++i) dw2.v[i] += prior[i], dw2.mag[i] += std::abs(double(prior[i]));
  expect_close(back(DW2), dw2.v, dw2.mag, "conv_backward_weight (accumulate)");

  // backward bias (once per case, through the entry point)
  if (path != Path::Direct) {
    Ref db(d.out_channels);
    for (int64_t n = 0; n < d.batch; ++n)
      for (int64_t co = 0; co < d.out_channels; ++co)
        for (int64_t j = 0; j < d.out_cells(); ++j) db.add(co, dy[(n * d.out_channels + co) * d.out_cells() + j]);
    auto DB = on(dev, std::vector<T>(static_cast<std::size_t>(d.out_channels), nan));
    compute::conv_backward_bias(dev, d, DY.data(), DB.data(), false);
    expect_close(back(DB), db.v, db.mag, "conv_backward_bias");
    auto DB2 = on(dev, std::vector<T>(static_cast<std::size_t>(d.out_channels), T(1)));
    compute::conv_backward_bias(dev, d, DY.data(), DB2.data(), true);
    for (auto& v : db.v) v += 1;
    for (auto& m : db.mag) m += 1;
    expect_close(back(DB2), db.v, db.mag, "conv_backward_bias (accumulate)");
  }
}

// <conv(x), dy> == <x, conv_backward_data(dy)> == <w, conv_backward_weight(x, dy)>.
inline void check_adjoint(Device dev, const ConvCase& c, Path path, uint64_t seed) {
  ConvDims d = c.d;
  INFO(describe(d), "; adjoints on ", to_string(dev));
  const auto x = values<double>(d.x_size(), seed), w = values<double>(d.w_size(), seed + 1);
  const auto dy = values<double>(d.y_size(), seed + 3);
  auto X = on(dev, x), W = on(dev, w), DY = on(dev, dy);
  auto Y = on(dev, std::vector<double>(static_cast<std::size_t>(d.y_size())));
  auto DX = on(dev, std::vector<double>(static_cast<std::size_t>(d.x_size())));
  auto DW = on(dev, std::vector<double>(static_cast<std::size_t>(d.w_size())));
  run_forward<double>(path, dev, d, X.data(), W.data(), nullptr, Y.data(), OutBox{});
  run_backward_data<double>(path, dev, d, DY.data(), W.data(), DX.data());
  run_backward_weight<double>(path, dev, d, X.data(), DY.data(), DW.data(), false);
  const auto y = back(Y), dx = back(DX), dw = back(DW);
  double a = 0, b = 0, e = 0, scale = 0;
  for (std::size_t i = 0; i < y.size(); ++i) a += y[i] * dy[i];
  for (std::size_t i = 0; i < x.size(); ++i) b += x[i] * dx[i];
  for (std::size_t i = 0; i < w.size(); ++i) e += w[i] * dw[i];
  // The scale of the sums: the magnitudes of every tap's product.
  each_tap(d, [&](int64_t n, int64_t co, int64_t ci, int64_t cl, auto o, auto k, auto p) {
    scale += std::abs(w[wi(d, co, cl, k[0], k[1], k[2])] * x[xi(d, n, ci, p[0], p[1], p[2])] *
                      dy[yi(d, n, co, o[0], o[1], o[2])]);
  });
  CHECK(std::abs(a - b) <= 1e-12 * scale + 1e-300);
  CHECK(std::abs(a - e) <= 1e-12 * scale + 1e-300);
}

// --- pooling ---

template <class T>
struct PoolRef {
  std::vector<double> y, dx;
};

// Calls f(tap cell index in the plane) for each valid tap of output o, in tap order.
template <class F>
void pool_taps(const PoolDims& p, std::array<int64_t, 3> o, F&& f) {
  const ConvDims& d = p.window;
  for (int64_t k0 = 0; k0 < d.kernel[0]; ++k0)
    for (int64_t k1 = 0; k1 < d.kernel[1]; ++k1)
      for (int64_t k2 = 0; k2 < d.kernel[2]; ++k2) {
        const std::array<int64_t, 3> k{k0, k1, k2};
        std::array<int64_t, 3> q{};
        bool valid = true;
        for (int i = 0; i < 3; ++i) {
          q[i] = d.in_start[i] + o[i] * d.stride[i] + k[i] * d.dilation[i];
          const int64_t hi = p.valid_hi[i] < 0 ? d.in[i] : p.valid_hi[i];
          valid = valid && q[i] >= 0 && q[i] < d.in[i] && q[i] >= p.valid_lo[i] && q[i] < hi;
        }
        if (valid) f((q[0] * d.in[1] + q[1]) * d.in[2] + q[2]);
      }
}

template <class T>
PoolRef<T> ref_pool(const PoolDims& p, const std::vector<T>& x, const std::vector<T>& dy) {
  const ConvDims& d = p.window;
  PoolRef<T> r{std::vector<double>(static_cast<std::size_t>(d.y_size())),
               std::vector<double>(static_cast<std::size_t>(d.x_size()))};
  for (int64_t plane = 0; plane < d.batch * d.in_channels; ++plane)
    for (int64_t o0 = 0; o0 < d.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < d.out[1]; ++o1)
        for (int64_t o2 = 0; o2 < d.out[2]; ++o2) {
          const int64_t yo = plane * d.out_cells() + (o0 * d.out[1] + o1) * d.out[2] + o2;
          const int64_t base = plane * d.in_cells();
          if (p.mode == PoolMode::Max) {
            int64_t arg = -1;
            pool_taps(p, {o0, o1, o2}, [&](int64_t c) {
              if (arg < 0 || x[base + c] > x[base + arg]) arg = c;
            });
            r.y[yo] = arg < 0 ? 0.0 : double(x[base + arg]);
            if (arg >= 0) r.dx[base + arg] += dy[yo];
          } else {
            double sum = 0;
            int64_t count = 0;
            pool_taps(p, {o0, o1, o2}, [&](int64_t c) { sum += x[base + c], ++count; });
            double counted = 1;  // the taps before count_hi along each dim (all: no limit)
            const std::array<int64_t, 3> o{o0, o1, o2};
            for (int i = 0; i < 3; ++i) {
              int64_t n = 0;
              for (int64_t k = 0; k < d.kernel[i]; ++k)
                n += p.count_hi[i] < 0 || d.in_start[i] + o[i] * d.stride[i] + k * d.dilation[i] < p.count_hi[i];
              counted *= double(n);
            }
            const double div = p.count_pad ? counted : double(count);
            r.y[yo] = div == 0 ? 0.0 : sum / div;
            if (div != 0) pool_taps(p, {o0, o1, o2}, [&](int64_t c) { r.dx[base + c] += dy[yo] / div; });
          }
        }
  return r;
}

struct PoolCase {
  PoolDims p;
  OutBox box;
};

inline PoolCase pool_case(uint64_t i) {
  Rng r(5000 + i);
  for (;;) {
    PoolCase c{};
    ConvDims& d = c.p.window;
    d.spatial = static_cast<int>(r.in(1, 3));
    const int main = static_cast<int>(r.below(d.spatial));
    for (int j = 0; j < d.spatial; ++j) {
      const bool m = j == main;
      window_dim(r, d, j, m ? r.pick(sweep_sizes()) : r.in(1, 5), m ? r.in(1, 4) : r.in(1, 3),
                 static_cast<int>(r.below(3)));
      if (r.below(2) == 0) {  // a valid range inside the block (a padded block's image cells)
        c.p.valid_lo[j] = r.in(0, d.in[j]);
        c.p.valid_hi[j] = r.in(c.p.valid_lo[j], d.in[j]);
      }
      if (r.below(2) == 0) {  // where counting stops (ceil_mode's windows past the padding): near the valid end
        const int64_t valid_end = c.p.valid_hi[j] < 0 ? d.in[j] : c.p.valid_hi[j];
        c.p.count_hi[j] = r.in(valid_end, valid_end + 2);
      }
    }
    d.in_channels = d.out_channels = r.in(1, 3);
    d.batch = r.below(12) == 0 ? 0 : r.in(1, 2);
    c.p.mode = r.below(2) == 0 ? PoolMode::Max : PoolMode::Average;
    c.p.count_pad = r.below(2) == 0;
    for (int j = 0; j < 3; ++j) {
      c.box.begin[j] = 0, c.box.end[j] = d.out[j];
      if (j < d.spatial && r.below(2) == 0) {
        c.box.begin[j] = r.in(0, d.out[j]);
        c.box.end[j] = r.in(c.box.begin[j], d.out[j]);
      }
    }
    if (std::max<int64_t>(1, d.batch) * d.in_channels * d.out_cells() * d.kernel_cells() <= 4000) return c;
  }
}

template <class T>
void check_pool(Device dev, const PoolCase& c, uint64_t seed) {
  const PoolDims& p = c.p;
  const ConvDims& d = p.window;
  std::string v;
  for (int i = 0; i < d.spatial; ++i)
    v += " [" + std::to_string(p.valid_lo[i]) + ", " + std::to_string(p.valid_hi[i]) + "), counted to " +
         std::to_string(p.count_hi[i]);
  INFO(std::string(p.mode == PoolMode::Max ? "max" : "average"), std::string(p.count_pad ? " (count_pad) " : " "),
       describe(d), "; valid", v, "; ", describe(c.box), "; on ", to_string(dev));
  const T nan = std::numeric_limits<T>::quiet_NaN(), sentinel = T(7.25);
  const auto x = values<T>(d.x_size(), seed), dy = values<T>(d.y_size(), seed + 1);
  const PoolRef<T> want = ref_pool(p, x, dy);
  auto X = on(dev, x), DY = on(dev, dy);
  std::vector<T> y0(static_cast<std::size_t>(d.y_size()), sentinel);
  std::vector<double> wy(y0.size(), double(sentinel)), mag(y0.size(), 0.0);
  for (int64_t plane = 0; plane < d.batch * d.in_channels; ++plane)
    for (int64_t o0 = 0; o0 < d.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < d.out[1]; ++o1)
        for (int64_t o2 = 0; o2 < d.out[2]; ++o2)
          if (in_box(c.box, o0, o1, o2)) {
            const int64_t i = plane * d.out_cells() + (o0 * d.out[1] + o1) * d.out[2] + o2;
            y0[i] = nan, wy[i] = want.y[i], mag[i] = 2 * d.kernel_cells() * (1 + std::abs(want.y[i]));
          }
  auto Y = on(dev, y0);
  compute::pool_forward(dev, p, X.data(), Y.data(), c.box);
  expect_close(back(Y), wy, mag, "pool_forward");
  auto DX = on(dev, std::vector<T>(static_cast<std::size_t>(d.x_size()), nan));
  compute::pool_backward(dev, p, X.data(), DY.data(), DX.data());
  std::vector<double> dmag(want.dx.size());
  for (std::size_t i = 0; i < dmag.size(); ++i) dmag[i] = 2 * d.kernel_cells() * (1 + std::abs(want.dx[i]));
  expect_close(back(DX), want.dx, dmag, "pool_backward");
}

// Max pooling's rules, worked by hand: ties go to the first tap, a window without a
// valid tap gives 0 and no gradient, cells outside the valid range are padding
// whatever they hold.
// Average pooling as PyTorch's ceil_mode gives it over 6 cells, kernel 3, stride 2,
// padding 1: four windows from cell -1, counted up to cell 7.
inline PoolDims ceil_mode_case() {
  PoolDims c;
  c.mode = PoolMode::Average;
  c.window.spatial = 1, c.window.in = {6, 1, 1}, c.window.out = {4, 1, 1}, c.window.kernel = {3, 1, 1};
  c.window.stride = {2, 1, 1}, c.window.in_start = {-1, 0, 0};
  c.count_hi = {7, -1, -1};
  return c;
}

template <class T>
void pool_hand_cases(Device dev) {
  INFO("on ", to_string(dev));
  PoolDims p;
  p.window.spatial = 1, p.window.in = {4, 1, 1}, p.window.out = {3, 1, 1}, p.window.kernel = {2, 1, 1};
  auto X = on(dev, std::vector<T>{1, 3, 3, 2});
  auto Y = on(dev, std::vector<T>(3));
  compute::pool_forward(dev, p, X.data(), Y.data());
  CHECK(back(Y) == std::vector<T>{3, 3, 3});
  auto DY = on(dev, std::vector<T>{1, 10, 100});
  auto DX = on(dev, std::vector<T>(4, T(-1)));
  compute::pool_backward(dev, p, X.data(), DY.data(), DX.data());
  CHECK(back(DX) == std::vector<T>{0, 11, 100, 0});
  // Cells 0 and 3 are padding (a ghost past the image holding 50): windows (0, 1)
  // -> 3, (1, 2) -> 3, (2, 3) -> 3; with valid [1, 2) only, window 2 has no valid tap.
  auto X2 = on(dev, std::vector<T>{50, 3, 3, 50});
  p.valid_lo[0] = 1, p.valid_hi[0] = 3;
  compute::pool_forward(dev, p, X2.data(), Y.data());
  CHECK(back(Y) == std::vector<T>{3, 3, 3});
  p.valid_hi[0] = 2;
  compute::pool_forward(dev, p, X2.data(), Y.data());
  CHECK(back(Y) == std::vector<T>{3, 3, 0});
  compute::pool_backward(dev, p, X2.data(), DY.data(), DX.data());
  CHECK(back(DX) == std::vector<T>{0, 11, 0, 0});
  // Average with in_start -1 (zero padding) over [1, 2, 3, 4], kernel 3, stride 2:
  // windows (-1, 0, 1) and (1, 2, 3); count_pad divides by 3, else by the valid taps.
  PoolDims a;
  a.mode = PoolMode::Average;
  a.window.spatial = 1, a.window.in = {4, 1, 1}, a.window.out = {2, 1, 1}, a.window.kernel = {3, 1, 1};
  a.window.stride = {2, 1, 1}, a.window.in_start = {-1, 0, 0};
  auto X3 = on(dev, std::vector<T>{1, 2, 3, 4});
  auto Y3 = on(dev, std::vector<T>(2));
  compute::pool_forward(dev, a, X3.data(), Y3.data());
  CHECK(back(Y3) == std::vector<T>{1, 3});
  a.count_pad = false;
  compute::pool_forward(dev, a, X3.data(), Y3.data());
  CHECK(back(Y3) == std::vector<T>{T(1.5), 3});
  // PyTorch's ceil_mode over [1 .. 6] with padding 1: a fourth window (5, 6, 7) reads
  // cell 5 and padding, and counts only up to the padding's end (count_hi 7): 6 / 2.
  const PoolDims c = ceil_mode_case();
  auto X4 = on(dev, std::vector<T>{1, 2, 3, 4, 5, 6});
  auto Y4 = on(dev, std::vector<T>(4));
  compute::pool_forward(dev, c, X4.data(), Y4.data());
  CHECK(back(Y4) == std::vector<T>{1, 3, 5, 3});
  auto DY4 = on(dev, std::vector<T>(4, T(1)));
  auto DX4 = on(dev, std::vector<T>(6, T(-1)));
  compute::pool_backward(dev, c, X4.data(), DY4.data(), DX4.data());
  const std::vector<double> want{1. / 3, 2. / 3, 1. / 3, 2. / 3, 1. / 3, 5. / 6};
  const auto dx = back(DX4);
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(double(dx[i]) == doctest::Approx(want[i]).epsilon(1e-6));
}

// --- upsampling ---

inline std::array<int64_t, 2> ref_nearest(int64_t j, int64_t s) { return {j / s, j / s}; }
// align_corners = false, from PyTorch's formula in double.
inline void ref_linear(int64_t j, int64_t s, int64_t n, int64_t& i0, int64_t& i1, double& l) {
  double src = (j + 0.5) / double(s) - 0.5;
  if (src < 0) src = 0;
  i0 = static_cast<int64_t>(std::floor(src));
  i1 = std::min(i0 + 1, n - 1);
  l = src - double(i0);
}

struct UpCase {
  UpsampleDims u;
};

inline UpCase up_case(uint64_t i) {
  Rng r(9000 + i);
  UpCase c{};
  UpsampleDims& u = c.u;
  u.spatial = static_cast<int>(r.in(1, 3));
  u.mode = r.below(2) == 0 ? UpsampleMode::Nearest : UpsampleMode::Linear;
  u.batch = r.below(10) == 0 ? 0 : r.in(1, 2);
  u.channels = r.in(1, 2);
  for (int d = 0; d < u.spatial; ++d) {
    const int64_t n = r.pick(std::vector<int64_t>{1, 2, 5, 7}), s = r.in(1, 3);
    u.scale[d] = s, u.global_in[d] = n;
    // A block of outputs (sometimes empty), and the inputs it reads with 0 or 1 more
    // on each side (ghosts).
    u.out_offset[d] = r.in(0, n * s - 1);
    u.out[d] = r.below(10) == 0 ? 0 : r.in(1, n * s - u.out_offset[d]);
    int64_t lo = 0, hi = 0;
    if (u.out[d] > 0) {
      const int64_t a = u.out_offset[d], b = a + u.out[d] - 1;
      if (u.mode == UpsampleMode::Nearest) {
        lo = ref_nearest(a, s)[0], hi = ref_nearest(b, s)[1] + 1;
      } else {
        int64_t i0, i1;
        double l;
        ref_linear(a, s, n, i0, i1, l);
        lo = i0;
        ref_linear(b, s, n, i0, i1, l);
        hi = i1 + 1;
      }
    } else {
      lo = hi = r.in(0, n);
    }
    u.in_offset[d] = std::max<int64_t>(0, lo - r.below(2));
    u.in[d] = std::min<int64_t>(n, hi + r.below(2)) - u.in_offset[d];
  }
  return c;
}

template <class T>
void check_upsample(Device dev, const UpCase& c, uint64_t seed) {
  const UpsampleDims& u = c.u;
  std::string s;
  for (int d = 0; d < u.spatial; ++d)
    s += "; dim " + std::to_string(d) + ": image " + std::to_string(u.global_in[d]) + " x " +
         std::to_string(u.scale[d]) + ", x [" + std::to_string(u.in_offset[d]) + ", +" + std::to_string(u.in[d]) +
         "), y [" + std::to_string(u.out_offset[d]) + ", +" + std::to_string(u.out[d]) + ")";
  INFO(std::string(u.mode == UpsampleMode::Nearest ? "nearest" : "linear"), ", batch ", u.batch, ", channels ",
       u.channels, s, "; on ", to_string(dev));
  const auto x = values<T>(u.x_size(), seed), dy = values<T>(u.y_size(), seed + 1);
  // The reference: per output, the (up to 2^spatial) inputs and weights.
  std::vector<double> y(static_cast<std::size_t>(u.y_size())), ymag(y.size()), dx(static_cast<std::size_t>(u.x_size())),
      dxmag(dx.size());
  const int64_t planes = u.batch * u.channels;
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t j0 = 0; j0 < u.out[0]; ++j0)
      for (int64_t j1 = 0; j1 < u.out[1]; ++j1)
        for (int64_t j2 = 0; j2 < u.out[2]; ++j2) {
          const std::array<int64_t, 3> j{j0, j1, j2};
          std::array<std::array<int64_t, 2>, 3> idx{};
          std::array<std::array<double, 2>, 3> wt{};
          for (int d = 0; d < 3; ++d) {
            if (d >= u.spatial) {
              idx[d] = {0, 0}, wt[d] = {1, 0};
              continue;
            }
            const int64_t J = u.out_offset[d] + j[d];
            if (u.mode == UpsampleMode::Nearest) {
              idx[d] = ref_nearest(J, u.scale[d]), wt[d] = {1, 0};
            } else {
              int64_t i0, i1;
              double l;
              ref_linear(J, u.scale[d], u.global_in[d], i0, i1, l);
              idx[d] = {i0, i1}, wt[d] = {1 - l, l};
            }
            idx[d][0] -= u.in_offset[d], idx[d][1] -= u.in_offset[d];
          }
          const int64_t yo = pl * u.out_cells() + (j0 * u.out[1] + j1) * u.out[2] + j2;
          for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b)
              for (int e = 0; e < 2; ++e) {
                const double wgt = wt[0][a] * wt[1][b] * wt[2][e];
                if (wgt == 0) continue;
                const int64_t xo = pl * u.in_cells() + (idx[0][a] * u.in[1] + idx[1][b]) * u.in[2] + idx[2][e];
                y[yo] += wgt * x[xo], ymag[yo] += 4 * std::abs(wgt * x[xo]);
                dx[xo] += wgt * dy[yo], dxmag[xo] += 4 * std::abs(wgt * dy[yo]);
              }
        }
  const T nan = std::numeric_limits<T>::quiet_NaN();
  auto X = on(dev, x), DY = on(dev, dy);
  auto Y = on(dev, std::vector<T>(y.size(), nan));
  compute::upsample_forward(dev, u, X.data(), Y.data());
  expect_close(back(Y), y, ymag, "upsample_forward");
  auto DX = on(dev, std::vector<T>(dx.size(), nan));
  compute::upsample_backward(dev, u, DY.data(), DX.data());
  expect_close(back(DX), dx, dxmag, "upsample_backward");
}

// PyTorch's values, worked by hand: linear [0, 4] x 2 -> [0, 1, 3, 4]; nearest [5, 6] x 3.
template <class T>
void upsample_hand_cases(Device dev) {
  auto X = on(dev, std::vector<T>{0, 4});
  auto Y = on(dev, std::vector<T>(4));
  auto u = UpsampleDims::whole(1, UpsampleMode::Linear, 1, 1, {2, 1, 1}, {2, 1, 1});
  compute::upsample_forward(dev, u, X.data(), Y.data());
  CHECK(back(Y) == std::vector<T>{0, 1, 3, 4});
  auto DX = on(dev, std::vector<T>(2));
  compute::upsample_backward(dev, u, on(dev, std::vector<T>{1, 1, 1, 1}).data(), DX.data());
  CHECK(back(DX) == std::vector<T>{2, 2});  // y = [x0, .75 x0 + .25 x1, .25 x0 + .75 x1, x1]
  auto n = UpsampleDims::whole(1, UpsampleMode::Nearest, 1, 1, {2, 1, 1}, {3, 1, 1});
  auto X2 = on(dev, std::vector<T>{5, 6});
  auto Y2 = on(dev, std::vector<T>(6));
  compute::upsample_forward(dev, n, X2.data(), Y2.data());
  CHECK(back(Y2) == std::vector<T>{5, 5, 5, 6, 6, 6});
}

// Bad dims: errors that name the entry point and the problem, on any device.
inline void bad_input_cases(Device dev) {
  auto a = on(dev, std::vector<double>(64));
  ConvDims d;
  d.in_channels = 3, d.out_channels = 4, d.groups = 2;
  CHECK_THROWS_WITH_AS(compute::conv_forward(dev, d, a.data(), a.data(), nullptr, a.data()),
                       doctest::Contains("conv_forward: 2 groups do not divide the channels"), InvalidArgument);
  d = ConvDims{};
  d.spatial = 4;
  CHECK_THROWS_WITH_AS(compute::conv_backward_data(dev, d, a.data(), a.data(), a.data()),
                       doctest::Contains("conv_backward_data: 4 spatial dims"), InvalidArgument);
  d = ConvDims{};
  d.spatial = 1, d.in = {5, 1, 1}, d.out = {5, 2, 1};
  CHECK_THROWS_WITH_AS(compute::conv_backward_weight(dev, d, a.data(), a.data(), a.data(), false),
                       doctest::Contains("spatial dim 1 is beyond the 1 used ones"), InvalidArgument);
  d = ConvDims{};
  d.in = {4, 4, 1}, d.out = {4, 4, 1}, d.kernel = {0, 1, 1};
  CHECK_THROWS_WITH_AS(compute::conv_backward_bias(dev, d, a.data(), a.data(), false), doctest::Contains("kernel 0"),
                       InvalidArgument);
  d = ConvDims{};
  d.in = {4, 4, 1}, d.out = {4, 4, 1};
  OutBox b;
  b.begin = {0, 2, 0}, b.end = {4, 5, 1};
  CHECK_THROWS_WITH_AS(compute::conv_forward(dev, d, a.data(), a.data(), nullptr, a.data(), b),
                       doctest::Contains("the output box [2, 5) of spatial dim 1 is outside [0, 4)"), InvalidArgument);
  PoolDims p;
  p.window = d, p.window.out_channels = 2;
  CHECK_THROWS_WITH_AS(compute::pool_forward(dev, p, a.data(), a.data()),
                       doctest::Contains("pool_forward: pooling keeps the channels"), InvalidArgument);
  p.window.out_channels = 1, p.valid_lo = {1, 0, 0}, p.valid_hi = {5, -1, -1};
  CHECK_THROWS_WITH_AS(compute::pool_backward(dev, p, a.data(), a.data(), a.data()),
                       doctest::Contains("pool_backward: the valid cells [1, 5) of spatial dim 0"), InvalidArgument);
  UpsampleDims u = UpsampleDims::whole(2, UpsampleMode::Linear, 1, 1, {4, 4, 1}, {2, 2, 1});
  u.global_in = {8, 4, -1}, u.in_offset = {2, 0, 0}, u.out_offset = {4, 0, 0};
  // y's outputs [4, 12) of dim 0 read inputs [1, 7): x holds [2, 6)
  CHECK_THROWS_WITH_AS(compute::upsample_forward(dev, u, a.data(), a.data()),
                       doctest::Contains("upsample_forward: spatial dim 0: outputs [4, 12) read inputs [1, 7)"),
                       InvalidArgument);
  u = UpsampleDims::whole(2, UpsampleMode::Nearest, 1, 1, {4, 4, 1}, {0, 2, 1});
  CHECK_THROWS_WITH_AS(compute::upsample_backward(dev, u, a.data(), a.data()), doctest::Contains("scale 0"),
                       InvalidArgument);
}

// A sample of every case kind through the entry points, for a device (the host test
// runs more, and both host algorithms).
// Whole outputs of "same"-padded windows (a single rank's convolution, a strided stem):
// where cuDNN's own symmetric padding reads exactly the window (cuda/dnn.hpp).
inline std::vector<ConvCase> symmetric_padding_cases() {
  auto same = [](int spatial, std::array<int64_t, 3> in, int64_t k, int64_t stride, int64_t dil, int64_t groups) {
    ConvCase c{};
    ConvDims& d = c.d;
    d.spatial = spatial, d.batch = 2, d.groups = groups, d.in_channels = 2 * groups, d.out_channels = 3 * groups;
    for (int j = 0; j < spatial; ++j) {
      const int64_t span = dil * (k - 1) + 1, pad = (span - 1) / 2;
      d.in[j] = in[j], d.kernel[j] = k, d.stride[j] = stride, d.dilation[j] = dil, d.in_start[j] = -pad;
      d.out[j] = (in[j] + 2 * pad - span) / stride + 1;
    }
    for (int j = 0; j < 3; ++j) c.box.begin[j] = 0, c.box.end[j] = d.out[j];
    c.bias = true;
    return c;
  };
  return {same(2, {9, 7, 1}, 3, 1, 1, 1), same(2, {16, 15, 1}, 7, 2, 1, 1), same(3, {5, 6, 4}, 3, 1, 1, 1),
          same(1, {11, 1, 1}, 5, 1, 1, 2), same(2, {8, 8, 1}, 3, 1, 2, 1),   same(2, {10, 9, 1}, 3, 2, 1, 2)};
}

inline void device_cases(Device dev, int conv_count = 24, int pool_count = 24, int up_count = 24) {
  SUBCASE("convolution, float") {
    for (int i = 0; i < conv_count; ++i) check_conv<float>(dev, conv_case(static_cast<uint64_t>(i)), Path::Entry, i);
  }
  SUBCASE("convolution, double, and adjoints") {
    for (int i = 0; i < conv_count; ++i) {
      const auto c = conv_case(static_cast<uint64_t>(100 + i));
      check_conv<double>(dev, c, Path::Entry, i);
      check_adjoint(dev, c, Path::Entry, i);
    }
  }
  SUBCASE("convolution, whole outputs with symmetric zero padding (cuDNN's own padding on a GPU)") {
    int i = 0;
    for (const ConvCase& c : symmetric_padding_cases()) {
      check_conv<float>(dev, c, Path::Entry, 300 + i);
      check_conv<double>(dev, c, Path::Entry, 300 + i);
      check_adjoint(dev, c, Path::Entry, 300 + i);
      ++i;
    }
  }
  SUBCASE("pooling") {
    for (int i = 0; i < pool_count; ++i) {
      check_pool<float>(dev, pool_case(static_cast<uint64_t>(i)), i);
      check_pool<double>(dev, pool_case(static_cast<uint64_t>(100 + i)), i);
    }
    pool_hand_cases<float>(dev);
    pool_hand_cases<double>(dev);
  }
  SUBCASE("upsampling") {
    for (int i = 0; i < up_count; ++i) {
      check_upsample<float>(dev, up_case(static_cast<uint64_t>(i)), i);
      check_upsample<double>(dev, up_case(static_cast<uint64_t>(100 + i)), i);
    }
    upsample_hand_cases<float>(dev);
    upsample_hand_cases<double>(dev);
  }
  SUBCASE("bad input") { bad_input_cases(dev); }
}

}  // namespace dtensor::test::conv_cases
