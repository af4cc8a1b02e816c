// Convolution of images sharded in space (nn/image/conv.hpp), against a single-rank
// convolution of the whole image written here with plain loops: forward, dx, dW
// and db. A sweep like distconv's (image sizes 16, 15, 63; kernels 1, 2, 3, 5, 7;
// strides 1, 2; padding 0, 1, same; dilation 1, 2; groups 1 and depthwise) on 1-D
// meshes of 2, 3 and 4 ranks over H; 2-D convolutions on 2x2 meshes over H and W
// and over batch and H; a 3-D convolution on a 2x2 mesh over D and H; explicit
// uneven blocks, a block thinner than the halo and an empty one. The input's
// gradient keeps the input's placements and blocks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/nn/image/conv.hpp>

#include "compare.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

// The whole image's convolution, as the definition reads. x [N, Ci, s0, s1, s2],
// w [Co, Ci/g, k0, k1, k2] (unused spatial extents 1).
struct RefConv {
  int64_t n, ci, co, g;
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, s{1, 1, 1}, d{1, 1, 1}, p{0, 0, 0};

  int64_t xi(int64_t b, int64_t c, std::array<int64_t, 3> q) const {
    return (((b * ci + c) * in[0] + q[0]) * in[1] + q[1]) * in[2] + q[2];
  }
  int64_t yi(int64_t b, int64_t c, std::array<int64_t, 3> o) const {
    return (((b * co + c) * out[0] + o[0]) * out[1] + o[1]) * out[2] + o[2];
  }
  int64_t wi(int64_t c, int64_t cc, std::array<int64_t, 3> t) const {
    return (((c * (ci / g) + cc) * k[0] + t[0]) * k[1] + t[1]) * k[2] + t[2];
  }
  // f(b, output channel, input channel, output cell, input cell, tap) for every tap in the image.
  template <class F>
  void each(F&& f) const {
    const int64_t cig = ci / g, cog = co / g;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t c = 0; c < co; ++c)
        for (int64_t o0 = 0; o0 < out[0]; ++o0)
          for (int64_t o1 = 0; o1 < out[1]; ++o1)
            for (int64_t o2 = 0; o2 < out[2]; ++o2)
              for (int64_t cc = 0; cc < cig; ++cc)
                for (int64_t t0 = 0; t0 < k[0]; ++t0)
                  for (int64_t t1 = 0; t1 < k[1]; ++t1)
                    for (int64_t t2 = 0; t2 < k[2]; ++t2) {
                      const std::array<int64_t, 3> o{o0, o1, o2}, t{t0, t1, t2};
                      std::array<int64_t, 3> q{};
                      bool inside = true;
                      for (int e = 0; e < 3; ++e) {
                        q[e] = o[e] * s[e] - p[e] + t[e] * d[e];
                        inside = inside && q[e] >= 0 && q[e] < in[e];
                      }
                      if (inside) f(yi(b, c, o), xi(b, (c / cog) * cig + cc, q), wi(c, cc, t));
                    }
  }
};

template <int S>
RefConv reference_geometry(const nn::ConvSpec<S>& spec, int64_t n, int64_t ci, int64_t co,
                           const std::array<int64_t, S>& image) {
  RefConv r{n, ci, co, spec.groups};
  for (int i = 0; i < S; ++i) {
    const WindowDim w = spec.window(i, image[i]);
    r.in[i] = image[i], r.k[i] = w.kernel, r.s[i] = w.stride, r.d[i] = w.dilation, r.p[i] = w.pad_lo;
    r.out[i] = w.out_extent(image[i]);
  }
  return r;
}

// Values of a global tensor: a function of the index only, the same on every rank.
template <class T, int R>
Tensor<T, R> pattern(const Shape<R>& shape, uint64_t seed) {
  Tensor<T, R> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data()[i] = static_cast<T>(2 * dtensor::detail::uniform01(seed, static_cast<uint64_t>(i)) - 1);
  return t;
}

template <class T>
double rel_diff(const T* a, const std::vector<double>& b) {
  return max_rel_diff(a, b.data(), static_cast<int64_t>(b.size()));
}

template <class DT, class T, int R>
DT scatter(const Tensor<T, R>& global, const typename DT::Mesh& mesh, const std::type_identity_t<Splits<R>>& splits) {
  return [&]<class... P>(Placements<P...>) { return distribute<P...>(global, mesh, 0, splits); }(
      typename DT::placements{});
}

