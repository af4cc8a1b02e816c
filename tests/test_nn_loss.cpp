// Cross-entropy on class-sharded (loss parallel) and replicated logits, on 1-D meshes
// of 1 to 4 ranks and on 2x2 and 2x3 (DP x TP) meshes, with class counts and batch
// sizes that do not divide, ignored rows, mean and sum, label smoothing, class
// weights: the loss and
// dlogits against a single-rank log-softmax written out in double, dlogits against
// central finite differences of the distributed loss, and the collectives each
// forward issues against the constexpr plan (none in the backward).
#include <cmath>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>
#include <dtensor/nn/loss.hpp>

#include "compare.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;
using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

using Cfg1 = nn::Config<double, 2, nn::Axes<1, nn::kNone, 0>>;
using Cfg2 = nn::Config<double, 2, nn::Axes<2, 0, 1>>;
constexpr PlacementDesc kSharded = nn::shard(1);
constexpr PlacementDesc kReplicated = nn::replicate();

// The plan, checked by the compiler: loss parallel costs two all-reduces over TP
// (row max; sum of exponentials with the target logit), and one over DP for the
// global total and count; replicated logits only the DP one.
template <class L>
constexpr nn::ModelPlan<L::M> loss_plan(nn::CrossEntropyOptions o = {}) {
  nn::ModelPlan<L::M> p;
  L::plan(p, L::logits_placements, o);
  return p;
}
using Sharded1 = nn::CrossEntropy<Cfg1, kSharded>;
using Replicated1 = nn::CrossEntropy<Cfg1, kReplicated>;
using Sharded2 = nn::CrossEntropy<Cfg2, kSharded>;
using Replicated2 = nn::CrossEntropy<Cfg2, kReplicated>;
static_assert(loss_plan<Sharded1>().count(nn::Phase::Forward, StepKind::AllReduce, 0) == 2);
static_assert(loss_plan<Sharded1>().size == 2);
static_assert(loss_plan<Replicated1>().size == 0);
static_assert(loss_plan<Sharded2>().count(nn::Phase::Forward, StepKind::AllReduce, 1) == 2);
static_assert(loss_plan<Sharded2>().count(nn::Phase::Forward, StepKind::AllReduce, 0) == 1);
static_assert(loss_plan<Replicated2>().size == 1 && loss_plan<Replicated2>().count(nn::Phase::Forward) == 1);
// Bytes per rank for 8 tokens on 2x2: max [4 rows], [4 rows x 2], the DP total [3],
// and in each sum the 4 values of the shape agreement check (comm/agreement.hpp).
static_assert(loss_plan<Sharded2>().bytes<double>(nn::Phase::Forward, 8, {2, 2}) == (4 + 4 * 2 + 4 + 3 + 4) * 8);
static_assert(loss_plan<Sharded2>({.label_smoothing = 0.1}).bytes<double>(nn::Phase::Forward, 8, {2, 2}) ==
              (4 + 4 * 3 + 4 + 3 + 4) * 8);
static_assert(Sharded2::grad_input(Sharded2::logits_placements) == Sharded2::logits_placements);
// A model ending in a colwise layer hands its class-sharded logits to the loss: the
// training plan holds the loss's collectives and none for the logits' gradient.
using Head2 = nn::Sequential<nn::Linear<Cfg2, 4, 7, nn::Colwise>>;
static_assert(Head2::output_placements == Sharded2::logits_placements);
static constexpr auto head_plan = Head2::training_plan<Sharded2>(4);
static_assert(head_plan.count(nn::Phase::Forward, StepKind::AllReduce, 1) == 2);
static_assert(head_plan.count(nn::Phase::Forward, StepKind::AllReduce, 0) == 1);
static_assert(head_plan.count(nn::Phase::Backward) == 0);

constexpr int64_t kIgnore = -100;

// Global targets: class (3 i + seed) mod (C + 1), the value C meaning "ignored".
std::vector<int64_t> global_targets(int64_t batch, int64_t classes, uint64_t seed) {
  std::vector<int64_t> y(static_cast<std::size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t t = static_cast<int64_t>((3 * static_cast<uint64_t>(i) + seed) % static_cast<uint64_t>(classes + 1));
    y[i] = t == classes ? kIgnore : t;
  }
  return y;
}

