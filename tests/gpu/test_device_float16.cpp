// bfloat16 and float16 DTensors on a device: casts, elementwise operators, sums and
// maxima over a sharded dim, products whose contracted dim is sharded (a Partial<Sum>
// of 16-bit terms reduced by the runtime in float), softmax (widened to float on the
// device) and a redistribution of a Partial<Sum>, on one rank and on 1x4, 2x2 and 3x1
// meshes with uneven blocks, in-process with device buffers; and nn::MixedPrecision
// training a bfloat16 model on float masters, its conversions on the device.
//
// Two references. Every result is checked against float64 on the same 16-bit values,
// within the bound test_reduced_precision.cpp states for the host (one 16-bit rounding
// of a float computation, float's error for its terms, and a rounding per rank's term
// of a Partial<Sum>); and the operations whose device arithmetic is the host's own
// (the elementwise maps without a transcendental function, casts, sums in order, the
// runtime's reductions) must equal the host run bit for bit. Compiled once, linked with
// the CUDA backend (gpu_test_device_float16) and with the emulated device
// (test_device_emulated).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <dtensor/dtensor.hpp>
#include <dtensor/nn.hpp>

#include "mixed_precision_mlp.hpp"

using namespace dtensor;

namespace {

struct Result {
  std::string name;
  std::vector<double> got;
  int terms = 1;        // the float terms of each element (the bound's L)
  bool exact = false;   // the device must give the host's bits
};

template <class X>
std::vector<double> widened(const X& x) {
  const auto t = x.full_tensor().to(Device::host());
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<std::size_t>(i)] = double(t.data()[i]);
  return v;
}

// body(comm, mesh) on each rank of a mesh of `shape` whose blocks live on `dev`.
template <class Body>
void on_mesh(Device dev, std::array<int, 2> shape, Body&& body) {
  RunOptions opt;
  opt.device = dev;
  run_threads(
      shape[0] * shape[1],
      [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, shape);
        body(comm, mesh);
      },
      opt);
}

// The operators on `dev`, on a mesh of `shape`: rank 0's results.
template <class T>
std::vector<Result> run_ops(Device dev, std::array<int, 2> shape, const Tensor<float, 2>& a,
                            const Tensor<float, 2>& b) {
  std::vector<Result> out;
  on_mesh(dev, shape, [&](Comm& comm, const DeviceMesh<2>& mesh) {
    const auto Af = distribute<Shard<0>, Shard<1>>(a, mesh);
    const auto Bf = distribute<Shard<0>, Shard<1>>(b, mesh);
    const auto A = cast<T>(Af), B = cast<T>(Bf);
    REQUIRE(A.local().device() == dev);
    std::vector<Result> mine;
    auto record = [&](const char* name, const auto& x, int terms, bool exact) {
      mine.push_back({name, widened(x), terms, exact});
    };
    record("cast", A, 1, true);
    record("cast back", cast<float>(A), 1, true);
    record("add", add(A, A), 1, true);
    record("mul", mul(A, A), 1, true);
    record("div", div(A, T(3.f)), 1, true);
    record("relu", relu(A), 1, true);
    record("exp", exp(A), 1, false);
    record("tanh", tanh(A), 1, false);
    record("sum", sum<1>(A), 5, true);
    record("max", max<1>(A), 1, true);
    // [7, 5] x [5, 6]: the contracted dim sharded over mesh dim 1, a Partial<Sum>.
    record("matmul", matmul(A, redistribute<Shard<1>, Replicate>(B)), 5, false);
    record("softmax", softmax<1>(A), 5, false);
    // A Partial<Sum> of 16-bit terms to Replicate (the value plus zeros: a check of the
    // device path's plumbing; float accumulation itself is checked below).
    const auto P = redistribute<Replicate, Partial<Sum>>(redistribute<Shard<0>, Replicate>(A));
    record("partial sum", redistribute<Replicate, Replicate>(P), 1, true);
    if (comm.rank() == 0) out = std::move(mine);
  });
  return out;
}