// Sums each rank's local block over the mesh (the reduction the model runs once per step).
template <class T, int R, int M>
Tensor<T, R> summed(const Tensor<T, R>& block, const DeviceMesh<M>& mesh) {
  Tensor<T, R> out(block.shape());
  mesh.comm().all_reduce(block.data(), out.data(), static_cast<std::size_t>(block.numel()), dtype_of<T>(),
                         ReduceOp::Sum);
  return out;
}

// One distributed convolution against the reference. X: the input's DTensor type.
// The input's block is overwritten between the forward and the backward (a layer's
// input may be gone by then: dW must come from what the forward kept). Returns
// whether the halo had ghosts (the padded path) or the block was read in place.
template <class X, int S>
bool check_conv(const typename X::Mesh& mesh, const nn::ConvSpec<S>& spec, int64_t n, int64_t ci, int64_t co,
                const std::array<int64_t, S>& image, const Splits<X::rank>& splits, double tol,
                bool overlap = true) {
  using T = typename X::value_type;
  constexpr int R = X::rank;
  Shape<R> xs{n, ci};
  for (int i = 0; i < S; ++i) xs[2 + i] = image[i];
  const RefConv ref = reference_geometry<S>(spec, n, ci, co, image);
  Shape<R> ws{co, ci / spec.groups}, ys{n, co};
  for (int i = 0; i < S; ++i) ws[2 + i] = spec.kernel[i], ys[2 + i] = ref.out[i];

  const auto xg = pattern<T, R>(xs, 1), wg = pattern<T, R>(ws, 2), dyg = pattern<T, R>(ys, 4);
  const auto bg = pattern<T, 1>({co}, 3);
  X x = scatter<X>(xg, mesh, splits);

  nn::ConvOp<T, S> op(spec, ci, co, "conv");
  op.set_overlap(overlap);
  const X y = op.forward(x, wg, bg.data());
  std::fill_n(x.local().data(), x.local().numel(), std::numeric_limits<T>::quiet_NaN());
  // The output is sharded like the input, in the blocks each rank owns.
  const X dy = scatter<X>(dyg, mesh, y.layout().blocks);
  auto dw = Tensor<T, R>(ws);
  auto db = Tensor<T, 1>(Shape<1>{co});
  const X dx = op.template backward<true>(dy, wg, dw, db.data());
  CHECK(dx.layout().global == x.layout().global);
  CHECK(dx.layout().blocks == x.layout().blocks);
  CHECK(dx.local().shape() == x.local().shape());

  std::vector<double> yr(static_cast<std::size_t>(numel(ys))), dxr(static_cast<std::size_t>(numel(xs)), 0.0),
      dwr(static_cast<std::size_t>(numel(ws)), 0.0), dbr(static_cast<std::size_t>(co), 0.0);
  ref.each([&](int64_t yo, int64_t xi, int64_t wi) {
    yr[yo] += static_cast<double>(xg.data()[xi]) * wg.data()[wi];
    dxr[xi] += static_cast<double>(dyg.data()[yo]) * wg.data()[wi];
    dwr[wi] += static_cast<double>(dyg.data()[yo]) * xg.data()[xi];
  });
  const int64_t cells = numel(ys) / (n * co);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t c = 0; c < co; ++c)
      for (int64_t o = 0; o < cells; ++o) {
        yr[(b * co + c) * cells + o] += bg.data()[c];
        dbr[c] += dyg.data()[(b * co + c) * cells + o];
      }
  const auto yf = y.full_tensor(), dxf = dx.full_tensor();
  REQUIRE(yf.shape() == ys);
  const auto dws = summed(dw, mesh), dbs = summed(db, mesh);
  auto list = [](const auto& v) {
    std::string r;
    for (auto e : v) r += std::to_string(e) + " ";
    return r;
  };
  INFO("spec ", nn::to_string(spec), ", image ", dtensor::to_string(xs), ", mesh ", list(mesh.shape()), ", blocks ",
       list(x.layout().blocks[2]), ", out blocks ", list(y.layout().blocks[2]));
  CHECK(rel_diff(yf.data(), yr) < tol);
  CHECK(rel_diff(dxf.data(), dxr) < tol);
  CHECK(rel_diff(dws.data(), dwr) < tol);
  CHECK(rel_diff(dbs.data(), dbr) < tol);
  return op.halo().has_ghosts();
}

}  // namespace