// The reference on one rank: log-softmax by hand.
struct Reference {
  double loss = 0;
  Mat grad;
};
// With weights w: q_j = (1 - eps) w_y [j = y] + eps w_j / C, loss = -sum_j q_j log p_j,
// its gradient (sum_k q_k) p_j - q_j, and the mean divides by the sum of w_y.
Reference reference(const Mat& z, const std::vector<int64_t>& y, const nn::CrossEntropyOptions& o,
                    std::vector<double> w) {
  const int64_t B = z.rows(), C = z.cols();
  if (w.empty()) w.assign(static_cast<std::size_t>(C), 1.0);
  Reference r;
  r.grad = Mat::Zero(B, C);
  double total = 0, count = 0;
  for (int64_t i = 0; i < B; ++i) {
    if (y[i] == o.ignore_index) continue;
    const double m = z.row(i).maxCoeff();
    double s = 0;
    for (int64_t j = 0; j < C; ++j) s += std::exp(z(i, j) - m);
    std::vector<double> logp(C);
    for (int64_t j = 0; j < C; ++j) logp[j] = z(i, j) - m - std::log(s);
    double l = 0, qsum = 0;
    std::vector<double> q(C);
    for (int64_t j = 0; j < C; ++j) {
      q[j] = (1 - o.label_smoothing) * w[y[i]] * (j == y[i]) + o.label_smoothing * w[j] / C;
      l -= q[j] * logp[j];
      qsum += q[j];
    }
    for (int64_t j = 0; j < C; ++j) r.grad(i, j) = qsum * std::exp(logp[j]) - q[j];
    total += l;
    count += w[y[i]];
  }
  if (o.reduction == nn::Reduction::Mean) {
    r.loss = total / count;
    r.grad /= count;
  } else {
    r.loss = total;
  }
  return r;
}

Mat as_mat(const Tensor<double, 2>& t) { return Eigen::Map<const Mat>(t.data(), t.shape()[0], t.shape()[1]); }

template <class Loss, int M>
void check_loss(Comm& comm, const std::array<int, M>& shape, int64_t batch, int64_t classes,
                nn::CrossEntropyOptions o, bool finite_differences, bool weighted = false) {
  DeviceMesh<M> mesh(comm, shape);
  using Logits = typename Loss::Logits;
  const uint64_t seed = 1;
  const Logits z = dtensor::detail::generate<Logits>(
      {batch, classes}, mesh, {}, [&](uint64_t i) { return 3 * dtensor::detail::normal_value<double>(seed, i); });
  const auto y = global_targets(batch, classes, seed);
  const int64_t r0 = z.local_offset()[0], rows = z.local().shape()[0];
  Tensor<int64_t, 1> yl({rows});
  for (int64_t r = 0; r < rows; ++r) yl(r) = y[r0 + r];

  // Weights 0.5, 0.75, 1, ... (not all equal, so a unit weight would show).
  std::vector<double> w;
  if (weighted)
    for (int64_t c = 0; c < classes; ++c) w.push_back(0.5 + 0.25 * static_cast<double>(c));
  Loss loss(o, w);
  CommCounter fwd;
  const double l = loss.forward(z, yl);
  const auto records = fwd.records();
  CommCounter bwd;
  const auto dz = loss.backward();
  CHECK(bwd.count() == 0);

  // Every collective is the plan's, in order, with this rank's exact buffer size.
  const auto plan = loss_plan<Loss>(o);
  REQUIRE(static_cast<int>(records.size()) == plan.size);
  for (int i = 0; i < plan.size; ++i) {
    const auto& e = plan.entries[i];
    CHECK(records[i].kind == e.kind);
    CHECK(records[i].mesh_dim == e.mesh_dim);
    const int64_t elements = (e.per_token ? rows : 1) * e.elements + e.fixed;
    CHECK(records[i].bytes == static_cast<std::size_t>(elements) * sizeof(double));
  }

  const Mat zg = as_mat(z.full_tensor());
  const Reference ref = reference(zg, y, o, w);
  CHECK(std::abs(l - ref.loss) < 1e-12 * std::max(1.0, std::abs(ref.loss)));
  const Mat g = as_mat(dz.full_tensor());
  CHECK(max_abs_diff(g, ref.grad) < 1e-12);

  if (finite_differences) {
    // d loss / d z(i, j) by central differences of the distributed forward: every
    // rank holding z(i, j) (one TP rank when sharded, all when replicated) moves it.
    const double h = 1e-5;
    const int64_t c0 = z.local_offset()[1], cl = z.local().shape()[1];
    double worst = 0;
    for (int64_t i = 0; i < batch; ++i)
      for (int64_t j = 0; j < classes; ++j) {
        auto at = [&](double delta) {
          Logits zp = z;
          if (i >= r0 && i < r0 + rows && j >= c0 && j < c0 + cl) zp.local()(i - r0, j - c0) += delta;
          Loss fresh(o, w);
          return fresh.forward(zp, yl);
        };
        const double fd = (at(h) - at(-h)) / (2 * h);
        worst = worst_of(worst, std::abs(fd - g(i, j)));
      }
    CHECK(worst < 1e-7);
  }
}

