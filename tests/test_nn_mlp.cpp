// A tensor-parallel MLP (colwise -> GELU -> rowwise) and its data-parallel form,
// against the same network written with Eigen on one rank: outputs, every
// parameter's gradient and the input's gradient, on 1-D meshes of 1 to 4 ranks and on
// 2x2 and 2x3 (DP x TP) meshes, with feature counts that do not divide. The
// collectives each step issues are counted and compared with the model's constexpr plan.
#include <cmath>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>

#include "compare.hpp"
#include "nn_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

constexpr int64_t kIn = 5, kHidden = 7, kOut = 3;

template <class Cfg>
using MLP = nn::Sequential<nn::Linear<Cfg, kIn, kHidden, nn::Colwise>, nn::GELU<Cfg>,
                           nn::Linear<Cfg, kHidden, kOut, nn::Rowwise>>;

// The plan, checked by the compiler: PyTorch's pairwise MLP counts (one all-reduce
// forward; none in the backward when the input needs no gradient, one when it does).
using Cfg1 = nn::Config<double, 2, nn::Axes<1, nn::kNone, 0>>;
using Cfg2 = nn::Config<double, 2, nn::Axes<2, 0, 1>>;
static constexpr auto plan1 = MLP<Cfg1>::plan(MLP<Cfg1>::output_placements, kIn);
static_assert(plan1.count(nn::Phase::Forward) == 1 && plan1.count(nn::Phase::Forward, StepKind::AllReduce, 0) == 1);
static_assert(plan1.count(nn::Phase::Backward) == 0);
static_assert(plan1.count(nn::Phase::GradReduce) == 0);
static constexpr auto plan1_in = MLP<Cfg1>::plan(MLP<Cfg1>::output_placements, kIn, true);
static_assert(plan1_in.count(nn::Phase::Backward) == 0);  // the input's gradient stays Partial<Sum>
// DP x TP: the same, plus one gradient all-reduce over DP per parameter (4).
static constexpr auto plan2 = MLP<Cfg2>::plan(MLP<Cfg2>::output_placements, kIn);
static_assert(plan2.count(nn::Phase::Forward) == 1 && plan2.count(nn::Phase::Forward, StepKind::AllReduce, 1) == 1);
static_assert(plan2.count(nn::Phase::Backward) == 0);
static_assert(plan2.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 4);
// Bytes: the forward all-reduce moves this rank's [tokens / dp, kOut] block.
static_assert(plan2.bytes<double>(nn::Phase::Forward, 8, {2, 2}) == 8 / 2 * kOut * 8);

// Two colwise layers in a row: the model all-gathers between them (the second takes a
// Replicate input), and its backward all-reduces the second's Partial input gradient
// before the first (a Partial<Sum> gradient meeting a Shard output: reduce-scatter).
using TwoColwise = nn::Sequential<nn::Linear<Cfg1, kIn, kHidden, nn::Colwise>,
                                  nn::Linear<Cfg1, kHidden, kOut, nn::Colwise>>;
static constexpr auto plan_cc = TwoColwise::plan(TwoColwise::output_placements, kIn);
static_assert(plan_cc.count(nn::Phase::Forward) == 1 && plan_cc.count(nn::Phase::Forward, StepKind::AllGather) == 1);
static_assert(plan_cc.count(nn::Phase::Backward) == 1 &&
              plan_cc.count(nn::Phase::Backward, StepKind::ReduceScatter) == 1);

double gelu(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_grad(double x) {
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

struct Reference {
  Mat y, dw1, db1, dw2, db2, dx;
};
Reference reference(const Mat& x, const Mat& w1, const Mat& b1, const Mat& w2, const Mat& b2, const Mat& dy) {
  Reference r;
  Mat h = (x * w1).rowwise() + Eigen::Map<const Eigen::RowVectorXd>(b1.data(), b1.size());
  Mat a = h.unaryExpr([](double v) { return gelu(v); });
  r.y = (a * w2).rowwise() + Eigen::Map<const Eigen::RowVectorXd>(b2.data(), b2.size());
  r.db2 = dy.colwise().sum();
  r.dw2 = a.transpose() * dy;
  Mat da = dy * w2.transpose();
  Mat dh = da.cwiseProduct(h.unaryExpr([](double v) { return gelu_grad(v); }));
  r.dw1 = x.transpose() * dh;
  r.db1 = dh.colwise().sum();
  r.dx = dh * w1.transpose();
  return r;
}

template <class Cfg, int M>
void check_mlp(Comm& comm, const std::array<int, M>& shape, int64_t batch, std::size_t bucket_bytes) {
  DeviceMesh<M> mesh(comm, shape);
  using Model = MLP<Cfg>;
  Model model(nn::Linear<Cfg, kIn, kHidden, nn::Colwise>(mesh, {1}), nn::GELU<Cfg>(),
              nn::Linear<Cfg, kHidden, kOut, nn::Rowwise>(mesh, {2}));
  model.set_bucket_bytes(bucket_bytes);
  auto x = random<typename Model::InputT>({batch, kIn}, mesh, 11);
  auto dy = random<typename Model::OutputT>({batch, kOut}, mesh, 12);
  model.zero_grad();

  CommCounter fwd;
  auto y = model.forward(x);
  const auto fwd_records = fwd.records();
  CommCounter bwd;
  auto dx = model.template backward<true>(dy);
  static constexpr auto plan = Model::plan(Model::output_placements, kIn, true);
  CHECK(static_cast<int>(fwd_records.size()) == plan.count(nn::Phase::Forward));
  CHECK(static_cast<int>(fwd_records.size()) + bwd.count() == plan.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()));

  auto& l1 = model.template layer<0>();
  auto& l2 = model.template layer<2>();
  const Reference r = reference(as_mat(x.full_tensor()), as_mat(l1.weight().value().full_tensor()),
                                as_mat(l1.bias().value().full_tensor()), as_mat(l2.weight().value().full_tensor()),
                                as_mat(l2.bias().value().full_tensor()), as_mat(dy.full_tensor()));
  // Gradients are placed like their parameters after backward: wrap and gather.
  auto grad_of = [&](auto& p) {
    using DT = typename std::decay_t<decltype(p)>::dtensor_type;
    DT g(mesh, p.value().layout(), p.grad());
    return as_mat(g.full_tensor());
  };
  const double tol = 1e-12;
  CHECK(max_abs_diff(as_mat(y.full_tensor()), r.y) < tol);
  CHECK(max_abs_diff(grad_of(l1.weight()), r.dw1) < tol);
  CHECK(max_abs_diff(grad_of(l1.bias()), r.db1) < tol);
  CHECK(max_abs_diff(grad_of(l2.weight()), r.dw2) < tol);
  CHECK(max_abs_diff(grad_of(l2.bias()), r.db2) < tol);
  CHECK(max_abs_diff(as_mat(dx.full_tensor()), r.dx) < tol);
}

}  // namespace

