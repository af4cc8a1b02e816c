// Layers and a loss in bfloat16 and float16 (issue 41): a tensor-parallel MLP (colwise
// -> GELU -> rowwise) and MSELoss, forward and backward, against the same network in
// float64 holding the same (16-bit) parameters and seeing the same (16-bit) inputs.
// Every output, input gradient and parameter gradient must be within a bound stated
// from the type's epsilon and the reduction lengths, on one rank and on 1-D and 2x2
// (DP x TP) meshes with uneven shards; sharded no worse than twice the one-rank
// error, plus one ulp of the largest value, and a relative RMS error under one eps.
#include <cmath>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>

#include "nn_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

constexpr int64_t kIn = 37, kHidden = 29, kOut = 7, kRows = 257;  // 257 rows: a weight gradient sums 257 terms

template <class Cfg>
using MLP = nn::Sequential<nn::Linear<Cfg, kIn, kHidden, nn::Colwise>, nn::GELU<Cfg>,
                           nn::Linear<Cfg, kHidden, kOut, nn::Rowwise>>;

template <class T>
using Cfg2 = nn::Config<T, 2, nn::Axes<2, 0, 1>>;

template <class Cfg, int M>
MLP<Cfg> make_mlp(const DeviceMesh<M>& mesh) {
  return MLP<Cfg>(nn::Linear<Cfg, kIn, kHidden, nn::Colwise>(mesh, {1}), nn::GELU<Cfg>(),
                  nn::Linear<Cfg, kHidden, kOut, nn::Rowwise>(mesh, {2}));
}

// One step of the 16-bit model on a mesh of `shape`: output, input gradient and
// parameter gradients (model_step, which also checks the collectives against the
// plan), the MSE loss of the output against a target, and the parameters it held.
struct Run {
  GatheredStep step;
  std::vector<std::vector<double>> params;
};

template <class T>
Run run16(const std::array<int, 2>& shape) {
  Run r;
  int n = shape[0] * shape[1];
  auto body = [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, shape);
    auto model = make_mlp<Cfg2<T>>(mesh);
    auto s = model_step(model, mesh, {kRows, kIn}, {kRows, kOut});
    auto p = gathered_parameters(model);
    if (comm.rank() == 0 || under_mpi()) r.step = std::move(s), r.params = std::move(p);  // gathered: all ranks'
  };
  // One rank in-process (also under MPI); a mesh of n ranks in-process or on an MPI
  // world of n processes, skipped (recorded) elsewhere: then r.params stays empty.
  if (n == 1) run_threads(1, body);
  else spmd(n, body);
  return r;
}

// The float64 network on one rank with the 16-bit run's parameters, on the same
// 16-bit inputs (normal_rows of the 16-bit type, widened).
template <class T>
GatheredStep reference(const std::vector<std::vector<double>>& params) {
  GatheredStep want;
  on_one_rank<2>([&](const DeviceMesh<2>& mesh) {
    auto model = make_mlp<Cfg2<double>>(mesh);
    std::size_t k = 0;
    model.for_each_parameter([&](auto& p) {
      REQUIRE(static_cast<std::size_t>(p.value().local().numel()) == params[k].size());
      std::copy(params[k].begin(), params[k].end(), p.value().local().data());
      ++k;
    });
    model.zero_grad();
    using X16 = typename MLP<Cfg2<T>>::InputT;
    using Y16 = typename MLP<Cfg2<T>>::OutputT;
    using X = typename MLP<Cfg2<double>>::InputT;
    using Y = typename MLP<Cfg2<double>>::OutputT;
    const auto x16 = normal_rows<X16>({kRows, kIn}, mesh, 11).full_tensor();
    const auto dy16 = normal_rows<Y16>({kRows, kOut}, mesh, 12).full_tensor();
    auto x = from_local<Shard<0>, Replicate>(compute::convert<double>(x16), mesh, x16.shape());
    auto dy = from_local<Shard<0>, Replicate>(compute::convert<double>(dy16), mesh, dy16.shape());
    static_assert(std::is_same_v<decltype(x), X> && std::is_same_v<decltype(dy), Y>);
    const auto y = model.forward(x);
    const auto dx = model.template backward<true>(dy);
    want = GatheredStep{flat(y.full_tensor()), flat(dx.full_tensor()), {}, 0};
    model.for_each_parameter([&](auto& p) { want.grads.push_back(flat(p.gradient().full_tensor())); });
  });
  return want;
}

