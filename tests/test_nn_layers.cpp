// Embedding (replicated, vocabulary-sharded rowwise, dim-sharded colwise), Dropout
// (the single-device mask whatever the placements), and the optimizers (SGD with
// momentum and weight decay, AdamW, clipping by the global norm) against hand-written
// references, on 1-D meshes of 1 to 4 ranks and on 2x2 and 2x3 meshes.
#include <cmath>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>

#include "compare.hpp"
#include "nn_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

constexpr int64_t kVocab = 11, kDim = 6, kBatch = 5;

template <class Cfg, class Style, int M>
void check_embedding(Comm& comm, const std::array<int, M>& shape) {
  DeviceMesh<M> mesh(comm, shape);
  using Emb = nn::Embedding<Cfg, kVocab, kDim, Style>;
  using Model = nn::Sequential<Emb>;
  Model model{Emb(mesh, 5)};
  static_assert(std::is_same_v<typename Model::InputT, typename Emb::input_type>);
  auto ids = dtensor::detail::generate<typename Model::InputT>(
      {kBatch}, mesh, {}, [](uint64_t i) { return static_cast<int64_t>((i * 7 + 3) % kVocab); });
  auto dy = random<typename Model::OutputT>({kBatch, kDim}, mesh, 9);
  model.zero_grad();
  CommCounter c;
  auto y = model.forward(ids);
  model.backward(dy);
  static constexpr auto plan = Model::plan(Model::output_placements, 0);
  CHECK(c.count() == plan.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()));
  auto& emb = model.template layer<0>();
  const Mat table = as_mat(emb.table().value().full_tensor()), Y = as_mat(y.full_tensor()), DY = as_mat(dy.full_tensor());
  Mat grad_ref = Mat::Zero(kVocab, kDim);
  for (int64_t i = 0; i < kBatch; ++i) {
    const int64_t id = (i * 7 + 3) % kVocab;
    CHECK(max_abs_diff(Y.row(i), table.row(id)) == 0.0);
    grad_ref.row(id) += DY.row(i);
  }
  using TT = typename Emb::TableT;
  const Mat grad = as_mat(TT(mesh, emb.table().value().layout(), emb.table().grad()).full_tensor());
  CHECK(max_abs_diff(grad, grad_ref) < 1e-14);
}

using Tp1 = nn::Config<double, 2, nn::Axes<1, nn::kNone, 0>>;
using DpTp = nn::Config<double, 2, nn::Axes<2, 0, 1>>;

// Rowwise (vocabulary-sharded): the masked lookup's Partial is all-reduced, once.
using RowEmb = nn::Sequential<nn::Embedding<Tp1, kVocab, kDim, nn::Rowwise>>;
static constexpr auto row_plan = RowEmb::plan(RowEmb::output_placements, 0);
static_assert(row_plan.count(nn::Phase::Forward, StepKind::AllReduce) == 1 && row_plan.count(nn::Phase::Backward) == 0);
using ColEmb = nn::Sequential<nn::Embedding<DpTp, kVocab, kDim, nn::Colwise>>;
static constexpr auto col_plan = ColEmb::plan(ColEmb::output_placements, 0);
static_assert(col_plan.count(nn::Phase::Forward) == 0 && col_plan.count(nn::Phase::GradReduce, StepKind::AllReduce, 0) == 1);

}  // namespace

TEST_CASE("Embedding: replicated, rowwise (vocabulary sharded) and colwise, against the table's rows") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [&](Comm& comm) {
      check_embedding<Tp1, nn::NoParallel, 1>(comm, {n});
      check_embedding<Tp1, nn::Rowwise, 1>(comm, {n});
      check_embedding<Tp1, nn::Colwise, 1>(comm, {n});
    });
  for (auto shape : {std::array<int, 2>{2, 2}, std::array<int, 2>{2, 3}})
    spmd(shape[0] * shape[1], [&](Comm& comm) {
      check_embedding<DpTp, nn::Rowwise, 2>(comm, shape);
      check_embedding<DpTp, nn::Colwise, 2>(comm, shape);
    });
}

TEST_CASE("Embedding: a token id outside the vocabulary is an error") {
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm, {2});
    nn::Embedding<Tp1, kVocab, kDim, nn::Rowwise> emb(mesh);
    auto ids = dtensor::detail::generate<DTensor<int64_t, 1, Replicate>>({3}, mesh, {},
                                                                         [](uint64_t i) { return int64_t(i) * 6; });
    CHECK_THROWS_WITH_AS(emb.forward(ids), doctest::Contains("outside the vocabulary"), InvalidArgument);
  });
}