TEST_CASE("MLP colwise -> GELU -> rowwise on 1-D meshes of 1 to 4 ranks equals the single-rank network") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [&](Comm& comm) { check_mlp<Cfg1, 1>(comm, {n}, 6, 1 << 20); });
}

TEST_CASE("two colwise layers: the inserted all-gather and its adjoint, against the reference") {
  for (int n : {2, 3})
    spmd(n, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {n});
      TwoColwise model(nn::Linear<Cfg1, kIn, kHidden, nn::Colwise>(mesh, {3}),
                       nn::Linear<Cfg1, kHidden, kOut, nn::Colwise>(mesh, {4}));
      auto x = random<TwoColwise::InputT>({4, kIn}, mesh, 5);
      auto dy = random<TwoColwise::OutputT>({4, kOut}, mesh, 6);
      model.zero_grad();
      CommCounter c;
      auto y = model.forward(x);
      model.backward(dy);
      CHECK(c.count(StepKind::AllGather) == 1);
      CHECK(c.count(StepKind::ReduceScatter) == 1);
      CHECK(c.count() == plan_cc.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()));
      auto& l1 = model.template layer<0>();
      auto& l2 = model.template layer<1>();
      const Mat X = as_mat(x.full_tensor()), W1 = as_mat(l1.weight().value().full_tensor()),
                W2 = as_mat(l2.weight().value().full_tensor()), DY = as_mat(dy.full_tensor());
      const Mat b1 = as_mat(l1.bias().value().full_tensor()), b2 = as_mat(l2.bias().value().full_tensor());
      Mat h = (X * W1).rowwise() + Eigen::Map<const Eigen::RowVectorXd>(b1.data(), b1.size());
      Mat yr = (h * W2).rowwise() + Eigen::Map<const Eigen::RowVectorXd>(b2.data(), b2.size());
      CHECK(max_abs_diff(as_mat(y.full_tensor()), yr) < 1e-12);
      using WT = std::decay_t<decltype(l1.weight())>::dtensor_type;
      WT g1(mesh, l1.weight().value().layout(), l1.weight().grad());
      CHECK(max_abs_diff(as_mat(g1.full_tensor()), X.transpose() * (DY * W2.transpose())) < 1e-12);
    });
}

TEST_CASE("MLP on DP x TP meshes 2x2 and 2x3, batch uneven over DP") {
  // Bucket sizes: one bucket for all four gradients, one each (1 byte), and between.
  for (std::size_t bucket : {std::size_t{1} << 20, std::size_t{1}, std::size_t{200}}) {
    spmd(4, [&](Comm& comm) { check_mlp<Cfg2, 2>(comm, {2, 2}, 5, bucket); });
    spmd(6, [&](Comm& comm) { check_mlp<Cfg2, 2>(comm, {2, 3}, 7, bucket); });
  }
  static_assert(plan2.buckets(0, 1, 8, {2, 2}, {0, 0}) == 4 && plan2.buckets(0, 1 << 20, 8, {2, 2}, {1, 1}) == 1);
// 200-byte buckets on 2x3: TP rank 0 holds W2 3x3, b2 3, W1 5x3, b1 3 (two buckets), TP rank 2 W2 1x3, W1 5x1 (one).
static_assert(MLP<Cfg2>::plan(MLP<Cfg2>::output_placements, kIn).buckets(0, 200, 8, {2, 3}, {0, 0}) == 2);
static_assert(MLP<Cfg2>::plan(MLP<Cfg2>::output_placements, kIn).buckets(0, 200, 8, {2, 3}, {0, 2}) == 1);
}

TEST_CASE("explain lists a training step's collectives in the order they run") {
  // DP x TP: the rowwise layer's forward all-reduce, then (the backward has none here)
  // the gradient reductions from the last layer to the first.
  static constexpr auto plan = MLP<Cfg2>::training_plan<nn::MSELoss<Cfg2>>(kIn);
  const std::string s = MLP<Cfg2>::explain(plan, 8, {2, 2});
  INFO(s);
  const auto forward = s.find("forward: layer 2"), loss = s.find("forward: loss"),
             last = s.find("gradient reduction: layer 2"), first = s.find("gradient reduction: layer 0");
  REQUIRE(forward != std::string::npos);
  REQUIRE(loss != std::string::npos);
  REQUIRE(last != std::string::npos);
  REQUIRE(first != std::string::npos);
  CHECK(forward < loss);
  CHECK(loss < last);
  CHECK(last < first);
}
