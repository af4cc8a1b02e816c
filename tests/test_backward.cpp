// Backward passes. redistribute_backward: the exact adjoint of redistribute on every
// pair of placements of 1-D meshes (1 to 4 ranks) and of 2x2 and 2x3 meshes, uneven
// shards included; its placements (the dual rule) as constant expressions; its
// collectives counted.
#include "ops_support.hpp"

#include <dtensor/distributed/redistribute_backward.hpp>
#include <dtensor/ops/backward.hpp>

#include <functional>
#include <numeric>

using namespace dtensor;
using namespace dtensor::test;

namespace {

using R = Replicate;
using S0 = Shard<0>;
using S1 = Shard<1>;
using PS = Partial<Sum>;
using PA = Partial<Avg>;

template <class... P>
constexpr PlacementState<sizeof...(P)> st() {
  return describe_all<P...>();
}

// ---- the placements of redistribute_backward, as constant expressions -----------
// The adjoint of an all-gather is a reduce-scatter back to the shard; of a slice, a
// zero-padded Partial<Sum>; of an all-reduce an all-reduce; a Partial's gradient is
// Replicate whatever arrives.
static_assert(redistribute_backward_placements(st<S0>(), st<PS>()) == st<S0>());
static_assert(redistribute_backward_placements(st<S0>(), st<R>()) == st<S0>());
static_assert(redistribute_backward_placements(st<S0>(), st<S1>()) == st<S0>());
static_assert(redistribute_backward_placements(st<R>(), st<S1>()) == st<PS>());
static_assert(redistribute_backward_placements(st<R>(), st<R>()) == st<R>());
static_assert(redistribute_backward_placements(st<R>(), st<PS>()) == st<PS>());
static_assert(redistribute_backward_placements(st<PS>(), st<R>()) == st<R>());
static_assert(redistribute_backward_placements(st<PS>(), st<PS>()) == st<R>());
static_assert(redistribute_backward_placements(st<PA>(), st<S0>()) == st<R>());
// A slice on the outer mesh dim inside which the inner one still shards the same
// tensor dim: no box of zeros holds the block, so the gradient is all-gathered.
static_assert(redistribute_backward_placements(st<R, S0>(), st<S0, S0>()) == st<R, S0>());
static_assert(redistribute_backward_placements(st<S0, R>(), st<S0, S0>()) == st<S0, PS>());
static_assert(redistribute_backward_placements(st<R, R>(), st<S0, S0>()) == st<PS, PS>());
static_assert(redistribute_backward_placements(st<R, R>(), st<S0, S1>()) == st<PS, PS>());
static_assert(redistribute_backward_placements(st<R, S1>(), st<S0, S1>()) == st<PS, S1>());
// Every result is an acceptable gradient of the forward input.
static_assert(is_gradient_of(redistribute_backward_placements(st<R, S0>(), st<S0, S0>()), st<R, S0>()));
static_assert(is_gradient_of(redistribute_backward_placements(st<PA, R>(), st<S1, PS>()), st<PA, R>()));

// ---- the adjoint identity ---------------------------------------------------------

// The gradients a tensor placed Q may receive on one mesh dim (placement/gradient.hpp).
template <class Q>
struct grad_options;
template <>
struct grad_options<Replicate> {
  using type = std::tuple<Replicate, Partial<Sum>>;
};
template <int D>
struct grad_options<Shard<D>> {
  using type = std::tuple<Shard<D>>;
};
template <class Op>
struct grad_options<Partial<Op>> {
  using type = std::tuple<Replicate>;
};

template <class Tuple, class F>
void for_each_type(F&& f) {
  [&]<class... X>(std::tuple<X...>*) { (f.template operator()<X>(), ...); }(static_cast<Tuple*>(nullptr));
}

// Calls f.template operator()<Placements<G...>>() for every gradient placement list
// of Placements<Q...> (one or two mesh dims).
template <class QList, class F>
void for_each_gradient(F&& f) {
  if constexpr (QList::size == 1) {
    [&]<class Q0>(Placements<Q0>*) {
      for_each_type<typename grad_options<Q0>::type>([&]<class G0>() { f.template operator()<Placements<G0>>(); });
    }(static_cast<QList*>(nullptr));
  } else {
    [&]<class Q0, class Q1>(Placements<Q0, Q1>*) {
      for_each_type<typename grad_options<Q0>::type>([&]<class G0>() {
        for_each_type<typename grad_options<Q1>::type>(
            [&]<class G1>() { f.template operator()<Placements<G0, G1>>(); });
      });
    }(static_cast<QList*>(nullptr));
  }
}

template <int Rank>
double dot(const Tensor<double, Rank>& a, const Tensor<double, Rank>& b) {
  REQUIRE(a.shape() == b.shape());
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data()[i] * b.data()[i];
  return s;
}

// A gradient pattern different from iota_tensor's values.
Tensor<double, 2> grad_pattern(const Shape<2>& s) {
  Tensor<double, 2> t(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<double>((i * 5 + 1) % 13) - 6.5;
  return t;
}

// The collectives the backward needs on one mesh dim of a 1-D mesh, from the table
// in redistribute_backward.hpp.
constexpr StepKind expected_1d(PlacementDesc x, PlacementDesc g, bool* none) {
  *none = false;
  if (x.is_shard()) {
    if (g.is_partial()) return StepKind::ReduceScatter;
    if (g.is_shard() && g.dim != x.dim) return StepKind::AllToAll;
  } else if (x.is_partial()) {
    if (g.is_partial()) return StepKind::AllReduce;
    if (g.is_shard()) return StepKind::AllGather;
  }
  *none = true;
  return StepKind::AllReduce;
}

template <class PL, class QL, class GL>
struct CheckAdjoint;
template <class... P, class... Q, class... G>
struct CheckAdjoint<Placements<P...>, Placements<Q...>, Placements<G...>> {
  template <int M>
  static void run(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
    INFO("x ", names<P...>(), " -> ", names<Q...>(), ", dy ", names<G...>(), " on ", mesh.to_string(), " shape ",
         to_string(shape));
    const auto gx = iota_tensor<double, 2>(shape);
    const auto gdy = grad_pattern(shape);
    const auto x = make_source<P...>(gx, mesh);
    const auto dy = make_source<G...>(gdy, mesh);
    const auto y = redistribute<Q...>(x);
    CommCounter counter;
    const auto dx = redistribute_backward_from<Placements<P...>, Placements<Q...>>(dy);
    using DX = std::decay_t<decltype(dx)>;
    static_assert(DX::placement_state == redistribute_backward_placements(st<P...>(), st<G...>()));
    static_assert(is_gradient_of(DX::placement_state, st<P...>()));
    // Cut like x (the chunk rule on both sides here).
    CHECK(dx.layout().blocks == x.layout().blocks);

    // A Partial<Avg> tensor's value is the mean of its terms; its gradient is per
    // term: dy holds dL/dy / (the Avg sizes of Q), dx must hold dL/dx / (those of P).
    double terms = 1, q_terms = 1;
    for (int m = 0; m < M; ++m) {
      if (st<P...>()[m].is_partial() && st<P...>()[m].op == ReduceOp::Avg) terms *= mesh.size(m);
      if (st<Q...>()[m].is_partial() && st<Q...>()[m].op == ReduceOp::Avg) q_terms *= mesh.size(m);
    }
    // <redistribute(x), dy> == <x, redistribute_backward(dy)>, a Partial x read as
    // the sum of its terms.
    Tensor<double, 2> x_terms = gx;
    for (int64_t i = 0; i < x_terms.numel(); ++i) x_terms.data()[i] *= terms;
    const Tensor<double, 2> dx_value = reconstruct(dx);
    const double lhs = q_terms * dot(reconstruct(y), reconstruct(dy)), rhs = dot(x_terms, dx_value);
    CHECK(std::abs(lhs - rhs) <= 1e-10 * std::max(1.0, std::abs(lhs)));
    // Stronger: redistribute is the identity on values, so its adjoint is too.
    Tensor<double, 2> want = gdy;
    for (int64_t i = 0; i < want.numel(); ++i) want.data()[i] *= q_terms / terms;
    CHECK(close(dx_value, want));

    if constexpr (M == 1) {
      bool none = false;
      const StepKind k = expected_1d(st<P...>()[0], st<G...>()[0], &none);
      INFO(counter.summary());
      CHECK(counter.count() == (none ? 0 : 1));
      if (!none) CHECK(counter.count(k) == 1);
    }
  }
};

template <class Set, int M>
void all_adjoints(const DeviceMesh<M>& mesh, const std::vector<Shape<2>>& shapes) {
  for (const auto& shape : shapes)
    for_each_pair<Set>([&]<class PL, class QL>() {
      if constexpr (plannable<PL, QL>)
        for_each_gradient<QL>([&]<class GL>() { CheckAdjoint<PL, QL, GL>::run(mesh, shape); });
    });
}

using Set1 = std::tuple<Placements<R>, Placements<S0>, Placements<S1>, Placements<PS>, Placements<PA>>;

}  // namespace

TEST_CASE("redistribute_backward is the adjoint of redistribute on 1-D meshes") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    const int n = mesh.size();
    all_adjoints<Set1>(mesh, {Shape<2>{2 * n + 1, 3}, Shape<2>{n > 1 ? n - 1 : 1, n + 2}, Shape<2>{0, 3}});
  });
}