template <class F>
void on_loss_kinds(F&& f) {
  for (auto red : {nn::Reduction::Mean, nn::Reduction::Sum})
    for (double eps : {0.0, 0.2}) f(nn::CrossEntropyOptions{red, kIgnore, eps});
}

}  // namespace

TEST_CASE("cross-entropy on 1-D meshes of 1 to 4 ranks, classes sharded (loss parallel) and replicated") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [&](Comm& comm) {
      on_loss_kinds([&](nn::CrossEntropyOptions o) {
        check_loss<Sharded1, 1>(comm, {n}, 5, 7, o, false);
        check_loss<Replicated1, 1>(comm, {n}, 5, 7, o, false);
        check_loss<Sharded1, 1>(comm, {n}, 4, 3, o, false);  // 3 classes on 4 ranks: an empty block
        check_loss<Sharded1, 1>(comm, {n}, 5, 7, o, false, true);
        check_loss<Replicated1, 1>(comm, {n}, 5, 7, o, false, true);
      });
    });
}

TEST_CASE("cross-entropy on DP x TP meshes 2x2 and 2x3, batch and classes uneven") {
  spmd(4, [&](Comm& comm) {
    on_loss_kinds([&](nn::CrossEntropyOptions o) {
      check_loss<Sharded2, 2>(comm, {2, 2}, 5, 7, o, false);
      check_loss<Replicated2, 2>(comm, {2, 2}, 5, 7, o, false);
      check_loss<Sharded2, 2>(comm, {2, 2}, 5, 7, o, false, true);
    });
  });
  spmd(6, [&](Comm& comm) {
    on_loss_kinds([&](nn::CrossEntropyOptions o) {
      check_loss<Sharded2, 2>(comm, {2, 3}, 5, 7, o, false);
      check_loss<Replicated2, 2>(comm, {2, 3}, 5, 7, o, false);
      check_loss<Sharded2, 2>(comm, {2, 3}, 1, 7, o, false);  // one row: a DP rank with none
      check_loss<Sharded2, 2>(comm, {2, 3}, 5, 7, o, false, true);
    });
  });
}

TEST_CASE("cross-entropy dlogits equal central finite differences of the distributed loss") {
  spmd(3, [&](Comm& comm) {
    check_loss<Sharded1, 1>(comm, {3}, 5, 7, {nn::Reduction::Mean, kIgnore, 0.1}, true);
    check_loss<Replicated1, 1>(comm, {3}, 5, 7, {nn::Reduction::Sum, kIgnore, 0.0}, true);
  });
  spmd(6, [&](Comm& comm) {
    check_loss<Sharded2, 2>(comm, {2, 3}, 5, 7, {nn::Reduction::Mean, kIgnore, 0.0}, true);
    check_loss<Sharded2, 2>(comm, {2, 3}, 5, 7, {nn::Reduction::Sum, kIgnore, 0.3}, true);
    check_loss<Sharded2, 2>(comm, {2, 3}, 5, 7, {nn::Reduction::Mean, kIgnore, 0.2}, true, true);
  });
}

TEST_CASE("cross-entropy: bad targets or weights throw on every rank") {
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    using Logits = Sharded2::Logits;
    const Logits z = dtensor::detail::generate<Logits>(
        {5, 7}, mesh, {}, [&](uint64_t i) { return dtensor::detail::normal_value<double>(2, i); });
    const int64_t rows = z.local().shape()[0];
    // Only the second DP row block holds the bad target: the first must throw too.
    Tensor<int64_t, 1> y({rows});
    if (mesh.coords()[0] == 1) y(0) = 7;
    Sharded2 loss;
    CHECK_THROWS_AS(loss.forward(z, y), InvalidArgument);
    Tensor<int64_t, 1> wrong({rows + 1});
    CHECK_THROWS_AS(loss.forward(z, wrong), InvalidArgument);
    CHECK_THROWS_AS(loss.backward(), InvalidArgument);  // no successful forward
  });
  CHECK_THROWS_AS(Sharded1({.label_smoothing = 1.5}), InvalidArgument);
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {2});
    const auto z = dtensor::detail::generate<Sharded1::Logits>(
        {3, 7}, mesh, {}, [&](uint64_t i) { return dtensor::detail::normal_value<double>(3, i); });
    Sharded1 loss({}, std::vector<double>(6, 1.0));  // 6 weights for 7 classes
    CHECK_THROWS_AS(loss.forward(z, Tensor<int64_t, 1>({3})), InvalidArgument);
  });
}

