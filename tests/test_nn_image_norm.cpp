// BatchNorm and GroupNorm on images sharded in batch and space, against a
// single-rank two-pass computation written out below and, on tiny cases, against
// central finite differences: 1-D meshes of 1 to 4 ranks over H, 2x2 over H and W,
// DP x H, a mesh dim that replicates the image, uneven sizes (H 15 and 7, W 9 and 5,
// a batch of 3 over 2 ranks), explicit blocks with an empty one, NCW and NCDHW;
// double to 1e-12 and float to 1e-5 (relative to the largest reference value).
// BatchNorm also: running statistics after two steps, and evaluation.
#include <algorithm>
#include <cmath>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>
#include <dtensor/nn/image/batch_norm.hpp>
#include <dtensor/nn/image/conv.hpp>
#include <dtensor/nn/image/group_norm.hpp>

#include "compare.hpp"
#include "nn_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

using Vec = std::vector<double>;
constexpr int64_t kC = 4, kG = 2;
constexpr double kEps = 1e-5;

// ---- the reference: one rank, the whole batch as [N, C, S] (S: the image's cells) ----

struct Ref {
  Vec y, dx, dw, db, mean, var;  // mean and var per statistics set (biased var)
};

// groups == 0: batch norm (a set per channel: the batch and the image); else group
// norm (a set per sample and group: the group's channels and the image). Given
// mean and var (evaluation) are used as they are; otherwise two passes compute them.
Ref reference(const Vec& x, const Vec& dy, const Vec& w, const Vec& b, int64_t N, int64_t C, int64_t S,
              int64_t groups, const Vec* mean_in = nullptr, const Vec* var_in = nullptr) {
  const int64_t sets = groups ? N * groups : C;
  auto set_of = [&](int64_t n, int64_t c) { return groups ? n * groups + c / (C / groups) : c; };
  auto at = [&](int64_t n, int64_t c, int64_t s) { return (n * C + c) * S + s; };
  Ref r;
  Vec count(sets, 0.0);
  r.mean.assign(sets, 0.0), r.var.assign(sets, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < S; ++s) r.mean[set_of(n, c)] += x[at(n, c, s)], count[set_of(n, c)] += 1;
  for (int64_t i = 0; i < sets; ++i) r.mean[i] /= count[i];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < S; ++s) {
        const double d = x[at(n, c, s)] - r.mean[set_of(n, c)];
        r.var[set_of(n, c)] += d * d;
      }
  for (int64_t i = 0; i < sets; ++i) r.var[i] /= count[i];
  const Vec& mean = mean_in ? *mean_in : r.mean;
  const Vec& var = var_in ? *var_in : r.var;
  Vec xhat(x.size()), inv(sets), s1(sets, 0.0), s2(sets, 0.0);
  for (int64_t i = 0; i < sets; ++i) inv[i] = 1 / std::sqrt(var[i] + kEps);
  r.y.resize(x.size()), r.dx.resize(x.size()), r.dw.assign(C, 0.0), r.db.assign(C, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t k = at(n, c, s), i = set_of(n, c);
        xhat[k] = (x[k] - mean[i]) * inv[i];
        r.y[k] = xhat[k] * w[c] + b[c];
        r.dw[c] += dy[k] * xhat[k], r.db[c] += dy[k];
        s1[i] += dy[k] * w[c], s2[i] += dy[k] * w[c] * xhat[k];
      }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t k = at(n, c, s), i = set_of(n, c);
        r.dx[k] = mean_in ? dy[k] * w[c] * inv[i]
                          : inv[i] * (dy[k] * w[c] - s1[i] / count[i] - xhat[k] * s2[i] / count[i]);
      }
  return r;
}

double rel_err(const Vec& a, const Vec& b) {
  REQUIRE(a.size() == b.size());
  return max_rel_diff(a, b);
}

template <class T, int R>
Vec values(const Tensor<T, R>& t) {
  return Vec(t.data(), t.data() + t.numel());
}

// ---- the distributed side ----

template <class L>
constexpr bool is_batch_norm = requires(L& l) { l.train(false); };

template <class L>
constexpr int64_t groups_of() {
  if constexpr (is_batch_norm<L>) return 0;
  else return kG;
}