namespace {
using Set2 = std::tuple<Placements<R, R>, Placements<S0, S1>, Placements<S0, S0>, Placements<R, S0>,
                        Placements<S1, R>, Placements<PS, R>, Placements<PA, S1>, Placements<R, PS>>;
}

TEST_CASE("redistribute_backward is the adjoint of redistribute on 2x2 and 2x3 meshes") {
  for (const auto& [rows, cols] : {std::pair{2, 2}, std::pair{2, 3}})
    spmd(rows * cols, [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, {rows, cols});
      all_adjoints<Set2>(mesh, {Shape<2>{7, 5}, Shape<2>{3, 2}});
    });
}

TEST_CASE("redistribute_backward: collectives of the adjoints") {
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    const Shape<2> shape{9, 6};
    const auto g = grad_pattern(shape);
    {  // all-gather of both mesh dims: an R gradient is sliced back locally
      CommCounter c;
      auto dx = redistribute_backward<S0, S1>(make_source<R, R>(g, mesh));
      CHECK(c.count() == 0);
      CHECK(reconstruct(dx) == g);
    }
    {  // with a Partial<Sum> gradient: one reduce-scatter per mesh dim
      CommCounter c;
      auto dx = redistribute_backward<S0, S1>(make_source<PS, PS>(g, mesh));
      CHECK(c.count() == 2);
      CHECK(c.count(StepKind::ReduceScatter) == 2);
      CHECK(reconstruct(dx) == g);
    }
    {  // P -> R forward (all-reduce) with an R gradient: nothing
      CommCounter c;
      auto dx = redistribute_backward<PS, PS>(make_source<R, R>(g, mesh));
      CHECK(c.count() == 0);
      static_assert(std::is_same_v<decltype(dx)::placements, Placements<R, R>>);
    }
    {  // and with a Partial gradient: one all-reduce per mesh dim
      CommCounter c;
      auto dx = redistribute_backward<PS, R>(make_source<PS, PS>(g, mesh));
      CHECK(c.count() == 1);
      CHECK(c.count(StepKind::AllReduce) == 1);
      CHECK(reconstruct(dx) == g);
    }
    {  // a slice's adjoint is local: zero-padded terms
      CommCounter c;
      auto dx = redistribute_backward<R, R>(make_source<S0, S1>(g, mesh));
      CHECK(c.count() == 0);
      static_assert(std::is_same_v<decltype(dx)::placements, Placements<PS, PS>>);
      CHECK(dx.local().shape() == shape);
      CHECK(reconstruct(dx) == g);
    }
    {  // ... unless an inner mesh dim still shards the same tensor dim: then exactly the
       // redistribution [S(0), S(0)] -> [R, S(0)] (re-cutting dim 0 over mesh dim 1 alone)
      const auto dy = make_source<S0, S0>(g, mesh);
      CommCounter forward;
      (void)redistribute<R, S0>(dy);
      CommCounter c;
      auto dx = redistribute_backward<R, S0>(dy);
      CHECK(forward.count() == 2 * c.count());  // forward saw both
      CHECK(c.count() == c.count(StepKind::AllGather));
      CHECK(c.count() >= 1);
      static_assert(std::is_same_v<decltype(dx)::placements, Placements<R, S0>>);
      CHECK(reconstruct(dx) == g);
    }
  });
}

