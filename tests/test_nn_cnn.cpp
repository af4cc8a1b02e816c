// Convolutional models on images sharded in space (nn::Sequential of image layers):
// outputs, every parameter's gradient after the step's reductions, and the input's
// gradient against the same model on one rank, on 1-D meshes over H, a 2x2 mesh over
// H and W, and a DP x H mesh; image extents that do not divide. The gradient
// reductions the model runs are those its constexpr plan lists. The backward split in
// two (zero-bubble schedules) against the whole one, bit for bit; a CNN in two
// pipeline stages (H split inside each) against one rank, within its memory bound.
// Runs in-process and, through test_nn_cnn_mpi, under mpirun on 1-4 and 6 processes.
#include <cmath>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>
#include <dtensor/nn/image/conv.hpp>

#include "compare.hpp"
#include "nn_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

constexpr auto k3 = nn::ConvSpec<2>::square_same(3);
constexpr auto k3s2 = nn::ConvSpec<2>::square(3, 2, 1);

template <class Img>
using Net = nn::Sequential<nn::Conv<Img, 2, 4, k3>, nn::ReLU<Img>, nn::Conv<Img, 4, 3, k3s2>>;

using HW = nn::ImageConfig<double, 2, nn::DomainAxes<2, nn::kNone, 0, 1>>;
using DpH = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;
using H1 = nn::ImageConfig<double, 2, nn::DomainAxes<1, nn::kNone, 0, nn::kNone>>;

// The plan, checked by the compiler: no collective forward or backward (the halo
// exchanges are point to point), and one all-reduce per parameter over each mesh dim
// that shards the input: 4 parameters, over H and W.
static constexpr auto plan_hw = Net<HW>::plan(Net<HW>::output_placements, 2);
static_assert(plan_hw.count(nn::Phase::Forward) == 0 && plan_hw.count(nn::Phase::Backward) == 0);
static_assert(plan_hw.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 4 &&
              plan_hw.count(nn::Phase::GradReduce, StepKind::AllReduce, 1) == 4);
// The first conv's weight: 4 x 2 x 3 x 3 values.
static_assert(plan_hw.entries[0].local_elements(1, {2, 2}) == 4 * 2 * 9);
static constexpr auto plan_dp = Net<DpH>::plan(Net<DpH>::output_placements, 2);
static_assert(plan_dp.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 4 &&
              plan_dp.count(nn::Phase::GradReduce, StepKind::AllReduce, 1) == 4);

struct Result {
  Tensor<double, 4> y, dx;
  std::vector<Tensor<double, 4>> dw;
  std::vector<Tensor<double, 1>> db;
};

// split: the backward in two steps (backward_input, then backward_weight), as a
// zero-bubble pipeline runs it: the convolutions' weight terms wait for the second.
template <class Img, int M>
Result run(Comm& comm, const std::array<int, M>& shape, const Shape<4>& image, bool split = false) {
  DeviceMesh<M> mesh(comm, shape);
  using Model = Net<Img>;
  Model model(nn::Conv<Img, 2, 4, k3>(mesh, {1}), nn::ReLU<Img>(), nn::Conv<Img, 4, 3, k3s2>(mesh, {2}));
  model.set_bucket_bytes(256);  // several buckets
  auto x = random<typename Model::InputT>(image, mesh, 11);
  model.zero_grad();
  auto y = model.forward(x);
  auto dy = dtensor::detail::generate<typename Model::OutputT>(y.shape(), mesh, y.layout().blocks, [](uint64_t i) {
    return dtensor::detail::normal_value<double>(12, i);
  });
  CommCounter bwd;
  auto dx = [&] {
    if (!split) return model.template backward<true>(dy);
    auto dx_first = model.template backward_input<true>(dy);
    int zero = 0, params = 0;  // every parameter's gradient waits for the weight step
    model.for_each_parameter([&](auto& p) {
      const auto& g = p.grad();
      bool all = true;
      for (int64_t i = 0; i < g.numel(); ++i) all = all && g.data()[i] == 0;
      zero += all, ++params;
    });
    CHECK(zero == params);
    CHECK_THROWS_WITH_AS((void)model.forward(x), doctest::Contains("a forward between backward_input and backward_weight"),
                         InvalidArgument);
    model.template backward_weight<std::decay_t<decltype(dy)>>();
    return dx_first;
  }();
  static constexpr auto plan = Model::plan(Model::output_placements, 2, true);
  CHECK(bwd.count() == plan.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()));
  Result r{y.full_tensor(), dx.full_tensor(), {}, {}};
  model.for_each_parameter([&](auto& p) {
    if constexpr (std::decay_t<decltype(p)>::rank == 4) r.dw.push_back(p.grad());
    else r.db.push_back(p.grad());
  });
  return r;
}