TEST_CASE("conv2d sweep on 1-D meshes over H: sizes, kernels, strides, padding, dilation, groups") {
  using X = DTensor<double, 4, Shard<2>>;
  for (int ranks : {2, 3, 4})
    spmd(ranks, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {ranks});
      int cases = 0;
      for (int64_t size : {16, 15, 63})
        for (int64_t k : {1, 2, 3, 5, 7})
          for (int64_t s : {1, 2})
            for (int pad : {0, 1, 2})  // 2: "same"
              for (int64_t d : {1, 2})
                for (int64_t groups : {1, 2}) {  // 2 channels: groups 2 is depthwise
                  // A third of the product, chosen by a fixed stride through it, on
                  // each mesh (a different third per mesh size): every value of every
                  // parameter is met on every mesh.
                  if ((size + 3 * k + 5 * s + 7 * pad + 11 * d + 13 * groups + ranks) % 3 != 0) continue;
                  nn::ConvSpec<2> spec;
                  spec.kernel = {k, 3}, spec.stride = {s, 1}, spec.dilation = {d, 1}, spec.groups = groups;
                  spec.padding = {pad == 2 ? 0 : pad, 1}, spec.same = pad == 2;
                  if (spec.window(0, size).out_extent(size) < 1) continue;
                  check_conv<X, 2>(mesh, spec, 2, 2, groups == 2 ? 2 : 3, {size, 5}, {}, 1e-12, cases % 2 == 0);
                  ++cases;
                }
      CHECK(cases > 100);
    });
}

TEST_CASE("conv2d on a 2x2 mesh over H and W, and over batch and H; float") {
  nn::ConvSpec<2> k3 = nn::ConvSpec<2>::square(3, 1, 1), k5s2 = nn::ConvSpec<2>::square(5, 2, 2),
                  k2s2 = nn::ConvSpec<2>::square(2, 2, 0), k3d2 = nn::ConvSpec<2>::square_same(3);
  k3d2.dilation = {2, 2};
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    for (const auto& spec : {k3, k5s2, k2s2, k3d2}) {
      check_conv<DTensor<double, 4, Shard<2>, Shard<3>>, 2>(mesh, spec, 2, 3, 4, {15, 16}, {}, 1e-12);
      check_conv<DTensor<double, 4, Shard<2>, Shard<3>>, 2>(mesh, spec, 1, 2, 2, {16, 63}, {}, 1e-12);
      check_conv<DTensor<double, 4, Shard<0>, Shard<2>>, 2>(mesh, spec, 3, 2, 3, {15, 9}, {}, 1e-12);
      check_conv<DTensor<float, 4, Shard<2>, Shard<3>>, 2>(mesh, spec, 2, 3, 4, {15, 16}, {}, 1e-5);
    }
  });
}

TEST_CASE("explicit uneven blocks: one thinner than the halo, one empty") {
  spmd(4, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {4});
    using X = DTensor<double, 4, Shard<2>>;
    Splits<4> thin{}, empty{};
    thin[2] = {1, 9, 2, 4};   // a 5x5 kernel reaches 2 cells: block 0 and 2 are thinner
    empty[2] = {6, 0, 5, 5};  // block 1 holds nothing and computes nothing
    // (1x1: no ghosts, so the empty block's padded storage is empty too)
    for (const auto& spec : {nn::ConvSpec<2>::square(5, 1, 2), nn::ConvSpec<2>::square(3, 2, 1),
                             nn::ConvSpec<2>::square_same(7), nn::ConvSpec<2>::square(1)}) {
      check_conv<X, 2>(mesh, spec, 2, 2, 3, {16, 6}, thin, 1e-12);
      check_conv<X, 2>(mesh, spec, 2, 2, 3, {16, 6}, empty, 1e-12);
    }
  });
}

TEST_CASE("conv1d on 1-D meshes, conv3d on a 2x2 mesh over D and H") {
  for (int ranks : {1, 2, 3})
    spmd(ranks, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {ranks});
      for (const auto& spec : {nn::ConvSpec<1>::square(3, 1, 1), nn::ConvSpec<1>::square(4, 2, 1)})
        check_conv<DTensor<double, 3, Shard<2>>, 1>(mesh, spec, 2, 3, 2, {17}, {}, 1e-12);
    });
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    for (const auto& spec : {nn::ConvSpec<3>::square(3, 1, 1), nn::ConvSpec<3>::square(3, 2, 0)})
      check_conv<DTensor<double, 5, Shard<2>, Shard<3>>, 3>(mesh, spec, 1, 2, 2, {7, 9, 5}, {}, 1e-12);
  });
}