TEST_CASE("redistribute_backward keeps the forward input's explicit block sizes") {
  spmd(3, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const Shape<2> shape{8, 4};
    const Splits<2> splits{std::vector<int64_t>{5, 0, 3}, {}};
    const auto gx = iota_tensor<double, 2>(shape);
    auto x = redistribute<S0>(distribute<R>(gx, mesh), splits);
    auto y = redistribute<R>(x);  // all-gather
    const auto gdy = grad_pattern(shape);
    for (int pass = 0; pass < 2; ++pass) {
      // R gradient: a local slice to x's blocks; Partial<Sum>: a reduce-scatter to them.
      auto dx = pass == 0 ? redistribute_backward<S0>(distribute<R>(gdy, mesh), x.layout().blocks)
                          : redistribute_backward<S0>(make_source<PS>(gdy, mesh), x.layout().blocks);
      CHECK(dx.layout().blocks == x.layout().blocks);
      CHECK(dx.local().shape() == x.local().shape());
      CHECK(reconstruct(dx) == gdy);
    }
    // A slice on a 2x2 sub-grid: the padded result keeps x's outer blocks.
    (void)y;
  });
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    const Shape<2> shape{7, 3};
    const Splits<2> splits{std::vector<int64_t>{6, 1}, {}};
    const auto gx = iota_tensor<double, 2>(shape);
    auto x = redistribute<S0, R>(distribute<R, R>(gx, mesh), splits);
    auto y = redistribute<S0, S0>(x);  // slices each block of x again
    const auto gdy = grad_pattern(shape);
    auto dy = redistribute<S0, S0>(distribute<R, R>(gdy, mesh), y.layout().blocks);
    CommCounter c;
    auto dx = redistribute_backward<S0, R>(dy, x.layout().blocks);
    CHECK(c.count() == 0);
    static_assert(std::is_same_v<decltype(dx)::placements, Placements<S0, PS>>);
    CHECK(dx.layout().blocks == x.layout().blocks);
    CHECK(reconstruct(dx) == gdy);
  });
}

TEST_CASE("redistribute_backward: bad block sizes fail on every rank") {
  spmd(2, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const Shape<2> shape{4, 4};
    auto dy = distribute<R>(grad_pattern(shape), mesh);
    CHECK_THROWS_AS(redistribute_backward<S0>(dy, Splits<2>{std::vector<int64_t>{1, 2}, {}}), InvalidArgument);
  });
}

// ---- operator backwards against finite differences of single-rank references ----
//
// For an operator f and a fixed weight W, L(x) = <f(x), W>: the backward of f with
// dy = W (placed as a gradient of f's result) must give dL/dx, which central
// differences of a plain single-rank implementation of f compute independently.

namespace {

template <class X, int M>
X make_source_t(const Tensor<double, X::rank>& g, const DeviceMesh<M>& mesh) {
  return [&]<class... P>(Placements<P...>*) { return make_source<P...>(g, mesh); }(
      static_cast<typename X::placements*>(nullptr));
}

template <int Rank>
double weighted(const Tensor<double, Rank>& y, const Tensor<double, Rank>& w) { return dot(y, w); }

// dL/dx by central differences, L(x) = <f(x), w>.
template <int Rank, class F>
Tensor<double, 2> fd_gradient(const Tensor<double, 2>& x, const Tensor<double, Rank>& w, const F& f) {
  Tensor<double, 2> g(x.shape());
  const double h = 1e-6;
  Tensor<double, 2> xp = x;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data()[i];
    xp.data()[i] = v + h;
    const double up = weighted(f(xp), w);
    xp.data()[i] = v - h;
    const double down = weighted(f(xp), w);
    xp.data()[i] = v;
    g.data()[i] = (up - down) / (2 * h);
  }
  return g;
}

// The placements of an acceptable gradient of a tensor placed `ps`: the canonical
// ones, or (replicate = true) Replicate wherever the tensor is Replicate.
template <std::size_t M>
constexpr PlacementState<M> gradient_of(PlacementState<M> ps, bool replicate) {
  for (auto& p : ps) p = replicate && p.is_replicate() ? p : grad_placement(p);
  return ps;
}

