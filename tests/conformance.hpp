#pragma once
// The redistribution conformance check: for a pair of placement lists, a mesh and a
// global shape, build the source from an independent construction, redistribute,
// and compare the result's layout and data with the references of support.hpp.
#include <tuple>

#include "support.hpp"

namespace dtensor::test {

template <class From, class To>
inline constexpr bool plannable = [] {
  constexpr auto a = Redistribution<From, From>::from;  // validates nothing: just the descs
  constexpr auto b = Redistribution<To, To>::from;
  for (std::size_t m = 0; m < a.size(); ++m)
    if (transition_error(a[m], b[m]) != TransitionError::None) return false;
  return true;
}();

template <class T, class From, class To>
struct Transition;
template <class T, class... P, class... Q>
struct Transition<T, Placements<P...>, Placements<Q...>> {
  template <int M>
  static void check(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
    const auto g = iota_tensor<T, 2>(shape);
    auto x = make_source<P...>(g, mesh);
    auto y = redistribute<Q...>(x);
    INFO(names<P...>(), " -> ", names<Q...>(), " on ", mesh.to_string(), " shape ", to_string(shape), " ",
         name(dtype_of<T>()), " rank ", mesh.rank());
    constexpr auto qs = describe_all<Q...>();
    const auto [off, ext] = expected_box<2>(shape, qs, mesh.shape(), mesh.coords());
    REQUIRE(y.shape() == shape);
    REQUIRE(y.local_offset() == off);
    REQUIRE(y.local().shape() == ext);
    bool partial = false;
    for (auto q : qs) partial = partial || q.is_partial();
    if (!partial) CHECK(y.local() == box_of(g, off, ext));  // bit for bit
    CHECK(reconstruct(y) == g);
    CHECK(y.full_tensor() == g);
  }
};

// Calls f.template operator()<A, B>() for every pair of types of the tuple.
template <class Tuple, class F>
void for_each_pair(F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (
        [&]<std::size_t A>(std::integral_constant<std::size_t, A>) {
          (f.template operator()<std::tuple_element_t<A, Tuple>, std::tuple_element_t<I, Tuple>>(), ...);
        }(std::integral_constant<std::size_t, I>{}),
        ...);
  }(std::make_index_sequence<std::tuple_size_v<Tuple>>{});
}

// Shapes for a mesh dim of n ranks: even, uneven, smaller than the mesh, empty.
inline std::vector<Shape<2>> shapes_for(int n) {
  return {Shape<2>{2 * n, 3 * n}, Shape<2>{2 * n + 1, 3 * n - 1}, Shape<2>{n - 1, 2}, Shape<2>{3, 0}};
}

}  // namespace dtensor::test