// Largest error of `got` against `want`; every element within
//   bound = 2 eps |want| + 2 L 2^-24 scale + sharded: eps scale
// where L is the longest reduction feeding an element (the 37 inputs, the 29 hidden
// features, or the 11 rows of a weight gradient: <= 64 terms, each rounded once from
// float), scale the largest magnitude of the quantity, and a sharded reduction adds a
// rounded term per rank.
double check_values(const char* what, const std::vector<double>& got, const std::vector<double>& want, double eps,
                    bool sharded) {
  REQUIRE(got.size() == want.size());
  double scale = 0, worst = 0, num = 0, den = 0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    // Two roundings along the chain (the hidden activation, then the output) each
    // carry half an ulp through a product of unit-scale weights: a few eps of scale.
    const double bound = 2 * eps * std::fabs(want[i]) + 8 * eps * scale + (sharded ? 2 * eps * scale : 0.0);
    if (!(err <= bound)) FAIL_CHECK(what << " element " << i << ": " << got[i] << " against " << want[i] << " (bound " << bound << ")");
    worst = std::max(worst, err);
    num += err * err, den += want[i] * want[i];
  }
  // And in the mean: each value computed in float from 16-bit operands and rounded
  // once keeps the relative RMS error near half an eps (0.27-0.6 eps measured); a
  // reduction accumulated in 16 bits (257 terms) gives 1.2-2.5 eps.
  const double rms = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (!(rms <= eps)) FAIL_CHECK(what << ": relative RMS error " << rms / eps << " eps (limit 1)");
  return worst;
}

template <class T>
void check_mlp16() {
  const double eps = double(std::numeric_limits<T>::epsilon());
  const Run one = run16<T>({1, 1});
  const GatheredStep want = reference<T>(one.params);
  std::vector<double> one_err;
  one_err.push_back(check_values("one rank: y", one.step.y, want.y, eps, false));
  one_err.push_back(check_values("one rank: dx", one.step.dx, want.dx, eps, false));
  for (std::size_t k = 0; k < want.grads.size(); ++k)
    one_err.push_back(check_values("one rank: parameter gradient", one.step.grads[k], want.grads[k], eps, false));
  for (const std::array<int, 2> shape : {std::array<int, 2>{2, 2}, std::array<int, 2>{1, 3}, std::array<int, 2>{3, 1}}) {
    INFO("mesh ", shape[0], "x", shape[1]);
    const Run r = run16<T>(shape);
    if (r.params.empty()) continue;  // skipped under MPI
    // The same parameters on every mesh (the fills give the same bits).
    REQUIRE(r.params == one.params);
    std::vector<double> err;
    err.push_back(check_values("sharded: y", r.step.y, want.y, eps, true));
    err.push_back(check_values("sharded: dx", r.step.dx, want.dx, eps, true));
    for (std::size_t k = 0; k < want.grads.size(); ++k)
      err.push_back(check_values("sharded: parameter gradient", r.step.grads[k], want.grads[k], eps, true));
    for (std::size_t c = 0; c < err.size(); ++c) {
      double scale = 0;
      const auto& w = c == 0 ? want.y : c == 1 ? want.dx : want.grads[c - 2];
      for (double v : w) scale = std::max(scale, std::fabs(v));
      const double ulp = eps * std::exp2(std::floor(std::log2(std::max(scale, 1e-30))));
      if (!(err[c] <= 2 * one_err[c] + ulp))
        FAIL_CHECK("quantity " << c << ": largest error " << err[c] << " sharded, " << one_err[c] << " on one rank");
    }
  }
}

}  // namespace