// The float64 reference of each operator on the 16-bit inputs.
std::vector<std::vector<double>> reference(const Tensor<double, 2>& a, const Tensor<double, 2>& b) {
  std::vector<std::vector<double>> r;
  auto rows = [&](auto f) {
    std::vector<double> v;
    for (int64_t i = 0; i < a.shape()[0]; ++i)
      for (int64_t j = 0; j < a.shape()[1]; ++j) v.push_back(f(a(i, j)));
    return v;
  };
  r.push_back(rows([](double x) { return x; }));
  r.push_back(rows([](double x) { return x; }));
  r.push_back(rows([](double x) { return x + x; }));
  r.push_back(rows([](double x) { return x * x; }));
  r.push_back(rows([](double x) { return x / 3; }));
  r.push_back(rows([](double x) { return x > 0 ? x : 0; }));
  r.push_back(rows([](double x) { return std::exp(x); }));
  r.push_back(rows([](double x) { return std::tanh(x); }));
  std::vector<double> s, m, mm, sm;
  for (int64_t i = 0; i < a.shape()[0]; ++i) {
    double acc = 0, top = -INFINITY, z = 0;
    for (int64_t j = 0; j < a.shape()[1]; ++j) acc += a(i, j), top = std::max(top, a(i, j));
    for (int64_t j = 0; j < a.shape()[1]; ++j) z += std::exp(a(i, j) - top);
    s.push_back(acc), m.push_back(top);
    for (int64_t j = 0; j < a.shape()[1]; ++j) sm.push_back(std::exp(a(i, j) - top) / z);
    for (int64_t k = 0; k < b.shape()[1]; ++k) {
      double p = 0;
      for (int64_t j = 0; j < a.shape()[1]; ++j) p += a(i, j) * b(j, k);
      mm.push_back(p);
    }
  }
  r.push_back(s), r.push_back(m), r.push_back(mm), r.push_back(sm);
  return r;
}

template <class T>
void check_device_ops(std::array<int, 2> shape) {
  INFO(std::string(name(dtype_of<T>())), " on a ", shape[0], "x", shape[1], " mesh");
  // Uneven blocks: 7 rows and 5 columns over 2, 3 or 4 ranks.
  Tensor<float, 2> a({7, 5}), b({5, 6});
  for (int64_t i = 0; i < a.numel(); ++i) a.data()[i] = float(T(std::sin(1.7 * double(i)) * 2.5));
  for (int64_t i = 0; i < b.numel(); ++i) b.data()[i] = float(T(std::cos(0.9 * double(i)) * 1.5));
  const auto dev = run_ops<T>(Device::cuda(0), shape, a, b);
  const auto host = run_ops<T>(Device::host(), shape, a, b);
  const auto a64 = compute::convert<double>(a), b64 = compute::convert<double>(b);
  auto ref = reference(a64, b64);
  // The partial sum: Replicate -> Partial<Sum> keeps the value on one rank of mesh dim 1
  // and zeros on the others, whose float sum is the value again.
  ref.push_back(ref[0]);
  REQUIRE(dev.size() == ref.size());
  REQUIRE(host.size() == ref.size());
  const double eps = double(std::numeric_limits<T>::epsilon());
  const double sharded = shape[0] * shape[1] > 1 ? 1.0 : 0.0;
  for (std::size_t c = 0; c < dev.size(); ++c) {
    const Result& r = dev[c];
    INFO(r.name);
    REQUIRE(r.got.size() == ref[c].size());
    for (std::size_t i = 0; i < ref[c].size(); ++i) {
      // Magnitudes of the terms: |r| + 4 bounds the sums of |terms| of these small
      // inputs (5 terms of at most 2.5 x 1.5). Too few terms to tell a float sum from a
      // 16-bit one: the exact comparison with the host, and the long sums of the next
      // case, do that.
      const double mag = std::fabs(ref[c][i]) + (r.terms > 1 ? 4.0 : 0.0);
      const double bound = 2 * (0.5 * eps * std::fabs(ref[c][i]) + r.terms * std::ldexp(1.0, -24) * mag +
                                sharded * 0.5 * eps * mag) +
                           (r.name == std::string("exp") || r.name == std::string("tanh") ? 2e-7 * mag : 0.0);
      const double err = std::fabs(r.got[i] - ref[c][i]);
      if (!(err <= bound))  // NaN fails
        FAIL_CHECK("element ", i, ": device ", r.got[i], ", float64 ", ref[c][i], " (bound ", bound, ")");
    }
    if (r.exact)
      for (std::size_t i = 0; i < ref[c].size(); ++i)
        if (!(r.got[i] == host[c].got[i]))
          FAIL_CHECK("element ", i, ": device ", r.got[i], ", host ", host[c].got[i], " (the same arithmetic)");
  }
}

}  // namespace

