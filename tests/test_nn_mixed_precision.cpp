// nn::MixedPrecision (issue 41, item 4): a replicated DP x TP model computing in
// bfloat16 and trained on float masters, on a 2x2 mesh and on three data-parallel
// ranks (uneven hidden blocks on 2x2), in-process and under MPI. Against independent
// references: a master loop written out here (the model's own bfloat16 reduction,
// widened, stepped by SGD: bit for bit), each rank's unreduced bfloat16 terms summed in
// float64 (the float reduction within its rounding), the one-rank run, and the
// allocator's peak (the memory plan).
#include <cmath>
#include <cstring>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>

#include "mixed_precision_mlp.hpp"
#include "nn_support.hpp"
#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;
using namespace dtensor::test::mixed_mlp;

namespace {

using ReduceBf16 = nn::Precision<float, bfloat16, bfloat16>;
using ReduceFloat = nn::Precision<float, bfloat16>;  // torchtitan's default
template <class Policy>
using Mixed = nn::MixedPrecision<MLP<bfloat16>, Policy>;

static_assert(std::is_same_v<Mixed<ReduceFloat>::reduce_type, float> && Mixed<ReduceFloat>::reduces_masters);
static_assert(std::is_same_v<Mixed<ReduceBf16>::reduce_type, bfloat16> && !Mixed<ReduceBf16>::reduces_masters);
// Every gradient reduction of this model is over mesh dim 0 (DP): the references below
// sum each rank's terms over that dim's communicator.
constexpr bool reductions_over_dp_only() {
  constexpr auto p = MLP<bfloat16>::plan(MLP<bfloat16>::output_placements, 1);
  for (int i = 0; i < p.size; ++i)
    if (p.entries[i].phase == nn::Phase::GradReduce && p.entries[i].mesh_dim != 0) return false;
  return p.count(nn::Phase::GradReduce) > 0;
}
static_assert(reductions_over_dp_only());
// The plan counts a float reduction as two bfloat16 units, a bfloat16 one as one.
constexpr int64_t grad_reduce_elements(const auto& p) {
  int64_t e = 0;
  for (int i = 0; i < p.size; ++i)
    if (p.entries[i].phase == nn::Phase::GradReduce) e += p.entries[i].elements;
  return e;
}
static_assert(grad_reduce_elements(Mixed<ReduceFloat>::training_plan<nn::MSELoss<Cfg<bfloat16>>>(kIn)) ==
              2 * grad_reduce_elements(Mixed<ReduceBf16>::training_plan<nn::MSELoss<Cfg<bfloat16>>>(kIn)));

template <class DT>
DT inputs(const typename DT::Mesh& mesh, int step, int64_t features) {
  return dtensor::detail::generate<DT>({kRows, features}, mesh, {}, [&](uint64_t i) {
    return std::sin(0.37 * static_cast<double>(i) + step) * (1 + 0.1 * step);
  });
}

// Micro-batch mb's forward and backward of a bfloat16 MLP (or a model around one): its
// inputs and output gradient depend on (mb, element) only, the same on every mesh.
template <class Net>
void forward_backward(Net& net, const DeviceMesh<2>& mesh, int mb) {
  const auto y = net.forward(inputs<MLP<bfloat16>::InputT>(mesh, mb, kIn));
  net.backward(normal_rows<MLP<bfloat16>::OutputT>({kRows, kOut}, mesh, 40 + mb, y.layout().blocks));
}

// body(mesh) on a 2x2 mesh (DP x TP, the hidden layer's 29 columns uneven over TP) and on
// three data-parallel ranks, in-process or on an MPI world of that size.
template <class Body>
void on_test_meshes(Body&& body) {
  for (const auto shape : {std::array<int, 2>{2, 2}, std::array<int, 2>{3, 1}})
    spmd(shape[0] * shape[1], [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, shape);
      INFO("mesh ", mesh.to_string());
      body(mesh);
    });
}