TEST_CASE("a bfloat16 MLP and its gradients against float64 with the same parameters and inputs") {
  check_mlp16<bfloat16>();
}

TEST_CASE("a float16 MLP and its gradients against float64 with the same parameters and inputs") {
  check_mlp16<float16>();
}

TEST_CASE("MSELoss of 16-bit outputs: the loss in float, the gradient rounded once") {
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    using Cfg = Cfg2<bfloat16>;
    using Y = typename MLP<Cfg>::OutputT;
    const auto y = normal_rows<Y>({9, kOut}, mesh, 3), t = normal_rows<Y>({9, kOut}, mesh, 4);
    nn::MSELoss<Cfg> loss;
    const auto l = loss.forward(y, t);
    static_assert(std::is_same_v<decltype(l), const float>, "a 16-bit model's loss is a float");
    const auto yf = y.full_tensor(), tf = t.full_tensor();
    double want = 0;
    for (int64_t i = 0; i < yf.numel(); ++i) want += std::pow(double(yf.data()[i]) - double(tf.data()[i]), 2);
    want /= double(yf.numel());
    CHECK(std::fabs(double(l) - want) <= 1e-6 * want);
    const auto g = loss.backward(y).full_tensor();
    for (int64_t i = 0; i < g.numel(); ++i) {
      const float d = (float(yf.data()[i]) - float(tf.data()[i])) * (2.f / float(yf.numel()));
      REQUIRE(g.data()[i].bits == bfloat16(d).bits);
    }
  });
}

namespace {

// FSDP2's mixed precision: FullyShard<L, R, Master> keeps the shards, the optimizer's
// updates and its state in Master (float) while L gathers, computes and reduce-scatters
// in bfloat16 (param_dtype = reduce_dtype = bfloat16; the reduce-scatter accumulates in
// float and rounds once).
template <class T, class Master>
using FsdpMLP = nn::Sequential<nn::FullyShard<nn::Linear<Cfg2<T>, kIn, kHidden, nn::Colwise>, true, Master>,
                               nn::GELU<Cfg2<T>>,
                               nn::FullyShard<nn::Linear<Cfg2<T>, kHidden, kOut, nn::Rowwise>, true, Master>>;

template <class T, class Master, int M>
FsdpMLP<T, Master> make_fsdp(const DeviceMesh<M>& mesh) {
  using C = Cfg2<T>;
  return FsdpMLP<T, Master>(nn::FullyShard<nn::Linear<C, kIn, kHidden, nn::Colwise>, true, Master>(
                                nn::Linear<C, kIn, kHidden, nn::Colwise>(mesh, {1})),
                            nn::GELU<C>(),
                            nn::FullyShard<nn::Linear<C, kHidden, kOut, nn::Rowwise>, true, Master>(
                                nn::Linear<C, kHidden, kOut, nn::Rowwise>(mesh, {2})));
}

// 30 steps of SGD with momentum on a fixed teacher's data: the losses.
template <class T, class Master>
std::vector<double> train_fsdp(const std::array<int, 2>& shape) {
  std::vector<double> losses;
  auto body = [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, shape);
    auto model = make_fsdp<T, Master>(mesh);
    nn::MSELoss<Cfg2<T>> loss;
    nn::SGD sgd({.lr = 0.05, .momentum = 0.9});
    using X = typename FsdpMLP<T, Master>::InputT;
    using Y = typename FsdpMLP<T, Master>::OutputT;
    std::vector<double> mine;
    for (int step = 0; step < 30; ++step) {
      const auto x = normal_rows<X>({64, kIn}, mesh, 100 + step);
      const auto t = dtensor::detail::generate<Y>({64, kOut}, mesh, {}, [&](uint64_t i) {
        double s = 0;
        for (int64_t j = 0; j < kIn; ++j)
          s += dtensor::detail::normal_value<double>(100 + step, (i / kOut) * kIn + j) *
               dtensor::detail::normal_value<double>(7, j * kOut + i % kOut);
        return std::tanh(s / 6);
      });
      model.zero_grad();
      const auto y = model.forward(x);
      mine.push_back(double(loss.forward(y, t)));
      model.backward(loss.backward(y));
      sgd.step(model);
    }
    if (comm.rank() == 0 || under_mpi()) losses = std::move(mine);
  };
  if (shape[0] * shape[1] == 1) run_threads(1, body);  // also under MPI
  else spmd(shape[0] * shape[1], body);              // empty where skipped
  return losses;
}

}  // namespace

