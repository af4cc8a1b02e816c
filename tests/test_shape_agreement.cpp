// Ranks that disagree about a global shape get one clear error on every rank, never
// numbers: the fills (full, zeros, ones, rand, randn) compare the shape and splits
// each rank passed; batch norm, group norm and the losses fold the same comparison
// into the all-reduce of their sums (comm/agreement.hpp). Rank 3 believes another
// batch (or image height, or class count) than the others, on a 1-D mesh of 4 and on
// 2x2 and 4x1 meshes, in-process and under MPI.
#include <array>
#include <string>

#include <doctest/doctest.h>
#include <dtensor/cnn.hpp>
#include <dtensor/nn.hpp>

#include "spmd.hpp"

using namespace dtensor;
using namespace dtensor::test;

namespace {

// Every rank must throw InvalidArgument with a message holding `what`.
template <class F>
void every_rank_refuses(F&& f, const std::string& what) {
  CHECK_THROWS_WITH_AS(f(), doctest::Contains(what.c_str()), InvalidArgument);
}

// A tensor of type DT whose global shape each rank believes to be `shape`: built
// without the fills' check, as a program that computes its shapes on each rank does.
template <class DT>
DT believed(const Shape<DT::rank>& shape, const typename DT::Mesh& mesh, uint64_t seed) {
  return dtensor::detail::generate<DT>(shape, mesh, {}, [&](uint64_t i) {
    return dtensor::detail::normal_value<double>(seed, i);
  });
}

int64_t batch_of(const Comm& comm) { return comm.rank() == 3 ? 20 : 16; }

}  // namespace

TEST_CASE("fills: a rank that passes another global shape or other splits gets the error on every rank") {
  for (bool two_d : {false, true})
    spmd(4, [&](Comm& comm) {
      auto run = [&](auto&& mesh) {
        const std::array<int64_t, 2> shape{batch_of(comm), 3};
        const std::string msg = "rank 3 passed [20, 3] where rank 0 passed [16, 3]";
        every_rank_refuses([&] { (void)full<double, Shard<0>, Replicate>(shape, mesh, 1.0); }, msg);
        every_rank_refuses([&] { (void)zeros<float, Replicate, Shard<1>>(shape, mesh); }, msg);
        every_rank_refuses([&] { (void)ones<int, Shard<0>, Shard<1>>(shape, mesh); }, msg);
        every_rank_refuses([&] { (void)rand<double, Shard<0>, Replicate>(shape, mesh, 1); }, msg);
        every_rank_refuses([&] { (void)randn<float, Replicate, Replicate>(shape, mesh, 1); }, msg);
        // The same shape, other block sizes.
        Splits<2> splits;
        splits[0] = comm.rank() == 3 ? std::vector<int64_t>{10, 6} : std::vector<int64_t>{8, 8};
        const std::array<int64_t, 2> agreed_shape{16, 3};
        every_rank_refuses([&] { (void)zeros<double, Shard<0>, Replicate>(agreed_shape, mesh, splits); },
                           "different splits");
        // Agreeing ranks pass, and the check is one collective; LayoutCheck::Trust skips it.
        CommCounter counter;
        (void)zeros<double, Shard<0>, Replicate>(agreed_shape, mesh);
        CHECK(counter.count() == 1);
        (void)zeros<double, Shard<0>, Replicate>(agreed_shape, mesh, {}, LayoutCheck::Trust);
        CHECK(counter.count() == 1);
      };
      if (two_d) run(DeviceMesh<2>(comm, {2, 2}));
      else run(DeviceMesh<2>(comm, {4, 1}));
    });
  spmd(4, [&](Comm& comm) {  // a 1-D mesh
    DeviceMesh<1> mesh(comm);
    const std::array<int64_t, 1> shape{batch_of(comm)};
    every_rank_refuses([&] { (void)zeros<double, Shard<0>>(shape, mesh); },
                       "rank 3 passed [20] where rank 0 passed [16]");
  });
}