template <class X, bool Rep>
using grad_t = dtensor_t<typename X::value_type, X::rank, placements_t<gradient_of(X::placement_state, Rep)>>;

// The global value of a gradient, per term of a Partial<Avg> tensor placed ps: the
// gradient of the value over the number of terms.
template <int Rank, std::size_t M, int N>
Tensor<double, Rank> per_term(Tensor<double, Rank> g, const PlacementState<M>& ps, const DeviceMesh<N>& mesh) {
  double terms = 1;
  for (std::size_t m = 0; m < M; ++m)
    if (ps[m].is_partial() && ps[m].op == ReduceOp::Avg) terms *= mesh.size(static_cast<int>(m));
  for (int64_t i = 0; i < g.numel(); ++i) g.data()[i] /= terms;
  return g;
}

bool grad_close(const Tensor<double, 2>& a, const Tensor<double, 2>& b) { return close(a, b, 1e-6); }

Tensor<double, 2> shifted(const Shape<2>& s, double by) {  // no zeros: kinks of relu and abs avoided
  auto t = iota_tensor<double, 2>(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = t.data()[i] / 8 + by;
  return t;
}

Tensor<double, 2> map(const Tensor<double, 2>& x, double (*f)(double)) {
  Tensor<double, 2> y(x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) y.data()[i] = f(x.data()[i]);
  return y;
}

template <UnaryFn F>
double ref_unary(double v) {
  switch (F) {
    case UnaryFn::Neg: return -v;
    case UnaryFn::Exp: return std::exp(v);
    case UnaryFn::Log: return std::log(v);
    case UnaryFn::Sqrt: return std::sqrt(v);
    case UnaryFn::Abs: return std::abs(v);
    case UnaryFn::Relu: return v > 0 ? v : 0;
    case UnaryFn::Tanh: return std::tanh(v);
    case UnaryFn::Sigmoid: return 1 / (1 + std::exp(-v));
    default: return v;
  }
}

template <UnaryFn F, class... P, int M, bool Rep>
void check_unary(const DeviceMesh<M>& mesh, const Shape<2>& shape, std::bool_constant<Rep>) {
  const bool positive_only = F == UnaryFn::Log || F == UnaryFn::Sqrt;
  const auto gx = positive_only ? shifted(shape, 4.0) : shifted(shape, 0.0625);
  const auto w = grad_pattern(shape);
  const auto x = make_source<P...>(gx, mesh);
  using Y = decltype(detail::unary<F, Implicit>(x));
  const auto dy = make_source_t<grad_t<Y, Rep>>(per_term(w, Y::placement_state, mesh), mesh);
  const auto dx = unary_backward<F>(x, dy);
  static_assert(is_gradient_of(std::decay_t<decltype(dx)>::placement_state, st<P...>()));
  INFO(name(F), " x ", names<P...>(), " dy ", std::decay_t<decltype(dy)>::placements_string(), " on ",
       mesh.to_string(), " shape ", to_string(shape));
  const auto ref = fd_gradient(gx, w, [](const Tensor<double, 2>& v) { return map(v, ref_unary<F>); });
  CHECK(grad_close(reconstruct(dx), per_term(ref, st<P...>(), mesh)));
}

template <BinaryOp K>
Tensor<double, 2> ref_binary(const Tensor<double, 2>& a, const Tensor<double, 2>& b) {
  Tensor<double, 2> c(a.shape());
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double u = a.data()[i], v = b.data()[i];
    c.data()[i] = K == BinaryOp::Add ? u + v : K == BinaryOp::Sub ? u - v : K == BinaryOp::Mul ? u * v : u / v;
  }
  return c;
}

template <BinaryOp K, class PL, class QL, int M>
void check_binary(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
  [&]<class... PA, class... PB>(Placements<PA...>*, Placements<PB...>*) {
    const auto ga = shifted(shape, 0.3), gb = shifted(shape, 9.0);  // b > 0: a divisor
    const auto w = grad_pattern(shape);
    const auto a = make_source<PA...>(ga, mesh);
    const auto b = make_source<PB...>(gb, mesh);
    using C = decltype(binary<K>(a, b));
    const auto dc = make_source_t<grad_t<C, false>>(per_term(w, C::placement_state, mesh), mesh);
    const auto [da, db] = binary_backward<K>(a, b, dc);
    static_assert(is_gradient_of(std::decay_t<decltype(da)>::placement_state, st<PA...>()));
    static_assert(is_gradient_of(std::decay_t<decltype(db)>::placement_state, st<PB...>()));
    INFO(names<PA...>(), " op ", names<PB...>(), " on ", mesh.to_string(), " shape ", to_string(shape));
    const auto ra = fd_gradient(ga, w, [&](const Tensor<double, 2>& v) { return ref_binary<K>(v, gb); });
    const auto rb = fd_gradient(gb, w, [&](const Tensor<double, 2>& v) { return ref_binary<K>(ga, v); });
    CHECK(grad_close(reconstruct(da), per_term(ra, st<PA...>(), mesh)));
    CHECK(grad_close(reconstruct(db), per_term(rb, st<PB...>(), mesh)));
    // The scalar form, with b's first element as the scalar.
    if (gb.numel() > 0) {
      const double s = gb.data()[0];
      using CS = decltype(binary_scalar<K>(a, s));
      const auto dcs = make_source_t<grad_t<CS, false>>(per_term(w, CS::placement_state, mesh), mesh);
      const auto dxs = binary_scalar_backward<K>(a, s, dcs);
      const auto rs = fd_gradient(ga, w, [&](const Tensor<double, 2>& v) {
        return ref_binary<K>(v, Tensor<double, 2>::full(v.shape(), s));
      });
      CHECK(grad_close(reconstruct(dxs), per_term(rs, st<PA...>(), mesh)));
    }
  }(static_cast<PL*>(nullptr), static_cast<QL*>(nullptr));
}

}  // namespace