TEST_CASE("bfloat16 and float16 on a device: operators, products and the runtime's reductions against float64 and "
          "the host") {
  for (std::array<int, 2> shape : {std::array<int, 2>{1, 1}, {1, 4}, {2, 2}, {3, 1}}) {
    check_device_ops<bfloat16>(shape);
    check_device_ops<float16>(shape);
  }
}

TEST_CASE("bfloat16 on a device: a matrix product with k == 0 and a Partial<Avg> of equal terms") {
  // The empty sum writes zeros (beta 0); the mean of 4 equal terms, summed and divided
  // in float, is each term exactly.
  RunOptions opt;
  opt.device = Device::cuda(0);
  run_threads(
      4,
      [&](Comm& comm) {
        DeviceMesh<1> mesh(comm, {4});
        Tensor<float, 2> x({6, 3});
        for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = 0.37f * float(i) - 2;
        const auto X = cast<bfloat16>(distribute<Replicate>(x, mesh));
        const auto R = redistribute<Replicate>(redistribute<Partial<Avg>>(X));
        const auto got = R.full_tensor().to(Device::host()), want = X.full_tensor().to(Device::host());
        for (int64_t i = 0; i < got.numel(); ++i) CHECK(got.data()[i].bits == want.data()[i].bits);
        Tensor<float, 2> e({4, 0}), f({0, 5});
        const auto E = cast<bfloat16>(distribute<Replicate>(e, mesh));
        const auto F = cast<bfloat16>(distribute<Replicate>(f, mesh));
        const auto p = matmul(E, F).full_tensor().to(Device::host());
        REQUIRE(p.numel() == 20);
        for (int64_t i = 0; i < p.numel(); ++i) CHECK(float(p.data()[i]) == 0.f);
      },
      opt);
}

// --- sums a 16-bit accumulator would get wrong, and the local kernels on their own ---

namespace {

template <class T, int R>
Tensor<T, R> on(Device d, const Tensor<T, R>& t) {
  return t.to(d);
}
template <class T, int R>
std::vector<std::uint16_t> bits_of(const Tensor<T, R>& t) {
  const auto h = t.to(Device::host());
  std::vector<std::uint16_t> b;
  for (int64_t i = 0; i < h.numel(); ++i) b.push_back(h.data()[i].bits);
  return b;
}

}  // namespace

