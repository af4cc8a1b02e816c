#pragma once
// Shared pieces of the nn tests: tensors whose global values depend on (seed, index)
// only, so that a model on any mesh and the same model on one rank see the same data,
// and Eigen views of gathered tensors for the single-rank references.
#include <algorithm>
#include <array>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>

#include "compare.hpp"
#include "spmd.hpp"

namespace dtensor::test {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A DTensor of type DT with standard normal values, element i a function of (seed, i).
template <class DT>
DT random(const Shape<DT::rank>& shape, const typename DT::Mesh& mesh, uint64_t seed) {
  return dtensor::detail::generate<DT>(shape, mesh, {},
                                       [&](uint64_t i) { return dtensor::detail::normal_value<double>(seed, i); });
}

// A tensor as a [rows, last dim] matrix.
template <int R>
Mat as_mat(const Tensor<double, R>& t) {
  const int64_t cols = t.shape()[R - 1];
  return Eigen::Map<const Mat>(t.data(), t.numel() / std::max<int64_t>(cols, 1), cols);
}

// f(mesh) on an in-process mesh of M dims, each of size 1: the single-rank reference
// the distributed runs are compared with.
template <int M, class F>
void on_one_rank(F&& f) {
  run_threads(1, [&](Comm& comm) {
    std::array<int, M> one;
    one.fill(1);
    const DeviceMesh<M> mesh(comm, one);
    f(mesh);
  });
}

// The input gradient dx of a one-rank model against central differences of
// sum(model(x) * dy) at elements `at`, each forward on a fresh model from make().
template <class X, class DX, class DY, class Make>
void check_input_gradient_fd(const X& x, const DX& dx, const DY& dy, Make&& make,
                             std::initializer_list<int64_t> at) {
  auto loss = [&](const X& xi) {
    auto m = make();
    const auto yi = m.forward(xi);
    double l = 0;
    for (int64_t k = 0; k < yi.local().numel(); ++k) l += yi.local().data()[k] * dy.local().data()[k];
    return l;
  };
  for (int64_t i : at) {
    INFO("element ", i);
    const double h = 1e-6;
    auto xp = x, xm = x;
    xp.local().data()[i] += h, xm.local().data()[i] -= h;
    CHECK(dx.local().data()[i] == doctest::Approx((loss(xp) - loss(xm)) / (2 * h)).epsilon(1e-7));
  }
}

// Each parameter's gradient of a one-rank `layer` (after its backward of dy) against
// central differences of sum(layer(x) * dy) at two elements (the second and the
// second-to-last), each forward on a fresh make() with that element moved.
template <class L, class X, class DY, class Make>
void check_parameter_gradients_fd(L& layer, const X& x, const DY& dy, Make&& make) {
  int index = 0;
  nn::for_each_parameter(layer, [&](auto& p) {
    const int64_t n = p.value().local().numel();
    for (int64_t e : {std::min<int64_t>(1, n - 1), std::max<int64_t>(n - 2, 0)}) {
      auto loss = [&](double delta) {
        auto m = make();
        int k = 0;
        nn::for_each_parameter(m, [&](auto& q) {
          if (k++ == index) q.value().local().data()[e] += delta;
        });
        const auto ym = m.forward(x);
        double l = 0;
        for (int64_t i = 0; i < ym.local().numel(); ++i) l += ym.local().data()[i] * dy.local().data()[i];
        return l;
      };
      INFO(p.name(), " element ", e);
      const double h = 1e-6;
      CHECK(p.grad().data()[e] == doctest::Approx((loss(h) - loss(-h)) / (2 * h)).epsilon(1e-7));
    }
    ++index;
  });
}

// What one forward and backward of a model gave, gathered whole: the output, the
// input's gradient, each parameter's gradient after the model's reductions, and the
// block realignments (distributed/realign.hpp) rank 0 ran.
struct GatheredStep {
  std::vector<double> y, dx;
  std::vector<std::vector<double>> grads;
  int exchanges = 0;
};
template <class T, int R>
std::vector<double> flat(const Tensor<T, R>& t) {
  return std::vector<double>(t.data(), t.data() + t.numel());
}
// Every value within `tol` of the reference (a NaN fails).
inline void check_same(const GatheredStep& got, const GatheredStep& want, double tol) {
  REQUIRE(got.y.size() == want.y.size());
  CHECK(max_abs_diff(got.y.data(), want.y.data(), static_cast<int64_t>(want.y.size())) < tol);
  REQUIRE(got.dx.size() == want.dx.size());
  CHECK(max_abs_diff(got.dx.data(), want.dx.data(), static_cast<int64_t>(want.dx.size())) < tol);
  REQUIRE(got.grads.size() == want.grads.size());
  for (std::size_t k = 0; k < want.grads.size(); ++k) {
    INFO("parameter ", k);
    REQUIRE(got.grads[k].size() == want.grads[k].size());
    CHECK(max_abs_diff(got.grads[k].data(), want.grads[k].data(), static_cast<int64_t>(want.grads[k].size())) < tol);
  }
}

// A tensor of type DT with standard normal values, element i of the whole a function of
// (seed, i), split into `blocks` (empty: the chunk rule).
template <class DT>
DT normal_rows(Shape<DT::rank> shape, const typename DT::Mesh& mesh, uint64_t seed,
               const Splits<DT::rank>& blocks = {}) {
  return dtensor::detail::generate<DT>(shape, mesh, blocks,
                                       [&](uint64_t i) { return dtensor::detail::normal_value<double>(seed, i); });
}

// One forward and backward of a model (a Sequential) with an input gradient: the
// gathered output, input gradient and parameter gradients after the model's
// reductions. Checks the collectives and point-to-point exchanges (rings) CommCounter
// saw against the model's constexpr plan (whose counts do not depend on the features
// it is given: they size bytes).
template <class Model, class Mesh>
GatheredStep model_step(Model& model, const Mesh& mesh, Shape<Model::InputT::rank> in,
                        Shape<Model::OutputT::rank> out) {
  static constexpr auto plan = Model::plan(Model::output_placements, 1, true);
  model.zero_grad();
  const auto x = normal_rows<typename Model::InputT>(in, mesh, 11);
  CommCounter c;
  const auto y = model.forward(x);
  const auto dx = model.template backward<true>(normal_rows<typename Model::OutputT>(out, mesh, 12, y.layout().blocks));
  CHECK(c.count() == plan.step_collectives(model.bucket_bytes(), sizeof(double), mesh.shape(), mesh.coords()));
  CHECK(c.exchanges() == plan.ring_exchanges(nn::Phase::Forward, mesh.shape()) +
                             plan.ring_exchanges(nn::Phase::Backward, mesh.shape()));
  GatheredStep r{flat(y.full_tensor()), flat(dx.full_tensor()), {}, 0};
  model.for_each_parameter([&](auto& p) { r.grads.push_back(flat(p.gradient().full_tensor())); });
  return r;
}

// The model make(mesh) on a mesh of `shape` against the same model on one rank, one
// step each (in-process, or on the MPI world when it has that many processes).
template <class Model, int M, class Make>
void check_against_one_rank(const std::array<int, M>& shape, Make make, const Shape<Model::InputT::rank>& in,
                            const Shape<Model::OutputT::rank>& out, double tol) {
  GatheredStep want;
  on_one_rank<M>([&](const DeviceMesh<M>& mesh) {
    Model model = make(mesh);
    want = model_step(model, mesh, in, out);
  });
  int n = 1;
  for (int s : shape) n *= s;
  spmd(n, [&](Comm& comm) {
    DeviceMesh<M> mesh(comm, shape);
    INFO("mesh ", mesh.to_string());
    Model model = make(mesh);
    check_same(model_step(model, mesh, in, out), want, tol);
  });
}

// A layer L built around a leaf block: L is the block (make_block(seed)), or a wrapper
// (nn::Recompute's block_type, nn::FullyShard's inner_type) built from what it wraps.
template <class L, class Leaf, class MakeBlock>
L wrapped_layer(MakeBlock&& make_block, uint64_t seed) {
  if constexpr (std::is_same_v<L, Leaf>) return make_block(seed);
  else if constexpr (requires { typename L::block_type; })
    return L(wrapped_layer<typename L::block_type, Leaf>(make_block, seed));
  else return L(wrapped_layer<typename L::inner_type, Leaf>(make_block, seed));
}

// The host bytes one forward, loss and backward of `model` allocate above what is held
// before them (host_memory_peak counts the process's tensors: one rank in-process, each
// process under MPI); the gradients zeroed first.
template <class Model, class Loss, class X, class Y>
int64_t backward_peak(Model& model, Loss& loss, const X& x, const Y& target) {
  model.zero_grad();
  const int64_t before = host_memory_in_use();
  reset_host_memory_peak();
  const auto y = model.forward(x);
  (void)loss.forward(y, target);
  model.backward(loss.backward(y));
  return host_memory_peak() - before;
}

// Every parameter of a model, gathered whole, in for_each_parameter's order.
template <class Model>
std::vector<std::vector<double>> gathered_parameters(Model& model) {
  std::vector<std::vector<double>> out;
  model.for_each_parameter([&](auto& p) {
    const auto f = p.value().full_tensor();
    out.emplace_back(f.data(), f.data() + f.numel());
  });
  return out;
}

}  // namespace dtensor::test