namespace {

Tensor<double, 1> ref_reduce(const Tensor<double, 2>& x, int dim, bool mean) {
  Tensor<double, 1> y(Shape<1>{x.extent(1 - dim)});
  for (int64_t i = 0; i < x.extent(0); ++i)
    for (int64_t j = 0; j < x.extent(1); ++j) y.data()[dim == 0 ? j : i] += x.data()[i * x.extent(1) + j];
  if (mean)
    for (int64_t k = 0; k < y.numel(); ++k) y.data()[k] /= static_cast<double>(x.extent(dim));
  return y;
}

Tensor<double, 1> grad_pattern1(int64_t n) {
  Tensor<double, 1> t(Shape<1>{n});
  for (int64_t i = 0; i < n; ++i) t.data()[i] = static_cast<double>((i * 3 + 2) % 7) - 3.25;
  return t;
}

template <int D, bool Mean, Reduced Mode, bool Rep, class... P, int M>
void check_reduce(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
  const auto gx = shifted(shape, 0.5);
  const auto w = grad_pattern1(shape[1 - D]);
  const auto x = make_source<P...>(gx, mesh);
  using Y = decltype(detail::reduce<Mean ? Reduction::Mean : Reduction::Sum, D, Mode, Implicit>(x));
  const auto dy = make_source_t<grad_t<Y, Rep>>(per_term(w, Y::placement_state, mesh), mesh);
  const auto dx = Mean ? mean_backward<D, Mode>(x, dy) : sum_backward<D, Mode>(x, dy);
  static_assert(is_gradient_of(std::decay_t<decltype(dx)>::placement_state, st<P...>()));
  INFO(std::string(Mean ? "mean<" : "sum<"), D, "> x ", names<P...>(), " dy ", std::decay_t<decltype(dy)>::placements_string(),
       " on ", mesh.to_string(), " shape ", to_string(shape));
  const auto ref = fd_gradient(gx, w, [](const Tensor<double, 2>& v) { return ref_reduce(v, D, Mean); });
  CHECK(grad_close(reconstruct(dx), per_term(ref, st<P...>(), mesh)));
}

Tensor<double, 1> ref_extremum(const Tensor<double, 2>& x, int dim, bool max) {
  Tensor<double, 1> y(Shape<1>{x.extent(1 - dim)});
  for (int64_t k = 0; k < y.numel(); ++k) y.data()[k] = max ? -1e300 : 1e300;
  for (int64_t i = 0; i < x.extent(0); ++i)
    for (int64_t j = 0; j < x.extent(1); ++j) {
      double& e = y.data()[dim == 0 ? j : i];
      e = max ? std::max(e, x(i, j)) : std::min(e, x(i, j));
    }
  return y;
}

// max/min over D: finite differences away from ties (the values are distinct), and a
// hand-worked case with ties, where dy is split evenly (every other row equal).
template <int D, bool Max, bool Rep, class... P, int M>
void check_extremum(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
  const auto w = grad_pattern1(shape[1 - D]);
  auto run = [&](const Tensor<double, 2>& gx) {
    const auto x = make_source<P...>(gx, mesh);
    const auto y = Max ? max<D, Reduced::Value>(x) : min<D, Reduced::Value>(x);
    const auto dy = make_source_t<grad_t<std::decay_t<decltype(y)>, Rep>>(per_term(w, y.placement_state, mesh), mesh);
    const auto dx = Max ? max_backward<D>(x, y, dy) : min_backward<D>(x, y, dy);
    static_assert(is_gradient_of(std::decay_t<decltype(dx)>::placement_state, st<P...>()));
    return reconstruct(dx);
  };
  INFO(std::string(Max ? "max<" : "min<"), D, "> x ", names<P...>(), " on ", mesh.to_string(), " shape ",
       to_string(shape));
  const auto gx = shifted(shape, 0.5);
  const auto ref = fd_gradient(gx, w, [](const Tensor<double, 2>& v) { return ref_extremum(v, D, Max); });
  CHECK(grad_close(run(gx), per_term(ref, st<P...>(), mesh)));
  // Ties: along D, the values 1, 2, 1, 2, ... (max: every odd index; min: every even one).
  Tensor<double, 2> tied(shape);
  for (int64_t i = 0; i < shape[0]; ++i)
    for (int64_t j = 0; j < shape[1]; ++j) tied(i, j) = 1.0 + static_cast<double>((D == 0 ? i : j) % 2);
  Tensor<double, 2> want(shape);
  const int64_t n = shape[D], hits = Max ? n / 2 : (n + 1) / 2;
  const double extremum = Max && n > 1 ? 2.0 : 1.0;
  for (int64_t i = 0; i < shape[0]; ++i)
    for (int64_t j = 0; j < shape[1]; ++j)
      want(i, j) = tied(i, j) == extremum ? w.data()[D == 0 ? j : i] / static_cast<double>(n > 1 ? hits : 1) : 0.0;
  CHECK(grad_close(run(tied), per_term(want, st<P...>(), mesh)));
}

Tensor<double, 2> ref_softmax(const Tensor<double, 2>& x, int dim, bool log) {
  Tensor<double, 2> y(x.shape());
  const int64_t r = x.extent(0), c = x.extent(1);
  const int64_t lines = dim == 1 ? r : c, len = dim == 1 ? c : r;
  auto at = [&](int64_t line, int64_t k) { return dim == 1 ? line * c + k : k * c + line; };
  for (int64_t l = 0; l < lines; ++l) {
    double mx = -1e300, sum = 0;
    for (int64_t k = 0; k < len; ++k) mx = std::max(mx, x.data()[at(l, k)]);
    for (int64_t k = 0; k < len; ++k) sum += std::exp(x.data()[at(l, k)] - mx);
    for (int64_t k = 0; k < len; ++k) {
      const double v = x.data()[at(l, k)] - mx;
      y.data()[at(l, k)] = log ? v - std::log(sum) : std::exp(v) / sum;
    }
  }
  return y;
}

template <int D, bool Log, bool Rep, class... P, int M>
void check_softmax(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
  const auto gx = shifted(shape, 0.25);
  const auto w = grad_pattern(shape);
  const auto x = make_source<P...>(gx, mesh);
  const auto y = Log ? log_softmax<D>(x) : softmax<D>(x);
  const auto dy = make_source_t<grad_t<std::decay_t<decltype(y)>, Rep>>(per_term(w, y.placement_state, mesh), mesh);
  CommCounter c;
  const auto dx = Log ? log_softmax_backward<D>(x, y, dy) : softmax_backward<D>(x, y, dy);
  static_assert(is_gradient_of(std::decay_t<decltype(dx)>::placement_state, st<P...>()));
  INFO(std::string(Log ? "log_softmax<" : "softmax<"), D, "> x ", names<P...>(), " dy ",
       std::decay_t<decltype(dy)>::placements_string(), " on ", mesh.to_string(), " shape ", to_string(shape));
  const auto ref = fd_gradient(gx, w, [](const Tensor<double, 2>& v) { return ref_softmax(v, D, Log); });
  CHECK(grad_close(reconstruct(dx), per_term(ref, st<P...>(), mesh)));
  // One all-reduce per mesh dim that shards D, as in the forward, for a Shard or
  // Replicate x with a gradient of the same kind.
  int shards = 0;
  bool other = false;
  for (auto p : st<P...>()) shards += p.is_shard(D), other = other || p.is_partial();
  for (auto g : std::decay_t<decltype(dy)>::placement_state) other = other || g.is_partial();
  if (!other) CHECK(c.count() == shards);
}

Tensor<double, 2> ref_slice(const Tensor<double, 2>& x, int dim, int64_t b, int64_t e) {
  Shape<2> s = x.shape();
  s[dim] = e - b;
  Shape<2> off{};
  off[dim] = b;
  return box_of(x, off, s);
}

template <int D, class... P, int M>
void check_slice_concat(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
  const auto gx = shifted(shape, 0.5);
  const auto x = make_source<P...>(gx, mesh);
  const int64_t n = shape[D], b = n / 3, e = n - n / 4;
  {
    const auto y = slice<D>(x, b, e);
    Shape<2> ys = shape;
    ys[D] = e - b;
    const auto w = grad_pattern(ys);
    // The gradient cut like y (the slice's own uneven blocks): distribute, then match.
    const auto dy0 = make_source_t<grad_t<std::decay_t<decltype(y)>, false>>(per_term(w, y.placement_state, mesh), mesh);
    using G = std::decay_t<decltype(dy0)>;
    const auto dy = [&]<class... Q>(Placements<Q...>*) {
      // Through Replicate: a redistribution that keeps a Shard cannot change its blocks.
      return redistribute<Q...>(redistribute<std::conditional_t<true, Replicate, Q>...>(dy0), y.layout().blocks);
    }(static_cast<typename G::placements*>(nullptr));
    CommCounter c;
    const auto dx = slice_backward<D>(x, b, e, dy);
    CHECK(c.count() == 0);
    INFO("slice<", D, "> x ", names<P...>(), " on ", mesh.to_string(), " shape ", to_string(shape));
    const auto ref = fd_gradient(gx, w, [&](const Tensor<double, 2>& v) { return ref_slice(v, D, b, e); });
    CHECK(grad_close(reconstruct(dx), per_term(ref, st<P...>(), mesh)));
  }
  {
    Shape<2> bs = shape;
    bs[D] = 2;
    const auto gb = shifted(bs, 1.5);
    const auto xb = make_source<P...>(gb, mesh);
    const auto y = concat<D>(x, xb);
    const auto w = grad_pattern(y.shape());
    const auto dy = make_source_t<grad_t<std::decay_t<decltype(y)>, false>>(per_term(w, y.placement_state, mesh), mesh);
    const auto [da, db] = concat_backward<D>(x, xb, dy);
    INFO("concat<", D, "> x ", names<P...>(), " on ", mesh.to_string(), " shape ", to_string(shape));
    CHECK(grad_close(reconstruct(da), per_term(ref_slice(w, D, 0, n), st<P...>(), mesh)));
    CHECK(grad_close(reconstruct(db), per_term(ref_slice(w, D, n, n + 2), st<P...>(), mesh)));
    CHECK(da.layout().blocks == x.layout().blocks);
  }
}

template <class... P, int M>
void check_norm2(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
  const auto gx = shifted(shape, 0.5);
  const auto x = make_source<P...>(gx, mesh);
  const double n = norm2(x), dn = 1.75;
  const auto dx = norm2_backward(x, n, dn);
  static_assert(is_gradient_of(std::decay_t<decltype(dx)>::placement_state, st<P...>()));
  Tensor<double, 2> ref(shape);
  double s = 0;
  for (int64_t i = 0; i < gx.numel(); ++i) s += gx.data()[i] * gx.data()[i];
  for (int64_t i = 0; i < gx.numel(); ++i) ref.data()[i] = s > 0 ? dn * gx.data()[i] / std::sqrt(s) : 0;
  CHECK(grad_close(reconstruct(dx), per_term(ref, st<P...>(), mesh)));
}

// transpose: dx is the transposed gradient (exact math), placed as x's gradient.
template <class... P, int M>
void check_transpose(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
  const auto gx = shifted(shape, 0.5);
  const auto x = make_source<P...>(gx, mesh);
  const auto y = transpose(x);
  const auto w = grad_pattern(y.shape());
  const auto dy = make_source_t<grad_t<std::decay_t<decltype(y)>, false>>(per_term(w, y.placement_state, mesh), mesh);
  CommCounter c;
  const auto dx = transpose_backward(x, dy);
  CHECK(c.count() == 0);
  static_assert(is_gradient_of(std::decay_t<decltype(dx)>::placement_state, st<P...>()));
  INFO("transpose x ", names<P...>(), " on ", mesh.to_string(), " shape ", to_string(shape));
  const auto ref = fd_gradient(gx, w, [](const Tensor<double, 2>& v) {
    Tensor<double, 2> t(Shape<2>{v.extent(1), v.extent(0)});
    for (int64_t i = 0; i < v.extent(0); ++i)
      for (int64_t j = 0; j < v.extent(1); ++j) t(j, i) = v(i, j);
    return t;
  });
  CHECK(grad_close(reconstruct(dx), per_term(ref, st<P...>(), mesh)));
}

// add_bias<A>(m, v) for a vector placed V...: dm by finite differences, dv against the
// sums of w over the broadcast dim (hand-worked: d/dv_j of sum_ij w_ij (m_ij + v_j)).
template <Along A, class V, class... P, int M>
void check_add_bias(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
  constexpr int dim = A == Along::Rows ? 1 : 0;
  const auto gm = shifted(shape, 0.5);
  Tensor<double, 1> gv(Shape<1>{shape[dim]});
  for (int64_t k = 0; k < gv.numel(); ++k) gv.data()[k] = 0.25 * static_cast<double>(k) - 1;
  const auto m = make_source<P...>(gm, mesh);
  const auto v = [&]<class... Q>(Placements<Q...>*) { return make_source<Q...>(gv, mesh); }(static_cast<V*>(nullptr));
  const auto y = add_bias<A>(m, v);
  const auto w = grad_pattern(shape);
  const auto dy = make_source_t<grad_t<std::decay_t<decltype(y)>, false>>(per_term(w, y.placement_state, mesh), mesh);
  const auto [dm, dv] = add_bias_backward<A>(m, v, dy);
  static_assert(is_gradient_of(std::decay_t<decltype(dm)>::placement_state, st<P...>()));
  static_assert(is_gradient_of(std::decay_t<decltype(dv)>::placement_state, std::decay_t<decltype(v)>::placement_state));
  INFO("add_bias<", A == Along::Rows ? "Rows" : "Columns", "> m ", names<P...>(), " v ",
       std::decay_t<decltype(v)>::placements_string(), " on ", mesh.to_string(), " shape ", to_string(shape));
  const auto ref_m = fd_gradient(gm, w, [&](const Tensor<double, 2>& x) {
    Tensor<double, 2> t = x;
    for (int64_t i = 0; i < x.extent(0); ++i)
      for (int64_t j = 0; j < x.extent(1); ++j) t(i, j) += gv.data()[dim == 1 ? j : i];
    return t;
  });
  CHECK(grad_close(reconstruct(dm), per_term(ref_m, st<P...>(), mesh)));
  Tensor<double, 1> ref_v(Shape<1>{shape[dim]});
  for (int64_t i = 0; i < shape[0]; ++i)
    for (int64_t j = 0; j < shape[1]; ++j) ref_v.data()[dim == 1 ? j : i] += w(i, j);
  const auto got_v = reconstruct(dv);
  const auto want_v = per_term(ref_v, std::decay_t<decltype(v)>::placement_state, mesh);
  REQUIRE(got_v.shape() == want_v.shape());
  for (int64_t k = 0; k < want_v.numel(); ++k) CHECK(got_v.data()[k] == doctest::Approx(want_v.data()[k]).epsilon(1e-12));
}

template <class... P, int M>
void check_all_ops(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
  check_unary<UnaryFn::Neg, P...>(mesh, shape, std::false_type{});
  check_unary<UnaryFn::Exp, P...>(mesh, shape, std::false_type{});
  check_unary<UnaryFn::Log, P...>(mesh, shape, std::false_type{});
  check_unary<UnaryFn::Sqrt, P...>(mesh, shape, std::false_type{});
  check_unary<UnaryFn::Abs, P...>(mesh, shape, std::true_type{});
  check_unary<UnaryFn::Relu, P...>(mesh, shape, std::true_type{});
  check_unary<UnaryFn::Tanh, P...>(mesh, shape, std::false_type{});
  check_unary<UnaryFn::Sigmoid, P...>(mesh, shape, std::true_type{});
  check_reduce<0, false, Reduced::Partial, false, P...>(mesh, shape);
  check_reduce<1, true, Reduced::Partial, false, P...>(mesh, shape);
  check_reduce<0, true, Reduced::Value, false, P...>(mesh, shape);
  check_reduce<1, false, Reduced::Value, true, P...>(mesh, shape);
  check_softmax<1, false, false, P...>(mesh, shape);
  check_softmax<0, true, true, P...>(mesh, shape);
  check_softmax<0, false, true, P...>(mesh, shape);
  check_softmax<1, true, false, P...>(mesh, shape);
  check_slice_concat<0, P...>(mesh, shape);
  check_slice_concat<1, P...>(mesh, shape);
  check_norm2<P...>(mesh, shape);
  check_transpose<P...>(mesh, shape);
  check_extremum<0, true, false, P...>(mesh, shape);
  check_extremum<1, false, true, P...>(mesh, shape);
  check_extremum<1, true, false, P...>(mesh, shape);
  check_add_bias<Along::Rows, Placements<std::conditional_t<true, R, P>...>, P...>(mesh, shape);
  check_add_bias<Along::Columns, Placements<std::conditional_t<true, R, P>...>, P...>(mesh, shape);
  // A sharded vector (the forward cannot make a shard a partial term of a Partial matrix).
  if constexpr (!(std::is_same_v<P, PS> || ...) && !(std::is_same_v<P, PA> || ...))
    check_add_bias<Along::Rows, Placements<std::conditional_t<true, S0, P>...>, P...>(mesh, shape);
}

}  // namespace