TEST_CASE("bfloat16 on a device: long sums and products accumulate in float, rounded once") {
  RunOptions opt;
  opt.device = Device::cuda(0);
  for (int ranks : {1, 3}) {
    INFO(ranks, " ranks");
    run_threads(
        ranks,
        [&](Comm& comm) {
          DeviceMesh<1> mesh(comm, {ranks});
          // A product over k = 1024 of ones: 1024 in float; added in bfloat16 it would
          // stop at 256 (each rank's own 342- or 340-term product tells the two apart; the
          // Partial<Sum> of the 3 ranks' exact terms, 342 + 342 + 340, adds in float too).
          Tensor<float, 2> ones_a({4, 1024}), ones_b({1024, 3});
          for (int64_t i = 0; i < ones_a.numel(); ++i) ones_a.data()[i] = 1.f;
          for (int64_t i = 0; i < ones_b.numel(); ++i) ones_b.data()[i] = 1.f;
          const auto A = cast<bfloat16>(distribute<Shard<1>>(ones_a, mesh));
          const auto B = cast<bfloat16>(distribute<Shard<0>>(ones_b, mesh));
          const auto p = matmul(A, B).full_tensor().to(Device::host());
          for (int64_t i = 0; i < p.numel(); ++i) CHECK(float(p.data()[i]) == 1024.f);
          // A sum over 300 values (the GPU's one-block-per-output path).
          Tensor<float, 2> x({3, 300});
          for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = 1.f + float(i % 300 == 7);
          const auto X = cast<bfloat16>(distribute<Replicate>(x, mesh));
          const auto s = sum<1>(X).full_tensor().to(Device::host());
          for (int64_t i = 0; i < s.numel(); ++i) CHECK(float(s.data()[i]) == 300.f);  // 301, a tie: to 300
        },
        opt);
  }
}

TEST_CASE("bfloat16 and float16 on a device: the local kernels against the host, bit for bit where the host's "
          "arithmetic is theirs") {
  const Device dev = Device::cuda(0), host = Device::host();
  RunOptions opt;
  opt.device = dev;
  run_threads(
      1,
      [&](Comm&) {
        // A scaled sum (a global average pool's mean: the sum not rounded before 1/n),
        // integer values so that any order of float addition is exact.
        Tensor<bfloat16, 1> x({4 * 49});
        for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = bfloat16(float(i % 13));
        Tensor<bfloat16, 1> mh({4}), md = on(dev, Tensor<bfloat16, 1>({4}));
        const Tensor<bfloat16, 1> xd = on(dev, x);
        compute::reduce_dim<ReduceOp::Sum>(host, x.data(), mh.data(), 4, 49, 1, 1.f / 49);
        compute::reduce_dim<ReduceOp::Sum>(dev, xd.data(), md.data(), 4, 49, 1, 1.f / 49);
        CHECK(bits_of(md) == bits_of(mh));
        // An embedding's gradient: one row hit 300 times by ones.
        const int64_t rows = 310, cols = 4, table_rows = 5;
        Tensor<int64_t, 1> index({rows});
        for (int64_t i = 0; i < rows; ++i) index(i) = i < 300 ? 2 : i % 5;
        Tensor<bfloat16, 2> dy({rows, cols}), table({table_rows, cols});
        for (int64_t i = 0; i < dy.numel(); ++i) dy.data()[i] = bfloat16(1.f);
        for (int64_t i = 0; i < table.numel(); ++i) table.data()[i] = bfloat16(0.5f * float(i));
        Tensor<bfloat16, 2> th = table, td = on(dev, table);
        const auto dyd = on(dev, dy);
        const auto idd = on(dev, index);
        compute::scatter_add_rows(host, dy.data(), index.data(), rows, cols, 0, th.data(), table_rows);
        compute::scatter_add_rows(dev, dyd.data(), idd.data(), rows, cols, 0, td.data(), table_rows);
        CHECK(bits_of(td) == bits_of(th));
        CHECK(float(th(2, 0)) == 306.f);  // 4 plus 302 ones (300, and i = 302, 307): in float, once
        // A GradScaler's factor in float (65536 is no float16) and the sum of squares of
        // 1000 ones in double (bfloat16 adding would stop at 256).
        Tensor<float16, 1> g({5});
        for (int64_t i = 0; i < 5; ++i) g(i) = float16(0.25f * float(i));
        auto gd = on(dev, g);
        compute::binary_scalar(BinaryOp::Mul, g, 1.f / 65536.f, g);
        compute::binary_scalar(BinaryOp::Mul, gd, 1.f / 65536.f, gd);
        CHECK(bits_of(gd) == bits_of(g));
        Tensor<bfloat16, 1> ones({1000});
        for (int64_t i = 0; i < 1000; ++i) ones(i) = bfloat16(1.f);
        CHECK(float(compute::sum_squares(on(dev, ones))) == 1000.f);
        CHECK(float(compute::sum_squares(ones)) == 1000.f);
      },
      opt);
}