// Masters loaded into the model, rounded once; the model's gradients widened into the
// masters': the loop train_cnn wrote by hand before MixedPrecision, here the reference.
struct HandMasters {
  template <class Model, class Master>
  static void load(Model& model, Master& master) {
    std::vector<float*> v;
    master.for_each_parameter([&](auto& p) { v.push_back(p.value().local().data()); });
    std::size_t k = 0;
    model.for_each_parameter([&](auto& p) {
      auto* d = p.value().local().data();
      for (int64_t i = 0; i < p.value().local().numel(); ++i) d[i] = bfloat16(v[k][i]);
      ++k;
    });
  }
  template <class Model, class Master>
  static void store_gradients(Model& model, Master& master) {
    std::vector<float*> g;
    master.for_each_parameter([&](auto& p) { g.push_back(p.grad().data()); });
    std::size_t k = 0;
    model.for_each_parameter([&](auto& p) {
      for (int64_t i = 0; i < p.grad().numel(); ++i) g[k][i] = float(p.grad().data()[i]);
      ++k;
    });
  }
};

struct Trained {
  std::vector<double> losses;
  std::vector<std::vector<double>> params;
};

// Five SGD steps (momentum) of MixedPrecision<MLP<bfloat16>, ReduceBf16> (masters from a
// float model) or of the hand-written loop, on a mesh of `shape`.
template <bool ByHand>
Trained train(const std::array<int, 2>& shape) {
  Trained r;
  auto body = [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, shape);
    auto f32 = make_mlp<float>(mesh);
    nn::MSELoss<Cfg<bfloat16>> loss;
    nn::SGD sgd({.lr = 0.05, .momentum = 0.9});
    Trained mine;
    using X = MLP<bfloat16>::InputT;
    using Y = MLP<bfloat16>::OutputT;
    const auto x = inputs<X>(mesh, 0, kIn);  // one batch, every step: the loss must fall
    const auto t = inputs<Y>(mesh, 7, kOut);
    auto step = [&](auto&& forward, auto&& backward) {
      const auto y = forward(x);
      mine.losses.push_back(double(loss.forward(y, t)));
      backward(loss.backward(y));
    };
    if constexpr (ByHand) {
      auto model = make_mlp<bfloat16>(mesh);
      for (int s = 0; s < 5; ++s) {
        HandMasters::load(model, f32);
        model.zero_grad();
        f32.zero_grad();
        step([&](const X& x) { return model.forward(x); }, [&](const auto& dy) { model.backward(dy); });
        HandMasters::store_gradients(model, f32);
        sgd.step(f32);
      }
      mine.params = gathered_parameters(f32);
    } else {
      Mixed<ReduceBf16> model(make_mlp<bfloat16>(mesh), f32);
      for (int s = 0; s < 5; ++s) {
        model.zero_grad();
        step([&](const X& x) { return model.forward(x); }, [&](const auto& dy) { model.backward(dy); });
        sgd.step(model);
      }
      mine.params = gathered_parameters(model);
    }
    if (comm.rank() == 0 || under_mpi()) r = std::move(mine);
  };
  if (shape[0] * shape[1] == 1) run_threads(1, body);
  else spmd(shape[0] * shape[1], body);
  return r;
}

}  // namespace

TEST_CASE("MixedPrecision, Reduce = bfloat16: the hand-written master loop, bit for bit, on 2x2 and 3x1 meshes") {
  for (const auto shape : {std::array<int, 2>{2, 2}, std::array<int, 2>{3, 1}, std::array<int, 2>{1, 1}}) {
    INFO("mesh ", shape[0], "x", shape[1]);
    const Trained got = train<false>(shape), want = train<true>(shape);
    if (want.losses.empty()) continue;  // an MPI world of another size
    REQUIRE(got.losses.size() == 5);
    for (std::size_t s = 0; s < want.losses.size(); ++s) CHECK(got.losses[s] == want.losses[s]);
    REQUIRE(got.params.size() == want.params.size());
    for (std::size_t k = 0; k < want.params.size(); ++k) CHECK(got.params[k] == want.params[k]);
    INFO("losses ", got.losses[0], " ", got.losses[1], " ", got.losses[2], " ", got.losses[3], " ", got.losses[4]);
    CHECK(got.losses.back() < got.losses.front());  // and it learns
  }
}