TEST_CASE("batch norm and group norm: a rank that believes another batch or height gets the error on every rank") {
  using DpH = nn::ImageConfig<double, 2, nn::DomainAxes<2, 0, 1, nn::kNone>>;  // batch x H on 2x2
  using Dp = nn::ImageConfig<double, 2, nn::DomainAxes<1, 0, nn::kNone, nn::kNone>>;  // batch over 4
  using H = nn::ImageConfig<double, 2, nn::DomainAxes<1, nn::kNone, 0, nn::kNone>>;   // H over 4
  spmd(4, [&](Comm& comm) {
    {
      DeviceMesh<1> mesh(comm);
      nn::Sequential<nn::BatchNorm<Dp, 3>> bn{nn::BatchNorm<Dp, 3>(mesh)};
      const auto x = believed<typename decltype(bn)::InputT>({batch_of(comm), 3, 5, 4}, mesh, 1);
      every_rank_refuses([&] { (void)bn.forward(x); }, "batch_norm2d: the ranks of its all-reduce disagree");
      // Agreeing ranks: the same model runs.
      (void)bn.forward(believed<typename decltype(bn)::InputT>({16, 3, 5, 4}, mesh, 1));
    }
    {
      DeviceMesh<2> mesh(comm, {2, 2});
      nn::Sequential<nn::BatchNorm<DpH, 3>> bn{nn::BatchNorm<DpH, 3>(mesh)};
      const auto x = believed<typename decltype(bn)::InputT>({batch_of(comm), 3, 5, 4}, mesh, 1);
      every_rank_refuses([&] { (void)bn.forward(x); }, "disagree on the global shape of its input");
    }
    {
      DeviceMesh<1> mesh(comm);  // the image's height, believed differently
      nn::Sequential<nn::GroupNorm<H, 4, 2>> gn{nn::GroupNorm<H, 4, 2>(mesh)};
      const auto x = believed<typename decltype(gn)::InputT>({2, 4, comm.rank() == 3 ? 11 : 9, 4}, mesh, 2);
      every_rank_refuses([&] { (void)gn.forward(x); }, "group_norm: the ranks of its all-reduce disagree");
    }
  });
}

TEST_CASE("losses of a data-parallel model: a rank with another batch, or class count, gets the error on every rank") {
  using Dp1 = nn::Config<double, 2, nn::Axes<1, 0, nn::kNone>>;     // batch over a 1-D mesh of 4
  using Dp41 = nn::Config<double, 2, nn::Axes<2, 0, nn::kNone>>;    // batch over the 4 of a 4x1 mesh
  using Tp = nn::Config<double, 2, nn::Axes<1, nn::kNone, 0>>;      // classes over 4
  spmd(4, [&](Comm& comm) {
    const int64_t batch = batch_of(comm);
    {
      DeviceMesh<1> mesh(comm);
      using Loss = nn::CrossEntropy<Dp1, nn::replicate()>;
      const auto z = believed<Loss::Logits>({batch, 5}, mesh, 3);
      Tensor<int64_t, 1> y({z.local().shape()[0]});  // class 0 for every row
      Loss loss;
      every_rank_refuses([&] { (void)loss.forward(z, y); }, "cross_entropy: the ranks of its all-reduce disagree");
      nn::MSELoss<Dp1> mse;
      const auto t = believed<Loss::Logits>({batch, 5}, mesh, 4);
      every_rank_refuses([&] { (void)mse.forward(z, t); }, "MSELoss: the ranks of its all-reduce disagree");
    }
    {
      DeviceMesh<2> mesh(comm, {4, 1});
      using Loss = nn::CrossEntropy<Dp41, nn::replicate()>;
      const auto z = believed<Loss::Logits>({batch, 5}, mesh, 3);
      Tensor<int64_t, 1> y({z.local().shape()[0]});
      Loss loss;
      every_rank_refuses([&] { (void)loss.forward(z, y); }, "cross_entropy: the ranks of its all-reduce disagree");
    }
    {
      DeviceMesh<1> mesh(comm);  // loss parallel: rank 3 splits 9 classes where the others split 7
      using Loss = nn::CrossEntropy<Tp, nn::shard(1)>;
      const auto z = believed<Loss::Logits>({6, comm.rank() == 3 ? 9 : 7}, mesh, 5);
      Tensor<int64_t, 1> y({6});
      Loss loss;
      every_rank_refuses([&] { (void)loss.forward(z, y); }, "cross_entropy: the ranks of its all-reduce disagree");
    }
  });
}