TEST_CASE("Dropout: the single-device mask whatever the placements; backward applies it") {
  using Cfg = nn::Config<double, 2, nn::Axes<2, 0, 1>>;
  constexpr double p = 0.3;
  Tensor<double, 2> ref_y, ref_dx;
  for (auto shape : {std::array<int, 2>{1, 1}, std::array<int, 2>{2, 2}, std::array<int, 2>{2, 3}})
    spmd(shape[0] * shape[1], [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, shape);
      nn::Dropout<Cfg> drop(p, 42);
      // Sharded on both dims (uneven), and a replicated tensor.
      auto x = random<DTensor<double, 2, Shard<0>, Shard<1>>>({9, 7}, mesh, 1);
      auto dy = random<DTensor<double, 2, Shard<0>, Shard<1>>>({9, 7}, mesh, 2);
      drop.forward(x);  // step 0
      auto y = drop.forward(x);  // step 1: a different mask
      auto dx = drop.backward(dy);
      const auto Y = y.full_tensor(), DX = dx.full_tensor(), X = x.full_tensor(), DYf = dy.full_tensor();
      int kept = 0;
      for (int64_t i = 0; i < 63; ++i) {
        const bool k = nn::Dropout<Cfg>::kept(42, 1, static_cast<uint64_t>(i), p);
        kept += k;
        CHECK(Y.data()[i] == doctest::Approx(k ? X.data()[i] / (1 - p) : 0.0).epsilon(1e-15));
        CHECK(DX.data()[i] == doctest::Approx(k ? DYf.data()[i] / (1 - p) : 0.0).epsilon(1e-15));
      }
      CHECK(kept > 30);
      CHECK(kept < 60);
      auto r = random<DTensor<double, 2, Replicate, Replicate>>({9, 7}, mesh, 1);
      nn::Dropout<Cfg> drop2(p, 42);
      drop2.forward(r);
      const auto Yr = drop2.forward(r).full_tensor();
      CHECK(Yr == Y);
      drop2.train(false);
      CHECK(drop2.forward(r).full_tensor() == r.full_tensor());
    });
}

namespace {
using Cfg1 = nn::Config<double, 2, nn::Axes<1, nn::kNone, 0>>;
using OneLinear = nn::Sequential<nn::Linear<Cfg1, 3, 4, nn::Colwise>>;

// Sets every gradient to a known function of the global index and returns the
// global (weight, bias) values and gradients.
template <class Model>
void set_grads(Model& m, const DeviceMesh<1>& mesh, double scale) {
  m.for_each_parameter([&](auto& p) {
    using DT = typename std::decay_t<decltype(p)>::dtensor_type;
    auto g = dtensor::detail::generate<DT>(p.value().shape(), mesh, {},
                                           [&](uint64_t i) { return scale * (double(i) - 2.5); });
    std::copy_n(g.local().data(), g.local().numel(), p.grad().data());  // in place: buckets hold the buffer
  });
}
}  // namespace

TEST_CASE("SGD (momentum, weight decay, Nesterov) and AdamW update sharded parameters like the formulas") {
  for (int n = 1; n <= 3; ++n)
    spmd(n, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {n});
      for (int kind = 0; kind < 3; ++kind) {
        OneLinear model{nn::Linear<Cfg1, 3, 4, nn::Colwise>(mesh, {7})};
        auto& w = model.template layer<0>().weight();
        const Mat w0 = as_mat(w.value().full_tensor());
        Mat ref = w0, buf, m1 = Mat::Zero(3, 4), v1 = Mat::Zero(3, 4);
        nn::SGD sgd({.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = kind == 1});
        nn::AdamW adam({.lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1});
        for (int step = 1; step <= 3; ++step) {
          set_grads(model, mesh, 0.1 * step);
          Mat g(3, 4);
          for (int i = 0; i < 12; ++i) g.data()[i] = 0.1 * step * (i - 2.5);
          if (kind < 2) {
            sgd.step(model);
            Mat gg = g + 0.01 * ref;
            buf = step == 1 ? gg : Mat(0.9 * buf + gg);
            ref -= 0.1 * (kind == 1 ? Mat(gg + 0.9 * buf) : buf);
          } else {
            adam.step(model);
            ref *= 1 - 0.01 * 0.1;
            m1 = 0.9 * m1 + 0.1 * g;
            v1 = 0.99 * v1 + 0.01 * g.cwiseProduct(g);
            const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.99, step);
            ref.array() -= 0.01 / bc1 * m1.array() / ((v1.array() / bc2).sqrt() + 1e-8);
          }
        }
        CHECK(max_abs_diff(as_mat(w.value().full_tensor()), ref) < 1e-14);
      }
    });
}

TEST_CASE("clip_grad_norm: the global norm over sharded and replicated gradients, counted once") {
  for (int n = 1; n <= 4; ++n)
    spmd(n, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm, {n});
      // Colwise weight (Shard<1>) and bias (Shard<0>), rowwise bias (Replicate).
      nn::Sequential<nn::Linear<Cfg1, 3, 4, nn::Colwise>, nn::Linear<Cfg1, 4, 2, nn::Rowwise>> model{
          nn::Linear<Cfg1, 3, 4, nn::Colwise>(mesh), nn::Linear<Cfg1, 4, 2, nn::Rowwise>(mesh)};
      set_grads(model, mesh, 1.0);
      double ref = 0;
      for (int64_t size : {12, 4, 8, 2})
        for (int64_t i = 0; i < size; ++i) ref += (double(i) - 2.5) * (double(i) - 2.5);
      ref = std::sqrt(ref);
      CommCounter c;
      CHECK(nn::clip_grad_norm(model, 1e9) == doctest::Approx(ref).epsilon(1e-14));
      CHECK(c.count() == 1);
      CHECK(nn::clip_grad_norm(model, 1.0) == doctest::Approx(ref).epsilon(1e-14));
      CHECK(nn::clip_grad_norm(model, 1e9) == doctest::Approx(1.0).epsilon(1e-5));
    });
}