// The output gradient's placements: the activation's, or Partial<Sum> on the mesh
// dims that replicate it (the gradient of a loss computed on every replica).
template <class Cfg, bool PartialDy>
constexpr typename Cfg::State dy_state() {
  auto s = Cfg::activation();
  if (PartialDy)
    for (auto& p : s)
      if (!p.is_shard()) p = nn::partial_sum();
  return s;
}

// An image whose channel c has mean about 2c - 3 and spread 1 + c/4 (cancellation to
// survive); element i depends on (seed, i) only.
template <class DT>
DT image(const Shape<DT::rank>& shape, const typename DT::Mesh& mesh, const Splits<DT::rank>& splits, uint64_t seed) {
  int64_t cells = 1;
  for (int d = 2; d < DT::rank; ++d) cells *= shape[d];
  const int64_t channels = shape[1];
  return dtensor::detail::generate<DT>(shape, mesh, splits, [&](uint64_t i) {
    const double c = static_cast<double>((static_cast<int64_t>(i) / cells) % channels);
    return dtensor::detail::normal_value<double>(seed, i) * (1 + c / 4) + 2 * c - 3;
  });
}

// One training (or evaluation) step of Sequential<L> checked against the reference;
// returns the reference (for the running statistics).
template <class Model, class L, class Gr, int M>
Ref check_step(Model& model, const DeviceMesh<M>& mesh, const Shape<L::Rank>& shape, const Splits<L::Rank>& splits,
               uint64_t seed, bool training) {
  using T = typename L::T;
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  auto& l = model.template layer<0>();
  auto x = image<typename Model::InputT>(shape, mesh, splits, seed);
  auto dy = image<Gr>(shape, mesh, splits, seed + 100);
  Vec rm, rv;
  if constexpr (is_batch_norm<L>) rm = values(l.running_mean().local()), rv = values(l.running_var().local());
  model.zero_grad();
  CommCounter counter;
  auto y = model.forward(x);
  const int forward_collectives = counter.count();
  auto dx = model.template backward<true>(dy);
  static constexpr auto plan = Model::plan(Gr::placement_state, kC, true);
  const int planned = plan.step_collectives(model.bucket_bytes(), sizeof(T), mesh.shape(), mesh.coords());
  if (training) {
    CHECK(forward_collectives == plan.count(nn::Phase::Forward));
    CHECK(counter.count() == planned);
  } else {  // evaluation: the forward needs no statistics
    CHECK(forward_collectives == 0);
    CHECK(counter.count() == planned - plan.count(nn::Phase::Forward));
  }
  // dx is placed like dy, in x's blocks.
  static_assert(std::decay_t<decltype(dx)>::placement_state == Gr::placement_state);
  CHECK(dx.layout().global == x.layout().global);
  CHECK(dx.layout().blocks == x.layout().blocks);

  const int64_t N = shape[0], S = numel(shape) / (shape[0] * shape[1]);
  const Vec w = values(l.weight().value().local()), b = values(l.bias().value().local());
  const Vec X = values(x.full_tensor()), DY = values(dy.full_tensor());
  Ref r = training ? reference(X, DY, w, b, N, kC, S, groups_of<L>())
                   : reference(X, DY, w, b, N, kC, S, 0, &rm, &rv);
  CHECK(rel_err(values(y.full_tensor()), r.y) < tol);
  CHECK(rel_err(values(dx.full_tensor()), r.dx) < tol);
  // The model has reduced every gradient: each rank holds the whole of it.
  CHECK(rel_err(values(l.weight().grad()), r.dw) < tol);
  CHECK(rel_err(values(l.bias().grad()), r.db) < tol);
  return r;
}

