#pragma once
// Gradient accumulation checks shared by the nn tests: passes over micro-batches of
// uneven sizes, without zero_grad between them, against the same model on one rank
// with one pass over the concatenated batch (no reduction there). Inputs and output
// gradients are functions of (seed, global index) only, so every mesh sees the same
// numbers.
#include <array>
#include <optional>
#include <vector>

#include <doctest/doctest.h>
#include <dtensor/nn.hpp>

#include "compare.hpp"
#include "spmd.hpp"

namespace dtensor::test {

// Every parameter's gradient, gathered whole (placed like the parameter after the
// reductions).
template <class Model, class Mesh>
std::vector<std::vector<double>> gathered_grads(Model& model, const Mesh& mesh) {
  std::vector<std::vector<double>> out;
  model.for_each_parameter([&](auto& p) {
    const auto g = p.gradient().full_tensor();
    out.emplace_back(g.data(), g.data() + g.numel());
  });
  (void)mesh;
  return out;
}

// An input or output gradient of the micro-batch [first, first + rows) of a batch
// whose element i is normal_value(seed, i): the same numbers whatever the mesh. An
// output gradient takes the output's blocks (a strided convolution's need not follow
// the chunk rule).
template <class DT>
DT rows_of_batch(Shape<DT::rank> shape, int64_t first, const typename DT::Mesh& mesh, uint64_t seed,
                 const Splits<DT::rank>& blocks = {}) {
  int64_t row = 1;
  for (int d = 1; d < DT::rank; ++d) row *= shape[d];
  const uint64_t offset = static_cast<uint64_t>(first * row);
  return dtensor::detail::generate<DT>(shape, mesh, blocks, [&](uint64_t i) {
    return dtensor::detail::normal_value<double>(seed, offset + i);
  });
}

// Reducing: every backward reduces. NoSync: every backward but the last runs inside
// model.no_sync(), and issues no gradient reduction (checked with CommCounter).
enum class Accumulate { Reducing, NoSync };

// passes micro-batches of `batches` rows, accumulated; the gradients.
template <class Model, int M, class Make>
std::vector<std::vector<double>> accumulate(Comm& comm, const std::array<int, M>& shape, Make make,
                                            const std::vector<int64_t>& batches, Shape<Model::InputT::rank> in,
                                            Shape<Model::OutputT::rank> out, Accumulate mode = Accumulate::Reducing) {
  static constexpr auto plan = Model::plan(Model::OutputT::placement_state, 1);
  DeviceMesh<M> mesh(comm, shape);
  Model model = make(mesh);
  model.set_bucket_bytes(200);  // several buckets
  model.zero_grad();
  int64_t first = 0;
  for (std::size_t pass = 0; pass < batches.size(); ++pass) {
    const bool quiet = mode == Accumulate::NoSync && pass + 1 < batches.size();
    std::optional<typename Model::NoSync> guard;
    if (quiet) guard.emplace(model.no_sync());
    in[0] = out[0] = batches[pass];
    const auto x = rows_of_batch<typename Model::InputT>(in, first, mesh, 11);
    CommCounter c;
    const auto y = model.forward(x);
    REQUIRE(y.shape() == out);
    model.backward(rows_of_batch<typename Model::OutputT>(out, first, mesh, 12, y.layout().blocks));
    if (quiet)
      CHECK(c.count() == plan.count(nn::Phase::Forward) + plan.count(nn::Phase::Backward) -
                             plan.count_gradient_sync(nn::Phase::Backward));
    first += batches[pass];
  }
  CHECK(model.syncing());
  return gathered_grads(model, mesh);
}

template <class Model, int M, class Make>
void check_accumulation(const std::array<int, M>& shape, Make make, const Shape<Model::InputT::rank>& in,
                        const Shape<Model::OutputT::rank>& out, Accumulate mode = Accumulate::Reducing) {
  const std::vector<int64_t> batches{5, 3, 4};  // uneven over every mesh below
  for (std::size_t passes = 1; passes <= batches.size(); ++passes) {
    const std::vector<int64_t> mine(batches.begin(), batches.begin() + static_cast<std::ptrdiff_t>(passes));
    int64_t total = 0;
    for (int64_t b : mine) total += b;
    std::vector<std::vector<double>> want;
    run_threads(1, [&](Comm& comm) {
      std::array<int, M> one;
      one.fill(1);
      want = accumulate<Model, M>(comm, one, make, {total}, in, out);
    });
    int n = 1;
    for (int s : shape) n *= s;
    spmd(n, [&](Comm& comm) {
      INFO(passes, " passes on a mesh of ", n, " ranks", mode == Accumulate::NoSync ? ", no_sync" : "");
      const auto got = accumulate<Model, M>(comm, shape, make, mine, in, out, mode);
      REQUIRE(got.size() == want.size());
      for (std::size_t k = 0; k < want.size(); ++k) {
        INFO("parameter ", k);
        REQUIRE(got[k].size() == want[k].size());
        CHECK(max_abs_diff(got[k].data(), want[k].data(), static_cast<int64_t>(want[k].size())) < 1e-11);
      }
    });
  }
}

}  // namespace dtensor::test