namespace {

// Each rank's gradient terms before any reduction (every micro-batch's bfloat16 terms on
// their own), widened to double and summed over the micro-batches and the DP ranks in
// double: the exact sum the float reduction rounds; and the sum of their magnitudes.
struct Terms {
  std::vector<std::vector<double>> sum, magnitude;
};
template <class Model>
Terms dp_sum_of_terms(Model& plain, const DeviceMesh<2>& mesh, int micro_batches) {
  Terms t;
  for (int mb = 0; mb < micro_batches; ++mb) {
    plain.zero_grad();
    const auto y = plain.forward(inputs<typename Model::InputT>(mesh, mb, kIn));
    plain.template backward_unreduced<false>(
        normal_rows<typename Model::OutputT>({kRows, kOut}, mesh, 40 + mb, y.layout().blocks));
    std::size_t k = 0;
    plain.for_each_parameter([&](auto& p) {
      if (mb == 0) t.sum.emplace_back(p.grad().numel(), 0.0), t.magnitude.emplace_back(p.grad().numel(), 0.0);
      for (int64_t i = 0; i < p.grad().numel(); ++i) {
        t.sum[k][i] += double(p.grad().data()[i]);
        t.magnitude[k][i] += std::fabs(double(p.grad().data()[i]));
      }
      ++k;
    });
  }
  for (auto* v : {&t.sum, &t.magnitude})
    for (auto& s : *v) mesh.comm(0).all_reduce(s.data(), s.data(), s.size(), dtype_of<double>(), ReduceOp::Sum);
  return t;
}

}  // namespace

TEST_CASE("MixedPrecision, Reduce = float: each rank's bfloat16 terms widened, then summed in float (no_sync too)") {
  // Micro-batches accumulated inside no_sync() (one reduction at the end), or each
  // backward reducing without zero_grad between (the masters keep the sums: each
  // reduction must count them once); buckets of 256 bytes, so that the model's 4
  // gradients travel in several.
  struct Run {
    int micro_batches;
    bool sync_each;
  };
  constexpr std::size_t kBucket = 256;
  using Model = Mixed<ReduceFloat>;
  static constexpr auto plan = Model::plan(MLP<bfloat16>::output_placements, 1);
  for (const auto shape : {std::array<int, 2>{2, 2}, std::array<int, 2>{3, 1}}) {
    for (const Run run : {Run{1, false}, Run{3, false}, Run{3, true}}) {
      spmd(shape[0] * shape[1], [&](Comm& comm) {
        DeviceMesh<2> mesh(comm, shape);
        INFO("mesh ", mesh.to_string(), ", micro-batches ", run.micro_batches, run.sync_each ? ", each reducing" : "");
        auto plain = make_mlp<bfloat16>(mesh);
        const Terms want = dp_sum_of_terms(plain, mesh, run.micro_batches);
        Model model(make_mlp<bfloat16>(mesh));
        model.set_bucket_bytes(kBucket);
        model.zero_grad();
        CommCounter counted;
        int syncs = 0;
        for (int mb = 0; mb < run.micro_batches; ++mb) {
          if (mb + 1 < run.micro_batches && !run.sync_each) {
            auto guard = model.no_sync();
            forward_backward(model, mesh, mb);
          } else {
            forward_backward(model, mesh, mb);
            ++syncs;
          }
        }
        // As planned: each pass's forward and backward collectives, and each reducing
        // backward's buckets of float gradients.
        int buckets = 0;
        for (int m = 0; m < 2; ++m)
          buckets += plan.buckets(m, kBucket, Model::reduce_bytes, mesh.shape(), mesh.coords());
        CHECK(buckets > 1);
        const int per_pass = plan.count(nn::Phase::Forward) + plan.count(nn::Phase::Backward);
        CHECK(counted.count() == run.micro_batches * per_pass + syncs * buckets);
        // The gradient reductions: over DP, in float.
        std::size_t reduced_bytes = 0, master_bytes = 0;
        for (const auto& r : counted.records())
          if (r.kind == StepKind::AllReduce && r.mesh_dim == 0) reduced_bytes += r.bytes;
        std::size_t k = 0;
        const int ndp = shape[0];
        model.for_each_parameter([&](auto& p) {
          static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(p)>::value_type, float>);
          master_bytes += static_cast<std::size_t>(p.grad().numel()) * sizeof(float);
          double worst = 0;
          bool exact = true;
          for (int64_t i = 0; i < p.grad().numel(); ++i) {
            const double got = p.grad().data()[i];
            worst = std::max(worst, std::fabs(got - want.sum[k][i]) / (want.magnitude[k][i] + 1e-300));
            exact = exact && p.grad().data()[i] == static_cast<float>(want.sum[k][i]);
          }
          INFO("parameter ", p.name(), ": largest error over the terms' magnitude ", worst);
          // One float rounding per addition: on each rank the adds of its micro-batches'
          // terms, then each reduction's ndp - 1 (the kept sum counted once).
          CHECK(worst <= run.micro_batches * (ndp + 1) * std::ldexp(1.0, -24));
          // Two ranks' single terms: the float sum of two floats is the exact sum rounded once.
          if (run.micro_batches == 1 && ndp == 2) CHECK(exact);
          ++k;
        });
        CHECK(reduced_bytes == static_cast<std::size_t>(syncs) * master_bytes);
      });
    }
  }
}