// Bit for bit: the split backward's sums are the whole backward's.
void compare_exactly(const Result& r, const Result& ref) {
  CHECK(max_abs_diff(r.dx, ref.dx) == 0);
  REQUIRE(r.dw.size() == ref.dw.size());
  for (std::size_t i = 0; i < ref.dw.size(); ++i) {
    CHECK(max_abs_diff(r.dw[i], ref.dw[i]) == 0);
    CHECK(max_abs_diff(r.db[i], ref.db[i]) == 0);
  }
}

void compare(const Result& r, const Result& ref) {
  REQUIRE(r.y.shape() == ref.y.shape());
  CHECK(max_abs_diff(r.y, ref.y) < 1e-12);
  CHECK(max_abs_diff(r.dx, ref.dx) < 1e-12);
  REQUIRE(r.dw.size() == ref.dw.size());
  REQUIRE(r.db.size() == ref.db.size());
  for (std::size_t i = 0; i < ref.dw.size(); ++i) {
    CHECK(max_abs_diff(r.dw[i], ref.dw[i]) < 1e-11);
    CHECK(max_abs_diff(r.db[i], ref.db[i]) < 1e-11);
  }
}

template <class Img>
Result single_rank(const Shape<4>& image) {
  Result ref;
  dtensor::run_threads(1, [&](Comm& comm) {
    if constexpr (Img::M == 1) ref = run<Img, 1>(comm, {1}, image);
    else ref = run<Img, 2>(comm, {1, 1}, image);
  });
  return ref;
}

}  // namespace

TEST_CASE("conv -> relu -> strided conv on 1-D meshes over H equals one rank") {
  const Shape<4> image{2, 2, 15, 7};
  const Result ref = single_rank<H1>(image);
  for (int n = 2; n <= 4; ++n)
    spmd(n, [&](Comm& comm) { compare(run<H1, 1>(comm, {n}, image), ref); });
}

TEST_CASE("conv -> relu -> strided conv on a 2x2 mesh over H and W, and over batch and H") {
  const Shape<4> image{3, 2, 13, 10};
  const Result ref_hw = single_rank<HW>(image), ref_dp = single_rank<DpH>(image);
  spmd(4, [&](Comm& comm) { compare(run<HW, 2>(comm, {2, 2}, image), ref_hw); });
  spmd(4, [&](Comm& comm) { compare(run<DpH, 2>(comm, {2, 2}, image), ref_dp); });
}

// What a split backward keeps from its input step to its weight step (memory_pending):
// each convolution's dy block. On 2 ranks over H, x [2, 2, 15, 7]: rank 0's dy of the
// first conv [2, 4, 8, 7], of the strided second [2, 3, 4, 4] (its output rows 0-3, whose
// window centres 0, 2, 4, 6 rank 0 holds): 8 (448 + 96) bytes.
static_assert(nn::memory_pending<Net<H1>>(nn::PlannedTensor<1>::of<double>(std::array<int64_t, 4>{2, 2, 15, 7},
                                                                          Net<H1>::input_placements),
                                          {2}, {0}) == 8 * (448 + 96));

TEST_CASE("conv -> relu -> strided conv: a split backward (input, then weight step) is the backward, bit for bit") {
  const Shape<4> image{2, 2, 15, 7};
  for (int n = 1; n <= 4; ++n)
    spmd(n, [&](Comm& comm) { compare_exactly(run<H1, 1>(comm, {n}, image, true), run<H1, 1>(comm, {n}, image)); });
  const Shape<4> image2{3, 2, 13, 10};
  spmd(4, [&](Comm& comm) { compare_exactly(run<HW, 2>(comm, {2, 2}, image2, true), run<HW, 2>(comm, {2, 2}, image2)); });
  spmd(4, [&](Comm& comm) { compare_exactly(run<DpH, 2>(comm, {2, 2}, image2, true), run<DpH, 2>(comm, {2, 2}, image2)); });
}