TEST_CASE("FSDP x TP in bfloat16 with float masters: one step against one rank, 30 steps against float") {
  // One step: output and gradients of the 2x2 run against the same model on one rank.
  using Model = FsdpMLP<bfloat16, float>;
  static_assert(std::is_same_v<typename Model::template layer_t<0>::master_type, float>);
  GatheredStep want, got;
  on_one_rank<2>([&](const DeviceMesh<2>& m) {
    auto model = make_fsdp<bfloat16, float>(m);
    want = model_step(model, m, {kRows, kIn}, {kRows, kOut});
  });
  const bool ran = spmd(4, [&](Comm& comm) {
    DeviceMesh<2> m(comm, {2, 2});
    auto model = make_fsdp<bfloat16, float>(m);
    auto s = model_step(model, m, {kRows, kIn}, {kRows, kOut});
    if (comm.rank() == 0 || under_mpi()) got = std::move(s);
  });
  if (!ran) return;  // an MPI world of another size
  // Each quantity within bfloat16's relative tolerance of its largest value (the
  // gradients sum 257 rows: their values reach tens).
  auto close = [](const std::vector<double>& a, const std::vector<double>& b) {
    double scale = 0, worst = 0;
    for (std::size_t i = 0; i < b.size(); ++i) scale = std::max(scale, std::fabs(b[i]));
    for (std::size_t i = 0; i < b.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
    return a.size() == b.size() && worst <= 1.6e-2 * scale;
  };
  CHECK(close(got.y, want.y));
  CHECK(close(got.dx, want.dx));
  REQUIRE(got.grads.size() == want.grads.size());
  for (std::size_t k = 0; k < want.grads.size(); ++k) CHECK(close(got.grads[k], want.grads[k]));
  // Training: the 2x2 bfloat16 run follows the one-rank bfloat16 run, and both the
  // float run, within bfloat16's tolerance (PyTorch's assert_close for bfloat16:
  // rtol 1.6e-2), step by step.
  const auto f32 = train_fsdp<float, float>({1, 1});
  const auto one = train_fsdp<bfloat16, float>({1, 1});
  const auto mesh = train_fsdp<bfloat16, float>({2, 2});
  REQUIRE(one.size() == 30);
  if (mesh.empty()) return;  // an MPI world of another size
  for (std::size_t s = 0; s < one.size(); ++s) {
    INFO("step ", s, ": float ", f32[s], ", bfloat16 one rank ", one[s], ", 2x2 ", mesh[s]);
    CHECK(std::fabs(mesh[s] - one[s]) <= 1.6e-2 * std::fabs(one[s]) + 1e-5);
    CHECK(std::fabs(one[s] - f32[s]) <= 5e-2 * std::fabs(f32[s]) + 1e-4);
  }
  CHECK(mesh.back() < 0.7 * mesh.front());  // and it learns (0.36 -> 0.20 in float)
}

namespace {

// The bytes one FSDP x TP step of FsdpMLP<T, Policy> gathers and reduce-scatters on
// rank 0 of a 2x2 mesh (CommCounter), and the global elements its plan counts for each
// (T-sized units).
struct FsdpBytes {
  bool ran = false;  // false: skipped (an MPI world of another size)
  std::size_t gathered = 0, scattered = 0;
  int64_t planned_gather = 0, planned_scatter = 0;
};
template <class T, class Policy>
FsdpBytes fsdp_bytes() {
  using Model = FsdpMLP<T, Policy>;
  FsdpBytes b;
  constexpr auto plan = Model::template training_plan<nn::MSELoss<Cfg2<T>>>(kIn);
  for (int i = 0; i < plan.size; ++i) {
    if (plan.entries[i].kind == StepKind::AllGather) b.planned_gather += plan.entries[i].elements * int64_t(sizeof(T));
    if (plan.entries[i].kind == StepKind::ReduceScatter) b.planned_scatter += plan.entries[i].elements * int64_t(sizeof(T));
  }
  b.ran = spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    auto model = make_fsdp<T, Policy>(mesh);
    const auto x = normal_rows<typename Model::InputT>({kRows, kIn}, mesh, 11);
    CommCounter c;
    model.zero_grad();
    const auto y = model.forward(x);
    model.backward(normal_rows<typename Model::OutputT>({kRows, kOut}, mesh, 12, y.layout().blocks));
    if (comm.rank() != 0 && !under_mpi()) return;  // this rank's bytes (each process its own under MPI)
    for (const auto& r : c.records()) {
      if (r.kind == StepKind::AllGather) b.gathered += r.bytes;
      if (r.kind == StepKind::ReduceScatter) b.scattered += r.bytes;
    }
  });
  return b;
}

}  // namespace