TEST_CASE("MixedPrecision, Reduce = bfloat16: backwards without zero_grad add each reduced sum once, widened") {
  on_test_meshes([](const DeviceMesh<2>& mesh) {
    auto plain = make_mlp<bfloat16>(mesh);
    Mixed<ReduceBf16> model(make_mlp<bfloat16>(mesh));
    model.zero_grad();
    std::vector<std::vector<double>> want;  // float(R1) + float(R2), R the plain model's reduced bfloat16 sums
    for (int mb = 0; mb < 2; ++mb) {
      plain.zero_grad();
      forward_backward(plain, mesh, mb);
      forward_backward(model, mesh, mb);  // no zero_grad: the masters keep the first sum
      std::size_t k = 0;
      plain.for_each_parameter([&](auto& p) {
        if (mb == 0) want.emplace_back(p.grad().numel(), 0.0);
        for (int64_t i = 0; i < p.grad().numel(); ++i)
          want[k][i] = static_cast<float>(static_cast<float>(want[k][i]) + float(p.grad().data()[i]));
        ++k;
      });
    }
    std::size_t k = 0;
    model.for_each_parameter([&](auto& p) { CHECK(flat(p.grad()) == want[k++]); });
  });
}

TEST_CASE("MixedPrecision, Reduce = bfloat16: no_sync accumulates in the model, reduced once, as a plain model does") {
  on_test_meshes([](const DeviceMesh<2>& mesh) {
    auto plain = make_mlp<bfloat16>(mesh);
    Mixed<ReduceBf16> model(make_mlp<bfloat16>(mesh));
    plain.zero_grad();
    model.zero_grad();
    for (int mb = 0; mb < 3; ++mb) {
      if (mb < 2) {
        auto a = plain.no_sync();
        auto b = model.no_sync();
        forward_backward(plain, mesh, mb), forward_backward(model, mesh, mb);
      } else {
        forward_backward(plain, mesh, mb), forward_backward(model, mesh, mb);
      }
    }
    std::vector<std::vector<double>> want;
    plain.for_each_parameter([&](auto& p) { want.push_back(flat(p.grad())); });
    std::size_t k = 0;
    model.for_each_parameter([&](auto& p) { CHECK(flat(p.grad()) == want[k++]); });
  });
}

TEST_CASE("MixedPrecision: a step on 2x2 and 3x1 meshes against one rank, both reductions, and as planned") {
  auto check = [](auto policy) {
    using Model = Mixed<decltype(policy)>;
    const auto make = [](const DeviceMesh<2>& mesh) { return Model(make_mlp<bfloat16>(mesh)); };
    // bfloat16 against bfloat16: the terms rounded per rank, the sums in float (rtol
    // 1.6e-2 of values up to ~10).
    check_against_one_rank<Model, 2>({2, 2}, make, {kRows, kIn}, {kRows, kOut}, 0.1);
    check_against_one_rank<Model, 2>({3, 1}, make, {kRows, kIn}, {kRows, kOut}, 0.1);
  };
  check(ReduceFloat{});
  check(ReduceBf16{});
}