namespace {
// A CNN in two pipeline stages over mesh dim 0, H split over mesh dim 1 inside each
// stage (halos on both stages): 1F1B and zero-bubble H1, whose convolutions split their
// backward, each micro-batch's halo (and its reverse staging buffer) set aside with
// the stage's saved state. "Same" windows keep the chunk rule's blocks, so the target
// is placed as any activation.
using CnnStage0 = nn::Sequential<nn::Conv<H1, 2, 4, k3>, nn::ReLU<H1>>;
using CnnStage1 = nn::Sequential<nn::Conv<H1, 4, 4, k3>, nn::ReLU<H1>, nn::Conv<H1, 4, 3, k3>>;
template <int I>
auto make_cnn_stage(const DeviceMesh<1>& mesh) {
  if constexpr (I == 0) return CnnStage0(nn::Conv<H1, 2, 4, k3>(mesh, {1}), nn::ReLU<H1>());
  else return CnnStage1(nn::Conv<H1, 4, 4, k3>(mesh, {2}), nn::ReLU<H1>(), nn::Conv<H1, 4, 3, k3>(mesh, {3}));
}
constexpr Shape<4> kCnnImage{4, 2, 15, 7}, kCnnOut{4, 3, 15, 7};  // 4 micro-batches of one image

template <class Stage>
std::vector<std::vector<double>> stage_grads(Stage& stage) {
  std::vector<std::vector<double>> g;
  stage.for_each_parameter([&](auto& p) {
    const auto& t = p.grad();  // replicated after the step's reductions: the whole gradient
    g.emplace_back(t.data(), t.data() + t.numel());
  });
  return g;
}

template <class Schedule>
void check_cnn_pipeline(int h) {
  using Model = nn::Pipeline<nn::PipelineConfig<2, 0, Schedule, 4>, CnnStage0, CnnStage1>;
  using Loss = nn::MSELoss<H1>;
  double want_loss = 0;
  std::vector<std::vector<double>> want0, want1;
  dtensor::run_threads(1, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {1});
    nn::Sequential<CnnStage0, CnnStage1> model(make_cnn_stage<0>(mesh), make_cnn_stage<1>(mesh));
    Loss mse;
    model.zero_grad();
    const auto y = model.forward(random<typename Model::InputT>(kCnnImage, mesh, 21));
    want_loss = mse.forward(y, random<typename Model::OutputT>(kCnnOut, mesh, 22));
    model.backward(mse.backward(y));
    want0 = stage_grads(model.template layer<0>());
    want1 = stage_grads(model.template layer<1>());
  });
  const auto plan = Model::template memory_plan<Loss, nn::SGD>({4, 2, 15, 7}, {2, h});
  spmd(2 * h, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, h});
    Model model(mesh, [](auto stage, const auto& m) { return make_cnn_stage<decltype(stage)::value>(m); });
    Loss mse;
    nn::SGD sgd({.lr = 1e-3, .momentum = 0.9});
    const auto x = random<typename Model::InputT>(kCnnImage, model.stage_mesh(), 21);
    const auto target = random<typename Model::OutputT>(kCnnOut, model.stage_mesh(), 22);
    int64_t measured = 0;
    for (int step = 0; step < 2; ++step) {  // the second: the optimizer's state and the halos exist
      model.zero_grad();
      const int64_t before = host_memory_in_use();
      reset_host_memory_peak();
      const double loss = model.step(x, target, mse);
      measured = host_memory_peak() - before;
      if (step == 0) {
        CHECK(loss == doctest::Approx(want_loss).epsilon(1e-12));
        auto close = [](const auto& got, const auto& want) {
          REQUIRE(got.size() == want.size());
          for (std::size_t i = 0; i < want.size(); ++i) {
            REQUIRE(got[i].size() == want[i].size());
            for (std::size_t j = 0; j < want[i].size(); ++j) CHECK(got[i][j] == doctest::Approx(want[i][j]).epsilon(1e-11));
          }
        };
        if (model.holds(0)) close(stage_grads(model.template stage<0>()), want0);
        if (model.holds(1)) close(stage_grads(model.template stage<1>()), want1);
      }
      sgd.step(model);
    }
    // Each process's own allocations: under mpirun (in-process ranks share one count).
    if (under_mpi()) {
      const int r = model.pipeline_rank();
      const int64_t planned = plan.peak_bytes(r) - plan.persistent[static_cast<std::size_t>(r)] - plan.batch;
      MESSAGE("CNN pipeline rank ", r, " (H over ", h, "): a step allocates ", measured, " B, the plan's bound ",
              planned, " B");
      CHECK(measured > 0);
      CHECK(planned >= measured);
    }
  });
}
}  // namespace

TEST_CASE("a CNN in two pipeline stages, H split inside each, 1F1B and zero-bubble H1, equals one rank") {
  for (int h : {1, 2, 3}) {
    CAPTURE(h);
    check_cnn_pipeline<pipeline::OneFOneB>(h);
    check_cnn_pipeline<pipeline::ZeroBubbleH1>(h);
  }
}
