// Convolutional models on images sharded in space (nn::Sequential of image layers):
// outputs, every parameter's gradient after the step's reductions, and the input's
// gradient against the same model on one rank, on 1-D meshes over H, a 2x2 mesh over
// H and W, and a DP x H mesh; image extents that do not divide. The gradient
// reductions the model runs are those its constexpr plan lists.
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
