#pragma once
// Every transition between placement pairs on 2-D meshes (2x2, 2x3, 3x2, and the
// degenerate 1x3 and 2x1), one source group per translation unit so that they build in parallel.
// Per mesh dim: Replicate, Shard<0>, Shard<1>, Partial<Sum>, Partial<Max>
// (Partial<Sum> and Partial<Max> on different mesh dims of one tensor is rejected
// by DTensor, since the order of the two reductions would matter).
#include "conformance.hpp"

namespace dtensor::test {

using PerMeshDim = std::tuple<Replicate, Shard<0>, Shard<1>, Partial<Sum>, Partial<Max>>;

template <class A, class B>
inline constexpr bool valid_pair = !((std::is_same_v<A, Partial<Sum>> && std::is_same_v<B, Partial<Max>>) ||
                                     (std::is_same_v<A, Partial<Max>> && std::is_same_v<B, Partial<Sum>>));

template <class T, class First, class Mesh>
void all_transitions_from(const Mesh& mesh, const Shape<2>& shape) {
  auto for_each = [](auto&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f.template operator()<std::tuple_element_t<I, PerMeshDim>>(), ...);
    }(std::make_index_sequence<std::tuple_size_v<PerMeshDim>>{});
  };
  for_each([&]<class B>() {
    if constexpr (valid_pair<First, B>)
      for_each([&]<class C>() {
        for_each([&]<class D>() {
          using From = Placements<First, B>;
          using To = Placements<C, D>;
          if constexpr (valid_pair<C, D> && plannable<From, To>) Transition<T, From, To>::check(mesh, shape);
        });
      });
  });
}

template <class... First>
void all_2d_transitions_from() {
  for (auto [a, b] : {std::pair{2, 2}, std::pair{2, 3}, std::pair{3, 2}, std::pair{1, 3}, std::pair{2, 1}})
    spmd(a * b, [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, {a, b});
      for (const auto& shape : {Shape<2>{12, 6}, Shape<2>{7, 5}, Shape<2>{3, 1}, Shape<2>{0, 4}}) {
        (all_transitions_from<float, First>(mesh, shape), ...);
        (all_transitions_from<double, First>(mesh, shape), ...);
      }
    });
}

}  // namespace dtensor::test