TEST_CASE("operator backwards against finite differences, 1-D meshes") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    const int n = mesh.size();
    for (const auto& shape : {Shape<2>{2 * n + 1, 3}, Shape<2>{n > 1 ? n - 1 : 1, n + 2}}) {
      check_all_ops<R>(mesh, shape);
      check_all_ops<S0>(mesh, shape);
      check_all_ops<S1>(mesh, shape);
      check_all_ops<PS>(mesh, shape);
      check_all_ops<PA>(mesh, shape);
      for_each_pair<Set1>([&]<class A, class B>() {
        check_binary<BinaryOp::Add, A, B>(mesh, shape);
        check_binary<BinaryOp::Sub, A, B>(mesh, shape);
        check_binary<BinaryOp::Mul, A, B>(mesh, shape);
        check_binary<BinaryOp::Div, A, B>(mesh, shape);
      });
    }
  });
}

TEST_CASE("operator backwards against finite differences, 2x2 and 2x3 meshes") {
  for (const auto& [rows, cols] : {std::pair{2, 2}, std::pair{2, 3}})
    spmd(rows * cols, [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, {rows, cols});
      for (const auto& shape : {Shape<2>{7, 5}, Shape<2>{3, 4}}) {
        check_all_ops<S0, S1>(mesh, shape);
        check_all_ops<S1, S1>(mesh, shape);
        check_all_ops<R, S0>(mesh, shape);
        check_all_ops<PS, PA>(mesh, shape);
        check_binary<BinaryOp::Mul, Placements<S0, PS>, Placements<R, S1>>(mesh, shape);
        check_binary<BinaryOp::Div, Placements<PA, R>, Placements<S1, R>>(mesh, shape);
        check_binary<BinaryOp::Add, Placements<PS, S0>, Placements<R, R>>(mesh, shape);
        check_binary<BinaryOp::Sub, Placements<S0, S1>, Placements<S1, S0>>(mesh, shape);
      }
    });
}