template <class L, bool PartialDy = false, int M>
void check_layer(Comm& comm, const std::array<int, M>& mesh_shape, const Shape<L::Rank>& shape,
                 const Splits<L::Rank>& splits = {}) {
  using Cfg = typename L::config;
  using T = typename L::T;
  using Model = nn::Sequential<L>;
  using Gr = dtensor_t<T, L::Rank, placements_t<dy_state<Cfg, PartialDy>()>>;
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  DeviceMesh<M> mesh(comm, mesh_shape);
  Model model{L(mesh)};
  auto& l = model.template layer<0>();
  for (int64_t c = 0; c < kC; ++c) {  // the same on every rank: the parameters are replicated
    l.weight().value().local().data()[c] = static_cast<T>(1 + 0.25 * static_cast<double>(c));
    l.bias().value().local().data()[c] = static_cast<T>(0.1 * static_cast<double>(c) - 0.2);
  }
  const Ref r1 = check_step<Model, L, Gr>(model, mesh, shape, splits, 1, true);
  if constexpr (is_batch_norm<L>) {
    // The second step's sums are taken about the first batch's means.
    const Ref r2 = check_step<Model, L, Gr>(model, mesh, shape, splits, 2, true);
    const double k = static_cast<double>(numel(shape) / shape[1]);
    Vec rm(kC), rv(kC);
    for (int64_t c = 0; c < kC; ++c) {
      rm[c] = 0.9 * (0.1 * r1.mean[c]) + 0.1 * r2.mean[c];
      rv[c] = 0.9 * (0.9 + 0.1 * r1.var[c] * k / (k - 1)) + 0.1 * r2.var[c] * k / (k - 1);
    }
    CHECK(rel_err(values(l.running_mean().local()), rm) < tol);
    CHECK(rel_err(values(l.running_var().local()), rv) < tol);
    CHECK(l.num_batches_tracked() == 2);
    l.train(false);
    const Vec before = values(l.running_var().local());
    check_step<Model, L, Gr>(model, mesh, shape, splits, 3, false);
    CHECK(values(l.running_var().local()) == before);  // evaluation leaves them
    CHECK(l.num_batches_tracked() == 2);
  }
}

template <class T, int M, int DP, int... D>
using Img = nn::ImageConfig<T, static_cast<int>(sizeof...(D)), nn::DomainAxes<M, DP, D...>>;

template <class Cfg>
using BN = nn::BatchNorm<Cfg, kC>;
template <class Cfg>
using GN = nn::GroupNorm<Cfg, kC, kG>;

// Both layers, one mesh.
template <class Cfg, bool PartialDy = false, int M>
void check_both(Comm& comm, const std::array<int, M>& mesh_shape, const Shape<Cfg::rank>& shape,
                const Splits<Cfg::rank>& splits = {}) {
  check_layer<BN<Cfg>, PartialDy, M>(comm, mesh_shape, shape, splits);
  check_layer<GN<Cfg>, PartialDy, M>(comm, mesh_shape, shape, splits);
}

// ---- the plans, at compile time ----

using H1 = Img<double, 1, nn::kNone, 0, nn::kNone>;          // H over a 1-D mesh
using HW = Img<double, 2, nn::kNone, 0, 1>;                   // H and W over 2x2
using DpH = Img<double, 2, 0, 1, nn::kNone>;                  // the batch over dim 0, H over dim 1
using HRep = Img<double, 2, nn::kNone, 0, nn::kNone>;         // H over dim 0; dim 1 replicates
using DpRepH = Img<double, 3, 0, 2, nn::kNone>;               // dims 0 and 2 shard, dim 1 replicates

template <class L, class Cfg = typename L::config>
constexpr auto plan_of(bool partial_dy = false, bool input_grad = true) {
  auto g = Cfg::activation();
  if (partial_dy)
    for (auto& p : g)
      if (!p.is_shard()) p = nn::partial_sum();
  return nn::Sequential<L>::plan(g, kC, input_grad);
}

// BatchNorm: one all-reduce of 2C values forward and one backward, over the mesh dim
// (1-D) or the whole mesh (2-D sharded on both), and no gradient reduction.
static_assert(plan_of<BN<H1>>().count(nn::Phase::Forward, StepKind::AllReduce, 0) == 1);
static_assert(plan_of<BN<H1>>().count(nn::Phase::Backward, StepKind::AllReduce, 0) == 1);
static_assert(plan_of<BN<H1>>().count(nn::Phase::GradReduce) == 0);
// The statistics travel in double, also for float, with the 4 values of the shape
// agreement check (comm/agreement.hpp).
static_assert(plan_of<BN<H1>>().bytes<double>(nn::Phase::Forward, 1000, {4}) == (2 * kC + 4) * 8);
static_assert(plan_of<BN<Img<float, 1, nn::kNone, 0, nn::kNone>>>().bytes<float>(nn::Phase::Forward, 1000, {4}) ==
              (2 * kC + 4) * 8);
static_assert(plan_of<BN<HW>>().count(nn::Phase::Forward, StepKind::AllReduce, -1) == 1 &&
              plan_of<BN<HW>>().count(nn::Phase::Forward) == 1);
static_assert(plan_of<BN<DpH>>().count(nn::Phase::Backward, StepKind::AllReduce, -1) == 1 &&
              plan_of<BN<DpH>>().count(nn::Phase::GradReduce) == 0);