TEST_CASE("nn::Precision: FSDP gathers in the compute type and reduce-scatters in the reduce type, as planned") {
  using ReduceFloat = nn::Precision<float, bfloat16>;  // torchtitan's default: reduce in float
  using ReduceBf16 = nn::Precision<float, bfloat16, bfloat16>;
  static_assert(std::is_same_v<typename FsdpMLP<bfloat16, ReduceFloat>::template layer_t<0>::reduce_type, float>);
  static_assert(std::is_same_v<typename FsdpMLP<bfloat16, ReduceFloat>::template layer_t<0>::master_type, float>);
  static_assert(std::is_same_v<typename FsdpMLP<bfloat16, float>::template layer_t<0>::reduce_type, bfloat16>,
                "a plain master type: Precision<float, bfloat16, bfloat16>");
  const FsdpBytes f32 = fsdp_bytes<float, float>(), rf = fsdp_bytes<bfloat16, ReduceFloat>(),
                  rb = fsdp_bytes<bfloat16, ReduceBf16>();
  // The plans count the same bytes (global elements times the unit).
  CHECK(rf.planned_gather * 2 == f32.planned_gather);
  CHECK(rf.planned_scatter == f32.planned_scatter);
  CHECK(rb.planned_scatter * 2 == rf.planned_scatter);
  if (!f32.ran) return;  // an MPI world of another size
  CHECK(f32.gathered > 0);
  CHECK(rf.gathered * 2 == f32.gathered);  // the parameters travel in bfloat16
  CHECK(rb.gathered == rf.gathered);
  CHECK(rf.scattered == f32.scattered);  // the gradients in float
  CHECK(rb.scattered * 2 == rf.scattered);
  // And a step with float reductions trains like one rank.
  GatheredStep want, got;
  on_one_rank<2>([&](const DeviceMesh<2>& m) {
    auto model = make_fsdp<bfloat16, ReduceFloat>(m);
    want = model_step(model, m, {kRows, kIn}, {kRows, kOut});
  });
  const bool ran = spmd(4, [&](Comm& comm) {
    DeviceMesh<2> m(comm, {2, 2});
    auto model = make_fsdp<bfloat16, ReduceFloat>(m);
    auto s = model_step(model, m, {kRows, kIn}, {kRows, kOut});
    if (comm.rank() == 0 || under_mpi()) got = std::move(s);
  });
  if (!ran) return;
  for (std::size_t k = 0; k < want.grads.size(); ++k) {
    double scale = 0, worst = 0;
    for (double v : want.grads[k]) scale = std::max(scale, std::fabs(v));
    for (std::size_t i = 0; i < want.grads[k].size(); ++i) worst = std::max(worst, std::fabs(got.grads[k][i] - want.grads[k][i]));
    CHECK(worst <= 1.6e-2 * scale);
  }
}