TEST_CASE("bad input: a kernel larger than the image, mismatched channels: an error on every rank") {
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {2});
    using X = DTensor<double, 4, Shard<2>>;
    const X x = scatter<X>(pattern<double, 4>({1, 2, 5, 5}, 1), mesh, {});
    const auto w7 = pattern<double, 4>({2, 2, 7, 7}, 2), w3 = pattern<double, 4>({2, 2, 3, 3}, 2);
    nn::ConvOp<double, 2> big(nn::ConvSpec<2>::square(7), 2, 2, "conv2d");
    CHECK_THROWS_WITH_AS(big.forward(x, w7, nullptr), doctest::Contains("larger than the input"), InvalidArgument);
    nn::ConvOp<double, 2> wrong(nn::ConvSpec<2>::square(3), 3, 2, "conv2d");
    CHECK_THROWS_WITH_AS(wrong.forward(x, w3, nullptr), doctest::Contains("channels"), InvalidArgument);
    nn::ConvOp<double, 2> fine(nn::ConvSpec<2>::square(3), 2, 2, "conv2d");
    CHECK_THROWS_WITH_AS(fine.forward(x, w7, nullptr), doctest::Contains("weight block"), InvalidArgument);
  });
}

TEST_CASE("a gradient in the wrong blocks is refused on every rank, before the halo exchange") {
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {3});
    using X = DTensor<double, 4, Shard<2>>;
    Splits<4> s{};
    s[2] = {2, 6, 4};
    const X x = scatter<X>(pattern<double, 4>({1, 1, 12, 3}, 1), mesh, s);
    const auto w = pattern<double, 4>({1, 1, 3, 3}, 2);
    nn::ConvOp<double, 2> op(nn::ConvSpec<2>::square_same(3), 1, 1, "conv2d");
    const X y = op.forward(x, w, nullptr);
    // The chunk rule's 4 | 4 | 4 instead of the output's 2 | 6 | 4: rank 2's block has
    // the right shape, and must refuse it all the same.
    const X dy = scatter<X>(pattern<double, 4>(y.shape(), 3), mesh, {});
    auto dw = Tensor<double, 4>(op.weight_shape());
    CHECK_THROWS_WITH_AS(op.template backward<true>(dy, w, dw, nullptr), doctest::Contains("not laid out like"),
                         InvalidArgument);
  });
}

TEST_CASE("an op fed the same layout under other placements plans its halo again") {
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    const auto xg = pattern<double, 4>({1, 1, 9, 5}, 1);
    const auto w = pattern<double, 4>({1, 1, 3, 3}, 2);
    using A = DTensor<double, 4, Shard<2>, Replicate>;
    using B = DTensor<double, 4, Replicate, Shard<2>>;
    nn::ConvOp<double, 2> reused(nn::ConvSpec<2>::square_same(3), 1, 1, "conv2d");
    (void)reused.forward(scatter<A>(xg, mesh, {}), w, nullptr);
    const auto yb = reused.forward(scatter<B>(xg, mesh, {}), w, nullptr).full_tensor();
    nn::ConvOp<double, 2> fresh(nn::ConvSpec<2>::square_same(3), 1, 1, "conv2d");
    const auto yf = fresh.forward(scatter<B>(xg, mesh, {}), w, nullptr).full_tensor();
    CHECK(max_abs_diff(yb, yf) == 0);
  });
}