// Without dx the backward still sums the parameters' gradients.
static_assert(plan_of<BN<DpH>>(false, false).count(nn::Phase::Backward) == 1);
// A replicating mesh dim takes no part in the statistics; a Partial dy there leaves
// the parameters' gradients Partial, reduced by the model.
static_assert(plan_of<BN<HRep>>().count(nn::Phase::Forward, StepKind::AllReduce, 0) == 1 &&
              plan_of<BN<HRep>>().count(nn::Phase::Forward) == 1);
static_assert(plan_of<BN<HRep>>(true).count(nn::Phase::GradReduce, StepKind::AllReduce, 1) == 2);
// Sharded on two mesh dims of three: one all-reduce per mesh dim.
static_assert(plan_of<BN<DpRepH>>().count(nn::Phase::Forward, StepKind::AllReduce, 0) == 1 &&
              plan_of<BN<DpRepH>>().count(nn::Phase::Forward, StepKind::AllReduce, 2) == 1 &&
              plan_of<BN<DpRepH>>().count(nn::Phase::Forward) == 2);
// GroupNorm: statistics over the domain dims only; the parameters' gradients are
// Partial over DP and domain dims, reduced by the model; no dx, no backward collective.
static_assert(plan_of<GN<DpH>>().count(nn::Phase::Forward, StepKind::AllReduce, 1) == 1 &&
              plan_of<GN<DpH>>().count(nn::Phase::Forward) == 1);
static_assert(plan_of<GN<DpH>>().count(nn::Phase::Backward, StepKind::AllReduce, 1) == 1);
static_assert(plan_of<GN<DpH>>(false, false).count(nn::Phase::Backward) == 0);
static_assert(plan_of<GN<DpH>>().count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 2 &&
              plan_of<GN<DpH>>().count(nn::Phase::GradReduce, StepKind::AllReduce, 1) == 2);
static_assert(plan_of<GN<HW>>().count(nn::Phase::Forward, StepKind::AllReduce, -1) == 1);
static_assert(plan_of<GN<Img<double, 2, 0, nn::kNone, nn::kNone>>>().count(nn::Phase::Forward) == 0);

// ---- finite differences ----

// d/dp of sum(reference y * dy), by central differences, for every entry of p.
template <class F>
Vec numeric_grad(Vec p, const F& loss) {
  Vec g(p.size());
  const double h = 1e-6;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double v = p[i];
    p[i] = v + h;
    const double up = loss(p);
    p[i] = v - h;
    const double down = loss(p);
    p[i] = v;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

template <class L>
void check_finite_differences(Comm& comm, const Shape<4>& shape) {
  DeviceMesh<2> mesh(comm, {2, 2});
  L l(mesh);
  for (int64_t c = 0; c < kC; ++c) l.weight().value().local().data()[c] = 0.5 + 0.3 * static_cast<double>(c);
  for (int64_t c = 0; c < kC; ++c) l.bias().value().local().data()[c] = 0.2 * static_cast<double>(c);
  auto x = image<typename L::InputT>(shape, mesh, {}, 7);
  auto dy = image<typename L::InputT>(shape, mesh, {}, 8);
  l.forward(x);
  auto dx = l.template backward<true>(dy);
  const int64_t N = shape[0], S = shape[2] * shape[3], G = groups_of<L>();
  const Vec X = values(x.full_tensor()), DY = values(dy.full_tensor());
  const Vec W = values(l.weight().value().local()), B = values(l.bias().value().local());
  auto loss = [&](const Vec& xv, const Vec& wv, const Vec& bv) {
    const Vec y = reference(xv, DY, wv, bv, N, kC, S, G).y;
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * DY[i];
    return s;
  };
  const Vec fx = numeric_grad(X, [&](const Vec& p) { return loss(p, W, B); });
  const Vec fw = numeric_grad(W, [&](const Vec& p) { return loss(X, p, B); });
  const Vec fb = numeric_grad(B, [&](const Vec& p) { return loss(X, W, p); });
  CHECK(rel_err(values(dx.full_tensor()), fx) < 1e-6);
  // GroupNorm's parameter gradients are this rank's terms: sum them here.
  auto reduced = [&](Tensor<double, 1> g) {
    if (!is_batch_norm<L>) all_reduce_values(mesh.comm(), g.data(), static_cast<std::size_t>(g.numel()), ReduceOp::Sum);
    return values(g);
  };
  CHECK(rel_err(reduced(l.weight().grad()), fw) < 1e-6);
  CHECK(rel_err(reduced(l.bias().grad()), fb) < 1e-6);
}

// A strided convolution, BatchNorm and GroupNorm in one model on a 2x2 mesh over H
// and W, against the same model on one rank: the norms take the convolution's
// output blocks (H 15 = 8 | 7 gives 4 | 4), and GroupNorm's gradients join the
// convolution's in the model's reduction.
using ConvNorms = nn::Sequential<nn::Conv<HW, 3, kC, nn::ConvSpec<2>::square(3, 2, 1)>, BN<HW>, GN<HW>>;

struct StepResult {
  Vec y, dx;
  std::vector<Vec> grads;
  std::vector<int64_t> h_blocks;
  bool on_plan = false;
};

StepResult conv_norms_step(const DeviceMesh<2>& mesh) {
  ConvNorms model{nn::Conv<HW, 3, kC, nn::ConvSpec<2>::square(3, 2, 1)>(mesh, {5}), BN<HW>(mesh), GN<HW>(mesh)};
  auto x = image<ConvNorms::InputT>({3, 3, 15, 9}, mesh, {}, 11);
  model.zero_grad();
  CommCounter counter;
  auto y = model.forward(x);
  auto dy = image<ConvNorms::OutputT>(y.shape(), mesh, y.layout().blocks, 12);
  auto dx = model.backward<true>(dy);
  static constexpr auto plan = ConvNorms::plan(ConvNorms::output_placements, 3, true);
  StepResult r;
  r.on_plan = counter.count() == plan.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords());
  r.y = values(y.full_tensor()), r.dx = values(dx.full_tensor());
  model.for_each_parameter([&](auto& p) { r.grads.push_back(values(p.grad())); });
  r.h_blocks = y.layout().blocks[2];
  return r;
}

}  // namespace