TEST_CASE("cross-entropy on [batch, sequence, classes] logits: every token is a row") {
  using Cfg3 = nn::Config<double, 3, nn::Axes<2, 0, 1>>;
  using Loss = nn::CrossEntropy<Cfg3>;
  spmd(6, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 3});
    const int64_t batch = 3, seq = 2, classes = 7;
    const auto z = dtensor::detail::generate<Loss::Logits>(
        {batch, seq, classes}, mesh, {}, [&](uint64_t i) { return dtensor::detail::normal_value<double>(5, i); });
    const auto y = global_targets(batch * seq, classes, 3);  // token 4 ignored
    const int64_t b0 = z.local_offset()[0], lb = z.local().shape()[0];
    Tensor<int64_t, 2> yl({lb, seq});
    for (int64_t b = 0; b < lb; ++b)
      for (int64_t s = 0; s < seq; ++s) yl(b, s) = y[(b0 + b) * seq + s];
    const nn::CrossEntropyOptions o{nn::Reduction::Mean, kIgnore, 0.1};
    Loss loss(o);
    const double l = loss.forward(z, yl);
    const auto dz = loss.backward();
    const auto zg = z.full_tensor(), gg = dz.full_tensor();
    const Reference ref = reference(Eigen::Map<const Mat>(zg.data(), batch * seq, classes), y, o, {});
    CHECK(std::abs(l - ref.loss) < 1e-12);
    CHECK(max_abs_diff(Eigen::Map<const Mat>(gg.data(), batch * seq, classes), ref.grad) < 1e-12);
  });
}

TEST_CASE("cross-entropy takes the targets as a DTensor placed like the logits' rows") {
  spmd(6, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 3});
    const auto z = dtensor::detail::generate<Sharded2::Logits>(
        {5, 7}, mesh, {}, [&](uint64_t i) { return dtensor::detail::normal_value<double>(6, i); });
    const auto y = global_targets(5, 7, 1);
    using Y = dtensor_t<int64_t, 1, placements_t<Cfg2::activation(nn::replicate())>>;
    const Y yd = dtensor::detail::generate<Y>({5}, mesh, {}, [&](uint64_t i) { return y[i]; });
    Sharded2 loss;
    const double l = loss.forward(z, yd);
    const Reference ref = reference(as_mat(z.full_tensor()), y, loss.options(), {});
    CHECK(std::abs(l - ref.loss) < 1e-12);
    CHECK(max_abs_diff(as_mat(loss.backward().full_tensor()), ref.grad) < 1e-12);
    // The losses' one protocol, as MSELoss: backward(z) with the forward's logits.
    (void)loss.forward(z, yd);
    CHECK(max_abs_diff(as_mat(loss.backward(z).full_tensor()), ref.grad) < 1e-12);
  });
}