TEST_CASE("windows that reach no ghost read the block in place: one rank, the batch sharded, 1x1 kernels") {
  // Padding on a dim that is not split (no dim split, a mesh dim of one rank, or only
  // the batch sharded) is implicit; a 1x1 kernel (any stride) reads no neighbour's
  // cell. Float goes through oneDNN's padding, double through dtensor's own loops;
  // uneven batch and H blocks; 1-D and 2-D meshes.
  const auto k3 = nn::ConvSpec<2>::square(3, 1, 1), k5s2 = nn::ConvSpec<2>::square(5, 2, 2),
             k3same = nn::ConvSpec<2>::square_same(3), k1s2 = nn::ConvSpec<2>::square(1, 2, 0);
  spmd(1, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {1});
    for (const auto& spec : {k3, k5s2, k3same, k1s2}) {
      CHECK_FALSE(check_conv<DTensor<float, 4, Shard<2>>, 2>(mesh, spec, 2, 3, 16, {15, 9}, {}, 1e-5));
      CHECK_FALSE(check_conv<DTensor<double, 4, Replicate>, 2>(mesh, spec, 2, 3, 4, {15, 9}, {}, 1e-12));
    }
    CHECK_FALSE(check_conv<DTensor<float, 3, Shard<2>>, 1>(mesh, nn::ConvSpec<1>::square(3, 1, 1), 2, 16, 16, {17},
                                                           {}, 1e-5));
  });
  for (int ranks : {2, 3})
    spmd(ranks, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {ranks});
      Splits<4> batch{}, rows{};
      batch[0] = ranks == 2 ? std::vector<int64_t>{4, 1} : std::vector<int64_t>{2, 0, 3};
      rows[2] = ranks == 2 ? std::vector<int64_t>{9, 6} : std::vector<int64_t>{7, 1, 7};
      for (const auto& spec : {k3, k5s2, k3same}) {
        CHECK_FALSE(check_conv<DTensor<float, 4, Shard<0>>, 2>(mesh, spec, 5, 3, 16, {15, 9}, batch, 1e-5));
        CHECK_FALSE(check_conv<DTensor<double, 4, Shard<0>>, 2>(mesh, spec, 5, 2, 3, {15, 9}, {}, 1e-12));
      }
      // 1x1 over split rows: even with stride 2 on uneven blocks, no window leaves its block.
      CHECK_FALSE(check_conv<DTensor<float, 4, Shard<2>>, 2>(mesh, nn::ConvSpec<2>::square(1), 2, 16, 16, {15, 9},
                                                             rows, 1e-5));
      CHECK_FALSE(check_conv<DTensor<double, 4, Shard<2>>, 2>(mesh, k1s2, 2, 3, 4, {15, 9}, rows, 1e-12));
      // And the padded path beside it, on the same blocks.
      CHECK(check_conv<DTensor<float, 4, Shard<2>>, 2>(mesh, k3, 2, 16, 16, {15, 9}, rows, 1e-5));
    });
  spmd(4, [&](Comm& comm) {
    // 2x2 over batch and W; 4x1 over H and W (W's mesh dim of one rank: H padded only).
    DeviceMesh<2> mesh(comm, {2, 2});
    for (const auto& spec : {k3, k5s2}) {
      CHECK_FALSE(check_conv<DTensor<float, 4, Shard<0>, Shard<0>>, 2>(mesh, spec, 5, 3, 16, {15, 9}, {}, 1e-5));
      CHECK(check_conv<DTensor<float, 4, Shard<0>, Shard<3>>, 2>(mesh, spec, 5, 3, 16, {15, 9}, {}, 1e-5));
    }
    CHECK_FALSE(check_conv<DTensor<double, 4, Shard<2>, Shard<3>>, 2>(mesh, k1s2, 2, 3, 4, {15, 9}, {}, 1e-12));
    DeviceMesh<2> column(comm, {4, 1});
    using XC = DTensor<float, 4, Shard<2>, Shard<3>>;
    for (const auto& spec : {k3, k5s2, k3same})
      CHECK(check_conv<XC, 2>(column, spec, 2, 3, 16, {15, 9}, {}, 1e-5));
    const XC x = scatter<XC>(pattern<float, 4>({2, 3, 15, 9}, 1), column, {});
    const WindowDim w3{3, 1, 1, 1, 1};
    const WindowHalo<float, 4> wh(column, XC::placement_state, x.layout(), {w3, w3}, "conv2d");
    CHECK(wh.padded_shape()[2] == x.local().shape()[2] + 2);  // H: a ghost row each side
    CHECK(wh.padded_shape()[3] == 9);                         // W: its padding implicit
  });
}

TEST_CASE("release_saved drops the kept input: the backward then asks for a forward") {
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {2});
    using X = DTensor<float, 4, Shard<2>>;
    const auto xg = pattern<float, 4>({1, 2, 8, 5}, 1);
    for (const auto& spec : {nn::ConvSpec<2>::square(3, 1, 1), nn::ConvSpec<2>::square(1)}) {  // ghosts, none
      nn::ConvOp<float, 2> op(spec, 2, 2, "conv");
      const auto wg = pattern<float, 4>(op.weight_shape(), 2);
      const X x = scatter<X>(xg, mesh, {});
      const X y = op.forward(x, wg, nullptr);
      op.release_saved();
      Tensor<float, 4> dw(wg.shape());
      CHECK_THROWS_WITH_AS(op.backward<true>(y, wg, dw, nullptr), doctest::Contains("backward without a forward"),
                           InvalidArgument);
      (void)op.forward(x, wg, nullptr);  // and a forward keeps it again
      CHECK_NOTHROW(op.backward<false>(y, wg, dw, nullptr));
    }
  });
}