TEST_CASE("BatchNorm and GroupNorm after a strided convolution in nn::Sequential, against one rank") {
  spmd(4, [&](Comm& comm) {
    auto self = comm.split(comm.rank(), 0);
    const StepResult ref = conv_norms_step(DeviceMesh<2>(*self, {1, 1}));
    const StepResult got = conv_norms_step(DeviceMesh<2>(comm, {2, 2}));
    CHECK(got.h_blocks == std::vector<int64_t>{4, 4});
    CHECK(got.on_plan);
    CHECK(rel_err(got.y, ref.y) < 1e-12);
    CHECK(rel_err(got.dx, ref.dx) < 1e-12);
    REQUIRE(got.grads.size() == ref.grads.size());
    // The convolution's bias shifts whole channels, which BatchNorm takes out: its
    // gradient is 0 up to rounding, compared in absolute terms.
    auto max_abs = [](const Vec& v) {
      double m = 0;
      for (double e : v) m = worst_of(m, std::abs(e));
      return m;
    };
    CHECK(max_abs(ref.grads[1]) < 1e-12);
    CHECK(max_abs(got.grads[1]) < 1e-12);
    for (std::size_t i = 0; i < got.grads.size(); ++i)
      if (i != 1) CHECK(rel_err(got.grads[i], ref.grads[i]) < 1e-12);
  });
}

TEST_CASE("BatchNorm and GroupNorm, H sharded over 1-D meshes of 1 to 4 ranks") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [&](Comm& comm) {
      check_both<H1, false, 1>(comm, {n}, {3, kC, 15, 9});
      check_both<H1, false, 1>(comm, {n}, {2, kC, 7, 5});
    });
  for (int n : {2, 3})
    spmd(n, [&](Comm& comm) { check_both<Img<float, 1, nn::kNone, 0, nn::kNone>, false, 1>(comm, {n}, {3, kC, 15, 9}); });
}

TEST_CASE("BatchNorm and GroupNorm on 2x2 meshes: H x W, DP x H, and H with a replicating mesh dim") {
  spmd(4, [&](Comm& comm) {
    check_both<HW, false, 2>(comm, {2, 2}, {3, kC, 15, 9});
    check_both<HW, false, 2>(comm, {2, 2}, {2, kC, 7, 5});
    check_both<DpH, false, 2>(comm, {2, 2}, {3, kC, 15, 9});  // the batch 2 | 1
    check_both<HRep, false, 2>(comm, {2, 2}, {3, kC, 7, 5});
    check_both<HRep, true, 2>(comm, {2, 2}, {3, kC, 7, 5});   // dy Partial on the replicating dim
    check_both<DpRepH, false, 3>(comm, {2, 1, 2}, {3, kC, 7, 5});
    check_both<Img<float, 2, nn::kNone, 0, 1>, false, 2>(comm, {2, 2}, {3, kC, 15, 9});
    check_both<Img<float, 2, 0, 1, nn::kNone>, false, 2>(comm, {2, 2}, {3, kC, 15, 9});
  });
}