TEST_CASE("bfloat16 and float16 convolutions on a device against the host: forward with a bias (whole output and "
          "a box), backward data, weight (accumulated) and bias") {
  const Device dev = Device::cuda(0), host = Device::host();
  auto run = [&]<class H>() {
    INFO(std::string(name(dtype_of<H>())));
    ConvDims d;
    d.spatial = 2, d.batch = 2, d.in_channels = 3, d.out_channels = 4;
    for (int i = 0; i < 2; ++i) d.in[i] = 9, d.out[i] = 9, d.kernel[i] = 3, d.stride[i] = 1, d.in_start[i] = -1;
    auto fill = [](int64_t n, double f) {
      Tensor<H, 1> t({n});
      for (int64_t i = 0; i < n; ++i) t.data()[i] = H(static_cast<float>(std::sin(f * double(i + 1))));
      return t;
    };
    const auto x = fill(d.x_size(), 0.7), w = fill(d.w_size(), 1.3), b = fill(d.out_channels, 2.1);
    const auto dy = fill(d.y_size(), 0.9);
    auto y = fill(d.y_size(), 0.2), dx = Tensor<H, 1>({d.x_size()}), dw = fill(d.w_size(), 0.4);
    auto db = fill(d.out_channels, 0.6);
    auto yd = on(dev, y), dxd = on(dev, dx), dwd = on(dev, dw), dbd = on(dev, db);
    const auto xd = on(dev, x), wd = on(dev, w), bd = on(dev, b), dyd = on(dev, dy);
    OutBox box;  // a box inside the output: the rest of y left as it was
    box.begin = {2, 1, 0}, box.end = {7, 8, 1};
    for (const OutBox& o : {OutBox{}, box}) {
      compute::conv_forward(host, d, x.data(), w.data(), b.data(), y.data(), o);
      compute::conv_forward(dev, d, xd.data(), wd.data(), bd.data(), yd.data(), o);
    }
    compute::conv_backward_data(host, d, dy.data(), w.data(), dx.data());
    compute::conv_backward_data(dev, d, dyd.data(), wd.data(), dxd.data());
    compute::conv_backward_weight(host, d, x.data(), dy.data(), dw.data(), true);
    compute::conv_backward_weight(dev, d, xd.data(), dyd.data(), dwd.data(), true);
    compute::conv_backward_bias(host, d, dy.data(), db.data(), true);
    compute::conv_backward_bias(dev, d, dyd.data(), dbd.data(), true);
    // Float sums in another order (cuDNN's against oneDNN's or the host loops) may round
    // a result to its 16-bit neighbour; the bias, added after the convolution's own
    // rounding on a GPU, one more. The bias gradient sums in double on both: equal.
    const double ulp = std::is_same_v<H, bfloat16> ? 0x1p-7 : 0x1p-10;
    auto near = [&](const Tensor<H, 1>& got_d, const Tensor<H, 1>& want, double units, const char* what) {
      const auto got = got_d.to(host);
      for (int64_t i = 0; i < want.numel(); ++i) {
        const double g = float(got.data()[i]), v = float(want.data()[i]);
        if (!(std::fabs(g - v) <= units * ulp * std::max(1.0, std::fabs(v))))
          FAIL_CHECK(what, " element ", i, ": device ", g, ", host ", v);
      }
    };
    near(yd, y, 2, "conv_forward");
    near(dxd, dx, 1, "conv_backward_data");
    near(dwd, dw, 2, "conv_backward_weight");  // accumulated into dw: cuDNN may round the sum first
    near(dbd, db, 0.5, "conv_backward_bias");
  };
  RunOptions opt;
  opt.device = dev;
  run_threads(1, [&](Comm&) {
    run.template operator()<bfloat16>();
    run.template operator()<float16>();
  }, opt);
}

// --- mixed-precision training on device blocks ---