namespace {

// reshape<Q...>(x, shape) merges (and its backward splits back) with the sharded dim
// leading: dx is dy in x's shape (exact), placed as x's gradient, x's blocks.
template <class P, class Q, int R2, int M>
void check_reshape(const DeviceMesh<M>& mesh, const Shape<3>& xs, const Shape<R2>& ys) {
  const auto gx = iota_tensor<double, 3>(xs);
  const auto x = make_source<P>(gx, mesh);
  const auto y = reshape<Q>(x, ys);
  Tensor<double, R2> w(ys);
  for (int64_t i = 0; i < w.numel(); ++i) w.data()[i] = static_cast<double>((i * 5) % 11) - 4.5;
  const auto dy0 = make_source_t<grad_t<std::decay_t<decltype(y)>, false>>(w, mesh);
  // dy cut like y (a merged dim's blocks are multiples of the merged extent).
  const auto dy = [&]<class... G>(Placements<G...>*) {
    return redistribute<G...>(redistribute<std::conditional_t<true, Replicate, G>...>(dy0), y.layout().blocks);
  }(static_cast<typename std::decay_t<decltype(dy0)>::placements*>(nullptr));
  CommCounter c;
  const auto dx = reshape_backward(x, dy);
  CHECK(c.count() == 0);
  static_assert(is_gradient_of(std::decay_t<decltype(dx)>::placement_state, st<P>()));
  INFO("reshape x ", names<P>(), " to ", to_string(ys), " on ", mesh.to_string());
  CHECK(dx.layout().blocks == x.layout().blocks);
  const Tensor<double, 3> want(xs, std::vector<double>(w.data(), w.data() + w.numel()));
  CHECK(reconstruct(dx) == want);
}

}  // namespace

TEST_CASE("reshape_backward: the gradient reshaped back, placed as the operand's, no communication") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    const int64_t p = mesh.size();
    const Shape<3> xs{2 * p + 1, 3, 2};
    check_reshape<S0, S0, 2>(mesh, xs, Shape<2>{2 * p + 1, 6});     // inner dims merged
    check_reshape<S0, S0, 1>(mesh, xs, Shape<1>{(2 * p + 1) * 6});  // the sharded dim leads the merge
    check_reshape<R, R, 1>(mesh, xs, Shape<1>{(2 * p + 1) * 6});
    check_reshape<PS, PS, 2>(mesh, xs, Shape<2>{(2 * p + 1) * 3, 2});
    check_reshape<S1, S1, 2>(mesh, Shape<3>{2, 2 * p + 1, 3}, Shape<2>{2, (2 * p + 1) * 3});
  });
}