TEST_CASE("BatchNorm and GroupNorm on explicit uneven blocks, an empty one among them") {
  spmd(3, [&](Comm& comm) { check_both<H1, false, 1>(comm, {3}, {3, kC, 7, 5}, Splits<4>{{{}, {}, {4, 0, 3}, {}}}); });
  spmd(4, [&](Comm& comm) {
    check_both<HW, false, 2>(comm, {2, 2}, {2, kC, 7, 5}, Splits<4>{{{}, {}, {7, 0}, {1, 4}}});
    // A data-parallel group with no samples: its statistics buffers are empty.
    check_both<DpH, false, 2>(comm, {2, 2}, {3, kC, 7, 5}, Splits<4>{{{3, 0}, {}, {2, 5}, {}}});
  });
}

TEST_CASE("BatchNorm and GroupNorm over NCW and NCDHW images") {
  spmd(3, [&](Comm& comm) { check_both<Img<double, 1, nn::kNone, 0>, false, 1>(comm, {3}, {3, kC, 10}); });
  spmd(4, [&](Comm& comm) {
    check_both<Img<double, 2, nn::kNone, 0, 1, nn::kNone>, false, 2>(comm, {2, 2}, {2, kC, 5, 7, 3});
  });
}

TEST_CASE("BatchNorm and GroupNorm gradients against finite differences (2x2 over H and W)") {
  spmd(4, [&](Comm& comm) {
    check_finite_differences<BN<HW>>(comm, {2, kC, 3, 3});
    check_finite_differences<GN<HW>>(comm, {2, kC, 3, 3});
  });
}

TEST_CASE("BatchNorm and GroupNorm: clear errors on every rank") {
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {2});
    BN<H1> bn(mesh);
    GN<H1> gn(mesh);
    using X = BN<H1>::InputT;
    auto dy = image<X>({2, kC, 5, 3}, mesh, {}, 1);
    CHECK_THROWS_AS(bn.backward(dy), InvalidArgument);  // no forward
    CHECK_THROWS_AS(gn.backward(dy), InvalidArgument);
    auto wrong = image<X>({2, kC + 1, 5, 3}, mesh, {}, 1);
    CHECK_THROWS_AS(bn.forward(wrong), InvalidArgument);  // channels
    CHECK_THROWS_AS(gn.forward(wrong), InvalidArgument);
    // One value per channel cannot be normalized in training (PyTorch refuses too).
    auto single = image<X>({1, kC, 1, 1}, mesh, {}, 1);
    CHECK_THROWS_AS(bn.forward(single), InvalidArgument);
    bn.train(false);
    CHECK_NOTHROW(bn.forward(single));
    // A backward takes the gradient of the last forward's blocks.
    CHECK_THROWS_AS(bn.backward(dy), InvalidArgument);
  });
  // A gradient in other blocks than the forward's, which still fits rank 0's block
  // (7 rows: 3|3|1 forward by the chunk rule, 3|2|2 gradient): every rank refuses it by its layout
  // before the backward's all-reduce, rank 0 included.
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {3});
    BN<H1> bn(mesh);
    GN<H1> gn(mesh);
    using X = BN<H1>::InputT;
    const auto x = image<X>({2, kC, 7, 3}, mesh, {}, 1);
    const auto dy = image<X>({2, kC, 7, 3}, mesh, Splits<4>{{{}, {}, {3, 2, 2}, {}}}, 2);
    if (comm.rank() == 0) CHECK(dy.local().shape() == x.local().shape());
    bn.forward(x);
    CHECK_THROWS_WITH_AS(bn.backward(dy), doctest::Contains("is not laid out like the output of the last forward"),
                         InvalidArgument);
    gn.forward(x);
    CHECK_THROWS_WITH_AS(gn.backward(dy), doctest::Contains("is not laid out like the output of the last forward"),
                         InvalidArgument);
  });
}