TEST_CASE_TEMPLATE("MixedPrecision in float16 with GradScaler: an overflow on one rank skips the step on every rank",
                   Policy, nn::Precision<float, float16>, nn::Precision<float, float16, float16>) {
  using Mixed16 = nn::MixedPrecision<MLP<float16>, Policy>;
  // The scaler's check is in the plan when the step says so: one all-reduce of a double
  // over the whole mesh, after the gradient reductions; explain names it.
  static constexpr auto plan = Mixed16::template training_plan<nn::MSELoss<Cfg<float16>>>(kIn);
  static constexpr auto scaled = plan.with_grad_scaler();
  static_assert(scaled.count(nn::Phase::Step, StepKind::AllReduce, -1) == 1 && plan.count(nn::Phase::Step) == 0);
  static_assert(scaled.template bytes<float16>(nn::Phase::Step, kRows, {2, 2}) == 8);
  static_assert(scaled.with_clip_grad_norm().count(nn::Phase::Step) == 2);
  const std::string text = nn::to_string(scaled, kRows, {2, 2}, sizeof(float16));
  CHECK(text.ends_with("optimizer step: nn::GradScaler (is any rank's gradient not finite?): all_reduce over the "
                       "whole mesh, 8 bytes per rank\n"));
  for (const auto shape : {std::array<int, 2>{2, 2}, std::array<int, 2>{3, 1}}) {
    spmd(shape[0] * shape[1], [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, shape);
      INFO("mesh ", mesh.to_string());
      Mixed16 model(make_mlp<float16>(mesh));
      nn::GradScaler scaler({.init_scale = 4.0});
      nn::SGD sgd({.lr = 0.1});
      auto step = [&](double blow_up) {
        CommCounter counted;
        model.zero_grad();
        const auto y = model.forward(inputs<MLP<float16>::InputT>(mesh, 0, kIn));
        // The loss's forward, for its all-reduce (the plan's); its gradient is set by hand.
        nn::MSELoss<Cfg<float16>> mse;
        (void)mse.forward(y, normal_rows<MLP<float16>::OutputT>({kRows, kOut}, mesh, 41, y.layout().blocks));
        auto dy = normal_rows<MLP<float16>::OutputT>({kRows, kOut}, mesh, 40, y.layout().blocks);
        if (comm.rank() == comm.size() - 1)  // this rank's terms overflow float16
          for (int64_t i = 0; i < dy.local().numel(); ++i)
            dy.local().data()[i] = float16(float(dy.local().data()[i]) * static_cast<float>(blow_up));
        model.backward(scaler.scale(std::move(dy)));
        scaler.unscale(model);
        nn::clip_grad_norm(model, 1e30);  // clips nothing: here for its all-reduce
        const bool stepped = scaler.step(sgd, model);
        scaler.update();
        // The model's collectives, the scaler's check and the norm's sum, as planned.
        CHECK(counted.count() == scaled.with_clip_grad_norm().step_collectives(
                                     model.bucket_bytes(), Mixed16::reduce_bytes, mesh.shape(), mesh.coords()));
        return stepped;
      };
      const auto before = gathered_parameters(model);
      CHECK_FALSE(step(1e4));  // 4 x 1e4 x the terms: beyond float16's 65504 on the last rank only
      CHECK(gathered_parameters(model) == before);  // no rank stepped
      CHECK(scaler.get_scale() == 2.0);             // backed off
      CHECK(step(1.0));                              // a clean step steps on every rank
      CHECK(gathered_parameters(model) != before);
    });
  }
}

