// Property: any chain of redistributions preserves the global value. 1000 seeded
// random chains of 5 to 8 steps over random shapes, on 1-D and 2-D meshes; the
// value is checked after every step (reconstruct) and at the end (full_tensor).
#include "conformance.hpp"

#include <optional>
#include <random>
#include <variant>

using namespace dtensor;
using namespace dtensor::test;

namespace {


// Calls f.template operator()<I>() for the runtime index i < N.
template <std::size_t N, class F>
void with_index(std::size_t i, F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((i == I ? (f.template operator()<I>(), true) : false) || ...);
  }(std::make_index_sequence<N>{});
}

template <class List>
struct ChainRunner;
template <class... S>  // S are Placements<...> lists
struct ChainRunner<std::tuple<S...>> {
  using States = std::tuple<S...>;
  static constexpr std::size_t N = sizeof...(S);

  template <class P>
  struct Make;
  template <class... P>
  struct Make<Placements<P...>> {
    using type = DTensor<double, 2, P...>;
    template <class Mesh>
    static type source(const Tensor<double, 2>& g, const Mesh& mesh) {
      return make_source<P...>(g, mesh);
    }
    template <class X>
    static type from(const X& x) {
      return redistribute<P...>(x);
    }
  };
  using Any = std::variant<typename Make<S>::type...>;

  template <class Mesh>
  static int run(const Mesh& mesh, std::mt19937& rng, int chains) {
    int steps_done = 0;
    for (int c = 0; c < chains; ++c) {
      std::uniform_int_distribution<int> extent(0, 11), pick(0, N - 1), length(5, 8);
      const Shape<2> shape{extent(rng), extent(rng)};
      const auto g = iota_tensor<double, 2>(shape);
      std::size_t at = pick(rng);
      std::optional<Any> x;
      with_index<N>(at, [&]<std::size_t I>() { x.emplace(Make<std::tuple_element_t<I, States>>::source(g, mesh)); });
      const int len = length(rng);
      for (int s = 0; s < len;) {
        const std::size_t next = pick(rng);
        bool moved = false;
        std::visit(
            [&](const auto& cur) {
              using Cur = typename std::decay_t<decltype(cur)>::placements;
              with_index<N>(next, [&]<std::size_t J>() {
                using To = std::tuple_element_t<J, States>;
                if constexpr (plannable<Cur, To>) {
                  Any y = Make<To>::from(cur);
                  x.emplace(std::move(y));
                  moved = true;
                }
              });
            },
            *x);
        if (!moved) continue;  // a forbidden transition: draw again
        at = next, ++s, ++steps_done;
        std::visit([&](const auto& cur) { REQUIRE(reconstruct(cur) == g); }, *x);
      }
      std::visit([&](const auto& cur) { REQUIRE(cur.full_tensor() == g); }, *x);
    }
    return steps_done;
  }
};

using States1D = std::tuple<Placements<Replicate>, Placements<Shard<0>>, Placements<Shard<1>>, Placements<Partial<Sum>>,
                            Placements<Partial<Avg>>, Placements<Partial<Max>>, Placements<Partial<Min>>>;
template <class A>
using Row2D = std::tuple<Placements<A, Replicate>, Placements<A, Shard<0>>, Placements<A, Shard<1>>,
                         Placements<A, Partial<Sum>>>;
using States2D = decltype(std::tuple_cat(Row2D<Replicate>{}, Row2D<Shard<0>>{}, Row2D<Shard<1>>{},
                                         Row2D<Partial<Sum>>{}));

}  // namespace

TEST_CASE("1000 random chains of redistributions keep the global value") {
  std::atomic<int> chains{0}, steps{0};
  constexpr int per_mesh = 100;
  for (int n = 1; n <= 5; ++n)
    spmd(n, [&](Comm& comm) {
      std::mt19937 rng(1000 + n);  // the same draws on every rank
      DeviceMesh<1> mesh(comm);
      const int s = ChainRunner<States1D>::run(mesh, rng, per_mesh);
      if (under_mpi() || comm.rank() == 0) chains += per_mesh, steps += s;  // one count per run
    });
  for (auto [a, b] : {std::pair{2, 2}, std::pair{2, 3}, std::pair{3, 2}, std::pair{1, 4}, std::pair{4, 1}})
    spmd(a * b, [&](Comm& comm) {
      std::mt19937 rng(2000 + 10 * a + b);
      DeviceMesh<2> mesh(comm, {a, b});
      const int s = ChainRunner<States2D>::run(mesh, rng, per_mesh);
      if (under_mpi() || comm.rank() == 0) chains += per_mesh, steps += s;  // one count per run
    });
  // Under MPI only the meshes of the job's size run.
  CHECK(chains == (under_mpi() ? chains.load() : 1000));
  CHECK(chains >= 100);
  CHECK(steps >= 5 * chains);
  MESSAGE(chains.load(), " chains, ", steps.load(), " redistributions");
}