TEST_CASE("float32 cross-entropy with label smoothing and weights: logits with a large common offset lose no digits") {
  // Smoothing adds eps/C (wsum lse - sum_j w_j z_j) per row: two terms of about C times
  // the offset whose difference is the answer. PyTorch computes it from log-softmax
  // values ((z - max) - log sum exp), which never see the offset. Written that way in
  // float, the loss was off by 3e-7 to 1.1e-6 (relative) at an offset of 1000; from
  // shifted sums in double, 1.5e-8 to 3e-8 at every offset.
  using CfgF = nn::Config<float, 2, nn::Axes<1, nn::kNone, 0>>;
  using LossF = nn::CrossEntropy<CfgF, kSharded>;
  const int64_t batch = 9, classes = 50;
  for (double offset : {0.0, 100.0, 1000.0})
    for (int n : {1, 3})
      for (bool weighted : {false, true})
        spmd(n, [&](Comm& comm) {
          DeviceMesh<1> mesh(comm, {n});
          const auto z = dtensor::detail::generate<LossF::Logits>({batch, classes}, mesh, {}, [&](uint64_t i) {
            return static_cast<float>(offset + 3 * dtensor::detail::normal_value<double>(4, i));
          });
          const auto y = global_targets(batch, classes, 2);
          const int64_t r0 = z.local_offset()[0], rows = z.local().shape()[0];
          Tensor<int64_t, 1> yl({rows});
          for (int64_t r = 0; r < rows; ++r) yl(r) = y[r0 + r];
          std::vector<float> wf;
          std::vector<double> wd;
          if (weighted)
            for (int64_t c = 0; c < classes; ++c)
              wf.push_back(0.5f + 0.25f * static_cast<float>(c % 7)), wd.push_back(wf.back());
          const nn::CrossEntropyOptions o{nn::Reduction::Mean, kIgnore, 0.1};
          LossF loss(o, wf);
          const double l = loss.forward(z, yl);
          const auto g = loss.backward().full_tensor();
          const auto zf = z.full_tensor();
          Mat zd(batch, classes);
          for (int64_t i = 0; i < zf.numel(); ++i) zd.data()[i] = zf.data()[i];
          const Reference ref = reference(zd, y, o, wd);
          double gerr = 0;
          for (int64_t i = 0; i < g.numel(); ++i) {
            const double e = std::abs(static_cast<double>(g.data()[i]) - ref.grad.data()[i]);
            gerr = worst_of(gerr, e);
          }
          const double lerr = std::abs(l - ref.loss) / std::abs(ref.loss);
          INFO("offset ", offset, ", ", n, " ranks", std::string(weighted ? ", weighted" : ""),
               ": loss relative error ", lerr,
               ", dlogits error ", gerr, " (largest ", ref.grad.cwiseAbs().maxCoeff(), ")");
          CHECK(lerr < 2e-7);
          CHECK(gerr < 1e-7);
        });
}

namespace {

// MSELoss on y and t placed like Y, against the sums written out on the gathered
// tensors: loss = sum (y - t)^2 / numel on every rank, dloss/dy = 2 (y - t) / numel.
template <class Cfg, class Y>
void check_mse(const typename Y::Mesh& mesh, const Shape<2>& shape) {
  const Y y = dtensor::detail::generate<Y>(shape, mesh, {}, [](uint64_t i) {
    return dtensor::detail::normal_value<double>(1, i);
  });
  const Y t = dtensor::detail::generate<Y>(shape, mesh, {}, [](uint64_t i) {
    return dtensor::detail::normal_value<double>(2, i);
  });
  nn::MSELoss<Cfg> mse;
  CommCounter counter;
  const double l = mse.forward(y, t);
  CHECK(counter.count() == 1);  // the plan's one all-reduce
  const auto g = mse.backward(y).full_tensor();
  const auto yg = y.full_tensor(), tg = t.full_tensor();
  double want = 0;
  std::vector<double> dwant(static_cast<std::size_t>(yg.numel()));
  for (int64_t i = 0; i < yg.numel(); ++i) {
    const double d = yg.data()[i] - tg.data()[i];
    want += d * d;
    dwant[i] = 2 * d / static_cast<double>(yg.numel());
  }
  want /= static_cast<double>(yg.numel());
  INFO(Y::placements_string(), ", shape ", to_string(shape));
  CHECK(std::abs(l - want) <= 1e-14 * want);
  CHECK(max_abs_diff(g.data(), dwant.data(), g.numel()) < 1e-15);
  CHECK_THROWS_AS(mse.backward(y), InvalidArgument);  // one backward per forward
}

}  // namespace

TEST_CASE("mean squared error: the loss and its gradient against the sums written out, sharded and replicated") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm);
      check_mse<Cfg1, DTensor<double, 2, Shard<1>>>(mesh, {5, 7});    // 7 columns over n ranks
      check_mse<Cfg1, DTensor<double, 2, Shard<0>>>(mesh, {3, 4});    // 3 rows: an empty block on 4
      check_mse<Cfg1, DTensor<double, 2, Replicate>>(mesh, {5, 7});  // counted once, not n times
    });
  for (auto shape : {std::array<int, 2>{2, 2}, std::array<int, 2>{2, 3}})
    spmd(shape[0] * shape[1], [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, shape);
      check_mse<Cfg2, DTensor<double, 2, Shard<0>, Shard<1>>>(mesh, {5, 7});
      check_mse<Cfg2, DTensor<double, 2, Shard<0>, Replicate>>(mesh, {5, 7});
      check_mse<Cfg2, DTensor<double, 2, Replicate, Shard<0>>>(mesh, {5, 7});
    });
}