namespace {

using namespace dtensor::test::mixed_mlp;

struct Trained {
  std::vector<double> losses;
  std::vector<std::vector<double>> params;
};

// Five SGD steps of MixedPrecision<MLP<bfloat16>, Policy> (float masters) on `dev`.
template <class Policy>
Trained train_mixed(Device dev, std::array<int, 2> shape) {
  Trained r;
  on_mesh(dev, shape, [&](Comm& comm, const DeviceMesh<2>& mesh) {
    auto f32 = make_mlp<float>(mesh);
    nn::MixedPrecision<MLP<bfloat16>, Policy> model(make_mlp<bfloat16>(mesh), f32);
    nn::MSELoss<Cfg<bfloat16>> loss;
    nn::SGD sgd({.lr = 0.05, .momentum = 0.9});
    using X = typename MLP<bfloat16>::InputT;
    using Y = typename MLP<bfloat16>::OutputT;
    const auto x = dtensor::detail::generate<X>({kRows, kIn}, mesh, {}, [](uint64_t i) {
      return std::sin(0.37 * static_cast<double>(i));
    });
    const auto t = dtensor::detail::generate<Y>({kRows, kOut}, mesh, {}, [](uint64_t i) {
      return std::cos(0.21 * static_cast<double>(i));
    });
    REQUIRE(x.local().device() == dev);
    Trained mine;
    for (int s = 0; s < 5; ++s) {
      model.zero_grad();
      const auto y = model.forward(x);
      mine.losses.push_back(double(loss.forward(y, t)));
      model.backward(loss.backward(y));
      sgd.step(model);
    }
    model.for_each_parameter([&](auto& p) {
      const auto f = p.value().full_tensor().to(Device::host());
      mine.params.emplace_back(f.data(), f.data() + f.numel());
    });
    if (comm.rank() == 0) r = std::move(mine);
  });
  return r;
}

// The device run against the host run: the products sum their float terms in another
// order (cuBLAS or the emulator's loops against oneDNN), so a bfloat16 activation or
// gradient may round to its neighbour; over five steps of SGD (lr 0.05) that moves a
// master by far less than 1e-3, and the loss by less than 1%.
template <class Policy>
void check_mixed_on_device(std::array<int, 2> shape) {
  INFO("mesh ", shape[0], "x", shape[1]);
  const Trained dev = train_mixed<Policy>(Device::cuda(0), shape), host = train_mixed<Policy>(Device::host(), shape);
  REQUIRE(dev.losses.size() == 5);
  REQUIRE(host.losses.size() == 5);
  for (std::size_t s = 0; s < 5; ++s) {
    INFO("step ", s, ": device loss ", dev.losses[s], ", host ", host.losses[s]);
    CHECK(std::fabs(dev.losses[s] - host.losses[s]) <= 1e-2 * std::fabs(host.losses[s]));
  }
  CHECK(dev.losses.back() < dev.losses.front());  // and it learns
  REQUIRE(dev.params.size() == host.params.size());
  for (std::size_t k = 0; k < host.params.size(); ++k) {
    REQUIRE(dev.params[k].size() == host.params[k].size());
    for (std::size_t i = 0; i < host.params[k].size(); ++i)
      if (!(std::fabs(dev.params[k][i] - host.params[k][i]) <= 1e-3))  // NaN fails
        FAIL_CHECK("parameter ", k, " element ", i, ": device ", dev.params[k][i], ", host ", host.params[k][i]);
  }
}

}  // namespace

TEST_CASE("MixedPrecision on device blocks: float masters, bfloat16 layers, gradients reduced in float or bfloat16") {
  for (const auto shape : {std::array<int, 2>{2, 2}, std::array<int, 2>{3, 1}, std::array<int, 2>{1, 1}}) {
    check_mixed_on_device<nn::Precision<float, bfloat16>>(shape);            // Reduce = float: the masters' reducer
    check_mixed_on_device<nn::Precision<float, bfloat16, bfloat16>>(shape);  // the model's bfloat16 buckets
  }
}