TEST_CASE("GradScaler: PyTorch's schedule on a hand-worked sequence") {
  spmd(1, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {1, 1});
    auto model = make_mlp<Cfg2<float>>(mesh);
    nn::GradScaler scaler({.init_scale = 8, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 3});
    nn::SGD sgd({.lr = 0.01});
    const bool overflow[] = {false, false, false, true, false, false, false, false};
    const double want[] = {8, 8, 16, 8, 8, 8, 16, 16};
    for (int s = 0; s < 8; ++s) {
      model.zero_grad();
      const auto x = normal_rows<typename MLP<Cfg2<float>>::InputT>({5, kIn}, mesh, s);
      const auto y = model.forward(x);
      model.backward(scaler.scale(normal_rows<typename MLP<Cfg2<float>>::OutputT>({5, kOut}, mesh, 50 + s)));
      if (overflow[s]) {
        model.for_each_parameter([&](auto& p) { p.grad().data()[0] = std::numeric_limits<float>::infinity(); });
      }
      CHECK(scaler.step(sgd, model) == !overflow[s]);
      scaler.update();
      CHECK(scaler.get_scale() == want[s]);
    }
    CHECK_THROWS_WITH_AS(scaler.update(), doctest::Contains("no unscale or step since the last update"),
                         InvalidArgument);
  });
}

TEST_CASE("GradScaler: an infinity on one rank skips the step on every rank, and unscaling is exact") {
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    auto model = make_mlp<Cfg2<float>>(mesh);
    nn::GradScaler scaler;
    nn::SGD sgd({.lr = 0.1});
    const auto before = gathered_parameters(model);
    for (int round = 0; round < 2; ++round) {
      model.zero_grad();
      const auto x = normal_rows<typename MLP<Cfg2<float>>::InputT>({9, kIn}, mesh, 1);
      const auto y = model.forward(x);
      const auto dy = normal_rows<typename MLP<Cfg2<float>>::OutputT>({9, kOut}, mesh, 2, y.layout().blocks);
      model.backward(scaler.scale(dy));
      // Rank 2's block of the first weight (sharded over TP): an overflow there only.
      bool first = true;
      model.for_each_parameter([&](auto& p) {
        if (first && comm.rank() == 2 && round == 0) p.grad().data()[3] = std::numeric_limits<float>::infinity();
        first = false;
      });
      CommCounter c;
      const bool stepped = scaler.step(sgd, model);
      CHECK(c.count() == 1);  // the found-inf all-reduce
      scaler.update();
      if (round == 0) {
        CHECK_FALSE(stepped);
        CHECK(scaler.found_inf());
        CHECK(scaler.get_scale() == 32768.0);
        CHECK(gathered_parameters(model) == before);  // nothing moved, on any rank
      } else {
        CHECK(stepped);
        CHECK(scaler.get_scale() == 32768.0);
        CHECK(gathered_parameters(model) != before);
      }
    }
  });
  // Unscaled gradients equal those of an unscaled backward, bitwise (powers of two).
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    auto a = make_mlp<Cfg2<float>>(mesh), b = make_mlp<Cfg2<float>>(mesh);
    nn::GradScaler scaler;
    const auto x = normal_rows<typename MLP<Cfg2<float>>::InputT>({9, kIn}, mesh, 1);
    for (auto* m : {&a, &b}) {
      m->zero_grad();
      const auto y = m->forward(x);
      const auto dy = normal_rows<typename MLP<Cfg2<float>>::OutputT>({9, kOut}, mesh, 2, y.layout().blocks);
      m->backward(m == &a ? scaler.scale(dy) : dy);
    }
    CHECK(scaler.unscale(a));
    std::vector<std::vector<float>> ga, gb;
    a.for_each_parameter([&](auto& p) { ga.emplace_back(p.grad().data(), p.grad().data() + p.grad().numel()); });
    b.for_each_parameter([&](auto& p) { gb.emplace_back(p.grad().data(), p.grad().data() + p.grad().numel()); });
    CHECK(ga == gb);
  });
}