namespace {

// The memory plan of a wide MLP's step against the allocator (as test_nn_memory_plan):
// the bytes a step allocates above what is held before it.
constexpr int64_t kWideIn = 64, kWide = 768, kBatch = 150;
template <class T>
using WideCfg = nn::Config<T, 2, nn::Axes<2, 0, 1>>;
template <class T>
using Wide = nn::Sequential<nn::Linear<WideCfg<T>, kWideIn, kWide, nn::Colwise>, nn::GELU<WideCfg<T>>,
                            nn::Linear<WideCfg<T>, kWide, kWideIn, nn::Rowwise>>;
template <class Policy>
void check_memory_plan(const DeviceMesh<2>& mesh) {
  using C = WideCfg<bfloat16>;
  using Model = nn::MixedPrecision<Wide<bfloat16>, Policy>;
  const nn::MemoryOptions options{.runtime = under_mpi() ? nn::MemoryOptions::Runtime::Mpi
                                                         : nn::MemoryOptions::Runtime::InProcess};
  const auto plan = Model::template memory_plan<nn::MSELoss<C>, nn::AdamW>({kBatch, kWideIn}, mesh.shape(), options);
  const auto coords = mesh.coords();
  // Both copies of the parameters: the model's in bfloat16 (and its gradients), the
  // masters, their gradients and AdamW's two moments in float (a float model's).
  using F = WideCfg<float>;
  const auto p16 = Wide<bfloat16>::template memory_plan<nn::MSELoss<C>, nn::AdamW>({kBatch, kWideIn}, mesh.shape(),
                                                                                   options);
  const auto p32 =
      Wide<float>::template memory_plan<nn::MSELoss<F>, nn::AdamW>({kBatch, kWideIn}, mesh.shape(), options);
  for (auto use : {nn::MemoryUse::Parameters, nn::MemoryUse::Gradients})
    CHECK(plan.bytes(use, coords) == p16.bytes(use, coords) + p32.bytes(use, coords));
  CHECK(plan.bytes(nn::MemoryUse::OptimizerState, coords) == p32.bytes(nn::MemoryUse::OptimizerState, coords));
  // The allocator's peak is the process's: one rank in-process, each process under MPI.
  if (mesh.size() > 1 && !under_mpi()) return;
  Model model(Wide<bfloat16>(nn::Linear<C, kWideIn, kWide, nn::Colwise>(mesh, {1}), nn::GELU<C>(),
                             nn::Linear<C, kWide, kWideIn, nn::Rowwise>(mesh, {2})));
  nn::MSELoss<C> loss;
  nn::AdamW opt({.lr = 1e-3});
  int64_t measured = 0;
  for (int step = 0; step < 2; ++step) {  // the second: the optimizer's state exists, as in the plan
    const auto x = normal_rows<typename Model::InputT>({kBatch, kWideIn}, mesh, 1 + step);
    const auto target = normal_rows<typename Model::OutputT>({kBatch, kWideIn}, mesh, 3 + step);
    measured = backward_peak(model, loss, x, target);
    opt.step(model);
  }
  const int64_t held = plan.bytes(nn::MemoryUse::Parameters, coords) + plan.bytes(nn::MemoryUse::Gradients, coords) +
                       plan.bytes(nn::MemoryUse::OptimizerState, coords) +
                       plan.bytes(nn::MemoryUse::RunningState, coords) +
                       nn::PlannedTensor<2>::template of<bfloat16>(std::array<int64_t, 2>{kBatch, kWideIn},
                                                                    Model::input_placements)
                           .bytes(plan.mesh_shape, coords);
  const int64_t planned = plan.peak_at(coords).bytes - held;
  INFO("mesh ", mesh.to_string(), ": measured ", measured, " B, planned ", planned, " B");
  CHECK(measured > 0);
  CHECK(planned >= measured);
  CHECK(planned <= measured * 11 / 10);
}

}  // namespace

TEST_CASE("MixedPrecision: the memory plan holds both copies, and a step's peak is the allocator's") {
  on_one_rank<2>([](const DeviceMesh<2>& mesh) {
    check_memory_plan<ReduceFloat>(mesh);
    check_memory_plan<ReduceBf16>(mesh);
  });
  spmd(4, [](Comm& comm) {  // in-process: the plans' bytes only (the threads share one allocator)
    DeviceMesh<2> mesh(comm, {2, 2});
    check_memory_plan<ReduceFloat>(mesh);
    check_memory_plan<ReduceBf16>(mesh);
  });
}
