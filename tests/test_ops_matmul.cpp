// Contractions against Eigen on the global operands: every pair of placements on
// 1-D meshes of 1 to 4 ranks, mixed placements on a 2x2 mesh, uneven and empty sizes.
#include "ops_support.hpp"

using namespace dtensor;
using namespace dtensor::test;

// The rules, decided by the compiler.
template <class A, class B>
using MM = typename decltype(matmul(std::declval<A>(), std::declval<B>()))::placements;
using M = DTensor<double, 2, Shard<0>>;
static_assert(std::is_same_v<MM<DTensor<double, 2, Shard<0>>, DTensor<double, 2, Replicate>>, Placements<Shard<0>>>);
static_assert(std::is_same_v<MM<DTensor<double, 2, Replicate>, DTensor<double, 2, Shard<1>>>, Placements<Shard<1>>>);
static_assert(std::is_same_v<MM<DTensor<double, 2, Shard<1>>, DTensor<double, 2, Shard<0>>>, Placements<Partial<Sum>>>);
static_assert(std::is_same_v<MM<DTensor<double, 2, Replicate>, DTensor<double, 2, Replicate>>, Placements<Replicate>>);
static_assert(std::is_same_v<MM<DTensor<double, 2, Partial<Sum>>, DTensor<double, 2, Replicate>>, Placements<Partial<Sum>>>);
static_assert(std::is_same_v<MM<DTensor<double, 2, Shard<0>, Shard<1>>, DTensor<double, 2, Replicate, Replicate>>,
                             Placements<Shard<0>, Shard<1>>> ||
              std::is_same_v<MM<DTensor<double, 2, Shard<0>, Shard<1>>, DTensor<double, 2, Replicate, Replicate>>,
                             Placements<Shard<0>, Partial<Sum>>>);
static_assert(std::is_same_v<MM<DTensor<double, 2, Shard<0>, Replicate>, DTensor<double, 2, Replicate, Shard<1>>>,
                             Placements<Shard<0>, Shard<1>>>);
// Strict mode accepts a matmul that fits a rule as it is.
static_assert(std::is_same_v<typename decltype(matmul<Strict>(std::declval<DTensor<double, 2, Shard<1>>>(),
                                                              std::declval<DTensor<double, 2, Shard<0>>>()))::placements,
                             Placements<Partial<Sum>>>);

using Set = std::tuple<Placements<Replicate>, Placements<Shard<0>>, Placements<Shard<1>>, Placements<Partial<Sum>>>;

template <class T, class PA, class PB>
struct CheckMatmul;
template <class T, class... PA, class... PB>
struct CheckMatmul<T, Placements<PA...>, Placements<PB...>> {
  template <int N>
  static void run(const DeviceMesh<N>& mesh, int64_t m, int64_t k, int64_t n) {
    const auto a = iota_tensor<T, 2>({m, k});
    const auto b = positive<T, 2>({k, n});
    Tensor<T, 2> ref({m, n});
    as_eigen(ref) = as_eigen(a) * as_eigen(b);
    auto c = matmul(make_source<PA...>(a, mesh), make_source<PB...>(b, mesh));
    INFO(names<PA...>(), " x ", names<PB...>(), " ", m, "x", k, "x", n, " on ", mesh.to_string());
    CHECK(close(reconstruct(c), ref));
  }
};

template <class T>
void all_matmul_pairs() {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    const int p = mesh.size();
    for (auto [m, k, n] : {std::array<int64_t, 3>{2 * p, 3 * p, p}, {2 * p + 1, p + 2, 3}, {1, p > 1 ? p - 1 : 1, 2}, {3, 0, 2}})
      for_each_pair<Set>([&]<class A, class B>() { CheckMatmul<T, A, B>::run(mesh, m, k, n); });
  });
}
TEST_CASE("matmul on every pair of 1-D placements, double") { all_matmul_pairs<double>(); }
TEST_CASE("matmul on every pair of 1-D placements, float") { all_matmul_pairs<float>(); }

TEST_CASE("matmul on a 2x2 mesh") {
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    for (auto [m, k, n] : {std::array<int64_t, 3>{5, 7, 3}, {4, 4, 4}, {1, 3, 1}}) {
      CheckMatmul<double, Placements<Shard<0>, Replicate>, Placements<Replicate, Shard<1>>>::run(mesh, m, k, n);
      CheckMatmul<double, Placements<Shard<1>, Shard<0>>, Placements<Shard<0>, Shard<1>>>::run(mesh, m, k, n);
      CheckMatmul<double, Placements<Shard<0>, Shard<1>>, Placements<Replicate, Shard<0>>>::run(mesh, m, k, n);
      CheckMatmul<double, Placements<Partial<Sum>, Shard<0>>, Placements<Replicate, Replicate>>::run(mesh, m, k, n);
      CheckMatmul<float, Placements<Shard<0>, Shard<0>>, Placements<Shard<1>, Partial<Sum>>>::run(mesh, m, k, n);
    }
  });
}

TEST_CASE("batched matmul, matvec, dot and transpose") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    const int p = mesh.size();
    // batched [b, m, k] x [b, k, n]
    const auto a = iota_tensor<double, 3>({p + 1, 3, 2 * p + 1});
    const auto b = positive<double, 3>({p + 1, 2 * p + 1, 2});
    Tensor<double, 3> ref({p + 1, 3, 2});
    for (int64_t i = 0; i < p + 1; ++i) {
      Eigen::Map<const EigenRowMatrix<double>> am(a.data() + i * 3 * (2 * p + 1), 3, 2 * p + 1);
      Eigen::Map<const EigenRowMatrix<double>> bm(b.data() + i * (2 * p + 1) * 2, 2 * p + 1, 2);
      Eigen::Map<EigenRowMatrix<double>>(ref.data() + i * 6, 3, 2) = am * bm;
    }
    CHECK(close(reconstruct(matmul(make_source<Shard<0>>(a, mesh), make_source<Shard<0>>(b, mesh))), ref));
    CHECK(close(reconstruct(matmul(make_source<Shard<2>>(a, mesh), make_source<Shard<1>>(b, mesh))), ref));
    CHECK(close(reconstruct(matmul(make_source<Shard<1>>(a, mesh), make_source<Replicate>(b, mesh))), ref));
    CHECK(close(reconstruct(matmul(make_source<Replicate>(a, mesh), make_source<Shard<2>>(b, mesh))), ref));
    // matvec and dot
    const auto m = iota_tensor<double, 2>({2 * p + 1, p + 2});
    const auto x = positive<double, 1>({p + 2});
    Tensor<double, 1> y({2 * p + 1});
    as_eigen(y) = as_eigen(m) * as_eigen(x);
    CHECK(close(reconstruct(matvec(make_source<Shard<0>>(m, mesh), make_source<Shard<0>>(x, mesh))), y));
    CHECK(close(reconstruct(matvec(make_source<Shard<1>>(m, mesh), make_source<Shard<0>>(x, mesh))), y));
    CHECK(close(reconstruct(matvec(make_source<Partial<Sum>>(m, mesh), make_source<Replicate>(x, mesh))), y));
    const double d = as_eigen(x).dot(as_eigen(x));
    CHECK(value(dot(make_source<Shard<0>>(x, mesh), make_source<Shard<0>>(x, mesh))) == doctest::Approx(d));
    CHECK(value(dot(make_source<Partial<Sum>>(x, mesh), make_source<Shard<0>>(x, mesh))) == doctest::Approx(d));
    // transpose: no communication, placements swap
    CommCounter c;
    auto t = transpose(make_source<Shard<0>>(m, mesh));
    static_assert(std::is_same_v<decltype(t)::placements, Placements<Shard<1>>>);
    CHECK(c.count() == 0);
    Tensor<double, 2> mt({p + 2, 2 * p + 1});
    as_eigen(mt) = as_eigen(m).transpose();
    CHECK(close(reconstruct(t), mt));
  });
}

TEST_CASE("Shard<1> x Shard<0> then Replicate is exactly one all-reduce") {
  spmd(4, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const auto a = iota_tensor<double, 2>({6, 10});
    const auto b = positive<double, 2>({10, 3});
    auto sa = make_source<Shard<1>>(a, mesh);
    auto sb = make_source<Shard<0>>(b, mesh);
    CommCounter c;
    auto y = redistribute<Replicate>(matmul(sa, sb));
    CHECK(c.count() == 1);
    CHECK(c.count(StepKind::AllReduce) == 1);
    Tensor<double, 2> ref({6, 3});
    as_eigen(ref) = as_eigen(a) * as_eigen(b);
    CHECK(close(y.local(), ref));
  });
}

TEST_CASE("mismatched contraction extents are a clear error") {
  spmd(2, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    auto a = zeros<double, Shard<0>>(Shape<2>{4, 3}, mesh);
    auto b = zeros<double, Replicate>(Shape<2>{4, 3}, mesh);
    CHECK_THROWS_WITH_AS(matmul(a, b), doctest::Contains("contracted (and batch) extents differ"), InvalidArgument);
  });
}

// --- general contractions: [..., k] x [k, n], its transposed forms, and gradients ---

// References by plain loops over the global tensors (rows: every leading index).
template <class T, int R>
Tensor<T, R> ref_last(const Tensor<T, R>& x, const Tensor<T, 2>& w) {  // x W
  Shape<R> s = x.shape();
  const int64_t k = s[R - 1], n = w.extent(1), rows = k ? x.numel() / k : numel(s) / std::max<int64_t>(k, 1);
  s[R - 1] = n;
  Tensor<T, R> y(s);
  const int64_t nrows = n ? y.numel() / n : rows;
  for (int64_t r = 0; r < nrows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < k; ++i) acc += double(x.data()[r * k + i]) * double(w.data()[i * n + j]);
      y.data()[r * n + j] = T(acc);
    }
  return y;
}
template <class T, int R>
Tensor<T, R> ref_last_t(const Tensor<T, R>& dy, const Tensor<T, 2>& w) {  // dy W^T
  Shape<R> s = dy.shape();
  const int64_t n = s[R - 1], k = w.extent(0);
  s[R - 1] = k;
  Tensor<T, R> dx(s);
  const int64_t rows = k ? dx.numel() / k : 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < k; ++i) {
      double acc = 0;
      for (int64_t j = 0; j < n; ++j) acc += double(dy.data()[r * n + j]) * double(w.data()[i * n + j]);
      dx.data()[r * k + i] = T(acc);
    }
  return dx;
}
template <class T, int R>
Tensor<T, 2> ref_leading(const Tensor<T, R>& x, const Tensor<T, R>& dy) {  // x^T dy over every leading dim
  const int64_t k = x.shape()[R - 1], n = dy.shape()[R - 1];
  int64_t rows = 1;
  for (int d = 0; d + 1 < R; ++d) rows *= x.shape()[d];
  Tensor<T, 2> dw({k, n});
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t r = 0; r < rows; ++r) acc += double(x.data()[r * k + i]) * double(dy.data()[r * n + j]);
      dw.data()[i * n + j] = T(acc);
    }
  return dw;
}

// The Linear layer's contractions, for x [b, s, k] placed PX and W [k, n] placed PW,
// and an output gradient dy placed like the forward's output and Replicate.
template <class PX, class PW>
struct CheckLinear;
template <class... PX, class... PW>
struct CheckLinear<Placements<PX...>, Placements<PW...>> {
  template <int N>
  static void run(const DeviceMesh<N>& mesh, const Shape<3>& xs, int64_t n) {
    INFO("x ", names<PX...>(), " ", to_string(xs), " W ", names<PW...>(), " n ", n, " on ", mesh.to_string());
    const auto x = iota_tensor<double, 3>(xs);
    const auto w = positive<double, 2>({xs[2], n});
    const auto y_ref = ref_last(x, w);
    auto dx_ = make_source<PX...>(x, mesh);
    auto dw_ = make_source<PW...>(w, mesh);
    auto y = contract_last(dx_, dw_);
    CHECK(close(reconstruct(y), y_ref));
    const auto dy = positive<double, 3>(y_ref.shape());
    auto check_backward = [&]<class... PG>(Placements<PG...>) {
      INFO("dy ", names<PG...>());
      auto gdy = make_source<PG...>(dy, mesh);
      // The transposed forms on their own.
      CHECK(close(reconstruct(contract_last_transposed(gdy, dw_)), ref_last_t(dy, w)));
      CHECK(close(reconstruct(contract_leading(dx_, gdy)), ref_leading(x, dy)));
      // The backward: values, and placements by the dual rule.
      auto [gx, gw] = contract_last_backward(dx_, dw_, gdy);
      static_assert(is_gradient_of(decltype(gx)::placement_state, describe_all<PX...>()));
      static_assert(is_gradient_of(decltype(gw)::placement_state, describe_all<PW...>()));
      CHECK(close(reconstruct(gx), ref_last_t(dy, w)));
      CHECK(close(reconstruct(gw), ref_leading(x, dy)));
      CHECK(gx.layout().blocks == dx_.layout().blocks);  // the gradient of a block is that block's
      CHECK(gw.layout().blocks == dw_.layout().blocks);
    };
    check_backward(typename decltype(y)::placements{});
    if constexpr (!std::is_same_v<typename decltype(y)::placements, ReplicatedDTensor<double, 3, N>>)
      check_backward(typename ReplicatedDTensor<double, 3, N>::placements{});
  }
};

using XSet = std::tuple<Placements<Replicate>, Placements<Shard<0>>, Placements<Shard<1>>, Placements<Shard<2>>,
                        Placements<Partial<Sum>>>;
using WSet = std::tuple<Placements<Replicate>, Placements<Shard<0>>, Placements<Shard<1>>, Placements<Partial<Sum>>>;

TEST_CASE("contract_last, its transposed forms and its backward on every pair of 1-D placements") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    const int p = mesh.size();
    for (auto [xs, n] : {std::pair{Shape<3>{2, p + 1, 2 * p + 1}, int64_t{3}}, {Shape<3>{1, 2 * p, p}, int64_t{p + 2}}}) {
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (
            [&]<class PX>() {
              [&]<std::size_t... J>(std::index_sequence<J...>) {
                (CheckLinear<PX, std::tuple_element_t<J, WSet>>::run(mesh, xs, n), ...);
              }(std::make_index_sequence<std::tuple_size_v<WSet>>{});
            }.template operator()<std::tuple_element_t<I, XSet>>(),
            ...);
      }(std::make_index_sequence<std::tuple_size_v<XSet>>{});
    }
  });
}

TEST_CASE("contract_last and its backward on 2-D meshes: data parallel x tensor parallel") {
  for (auto [rows, cols] : {std::pair{2, 2}, {2, 3}}) {
    spmd(rows * cols, [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, {rows, cols});
      for (auto [xs, n] : {std::pair{Shape<3>{4, 5, 7}, int64_t{5}}, {Shape<3>{3, 2, 6}, int64_t{4}}}) {
        // batch over mesh dim 0; colwise, rowwise, sequence parallel over mesh dim 1
        CheckLinear<Placements<Shard<0>, Replicate>, Placements<Replicate, Shard<1>>>::run(mesh, xs, n);
        CheckLinear<Placements<Shard<0>, Shard<2>>, Placements<Replicate, Shard<0>>>::run(mesh, xs, n);
        CheckLinear<Placements<Shard<0>, Shard<1>>, Placements<Replicate, Replicate>>::run(mesh, xs, n);
        // both mesh dims on one operand, and Partial inputs
        CheckLinear<Placements<Shard<1>, Shard<1>>, Placements<Shard<1>, Shard<0>>>::run(mesh, xs, n);
        CheckLinear<Placements<Partial<Sum>, Shard<2>>, Placements<Replicate, Partial<Sum>>>::run(mesh, xs, n);
      }
    });
  }
}

TEST_CASE("the Linear layer's backward communicates as tensor parallelism expects") {
  spmd(4, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const auto x = iota_tensor<double, 3>({2, 3, 8});
    const auto w1 = positive<double, 2>({8, 6});
    const auto w2 = positive<double, 2>({6, 8});
    // Colwise: x R, W S(1): forward and backward local; dx is a Partial<Sum> (the one
    // all-reduce of the column-parallel backward happens where the caller reduces it).
    auto xr = make_source<Replicate>(x, mesh);
    auto w1c = make_source<Shard<1>>(w1, mesh);
    CommCounter c;
    auto h = contract_last(xr, w1c);
    static_assert(std::is_same_v<decltype(h)::placements, Placements<Shard<2>>>);
    auto [dx, dw1] = contract_last_backward(xr, w1c, h);
    static_assert(std::is_same_v<decltype(dx)::placements, Placements<Partial<Sum>>>);
    static_assert(std::is_same_v<decltype(dw1)::placements, Placements<Shard<1>>>);
    CHECK(c.count() == 0);
    // Rowwise: h S(2), W S(0): y P(Sum); dy R: dh S(2), dW S(0), all local.
    auto w2r = make_source<Shard<0>>(w2, mesh);
    auto y = contract_last(h, w2r);
    static_assert(std::is_same_v<decltype(y)::placements, Placements<Partial<Sum>>>);
    auto dy = make_source<Replicate>(positive<double, 3>({2, 3, 8}), mesh);
    auto [dh, dw2] = contract_last_backward(h, w2r, dy);
    static_assert(std::is_same_v<decltype(dh)::placements, Placements<Shard<2>>>);
    static_assert(std::is_same_v<decltype(dw2)::placements, Placements<Shard<0>>>);
    CHECK(c.count() == 0);
    CHECK(close(reconstruct(dw2), ref_leading(reconstruct(h), dy.full_tensor())));
  });
}

// matmul_backward on every pair of 1-D placements, with dC placed like C and Replicate.
template <class PA, class PB>
struct CheckMatmulBackward;
template <class... PA, class... PB>
struct CheckMatmulBackward<Placements<PA...>, Placements<PB...>> {
  template <int N>
  static void run(const DeviceMesh<N>& mesh, int64_t m, int64_t k, int64_t n) {
    INFO(names<PA...>(), " x ", names<PB...>(), " ", m, "x", k, "x", n, " on ", mesh.to_string());
    const auto a = iota_tensor<double, 2>({m, k});
    const auto b = positive<double, 2>({k, n});
    const auto dc = positive<double, 2>({m, n});
    Tensor<double, 2> da_ref({m, k}), db_ref({k, n});
    as_eigen(da_ref) = as_eigen(dc) * as_eigen(b).transpose();
    as_eigen(db_ref) = as_eigen(a).transpose() * as_eigen(dc);
    auto da_ = make_source<PA...>(a, mesh);
    auto db_ = make_source<PB...>(b, mesh);
    using PC = typename decltype(matmul(da_, db_))::placements;
    auto check = [&]<class... PG>(Placements<PG...>) {
      INFO("dC ", names<PG...>());
      auto [ga, gb] = matmul_backward(da_, db_, make_source<PG...>(dc, mesh));
      static_assert(is_gradient_of(decltype(ga)::placement_state, describe_all<PA...>()));
      static_assert(is_gradient_of(decltype(gb)::placement_state, describe_all<PB...>()));
      CHECK(close(reconstruct(ga), da_ref));
      CHECK(close(reconstruct(gb), db_ref));
    };
    check(PC{});
    check(Placements<Replicate>{});
  }
};

TEST_CASE("matmul_backward on every pair of 1-D placements") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    const int p = mesh.size();
    for (auto [m, k, n] : {std::array<int64_t, 3>{2 * p + 1, p + 2, 3}, {1, p > 1 ? p - 1 : 1, 2}, {3, 0, 2}})
      for_each_pair<Set>([&]<class A, class B>() { CheckMatmulBackward<A, B>::run(mesh, m, k, n); });
  });
}

// Finite differences in double: L(A, B) = <matmul(A, B), G> computed distributed;
// dL/dA and dL/dB from matmul_backward(A, B, G) must match central differences.
template <class... PA, class... PB, int N>
void finite_difference_check(Placements<PA...>, Placements<PB...>, const DeviceMesh<N>& mesh, int64_t m, int64_t k,
                             int64_t n) {
  const auto a = iota_tensor<double, 2>({m, k});
  const auto b = positive<double, 2>({k, n});
  const auto g = positive<double, 2>({m, n});
  auto loss = [&](const Tensor<double, 2>& av, const Tensor<double, 2>& bv) {
    const auto c = reconstruct(matmul(make_source<PA...>(av, mesh), make_source<PB...>(bv, mesh)));
    double s = 0;
    for (int64_t i = 0; i < c.numel(); ++i) s += c.data()[i] * g.data()[i];
    return s;
  };
  auto [ga, gb] = matmul_backward(make_source<PA...>(a, mesh), make_source<PB...>(b, mesh),
                                  make_source<Replicate, Replicate>(g, mesh));
  const auto da = reconstruct(ga), db = reconstruct(gb);
  const double h = 1e-3;
  auto fd = [&](const Tensor<double, 2>& x, int64_t i, bool wrt_a) {
    Tensor<double, 2> plus = x, minus = x;
    plus.data()[i] += h, minus.data()[i] -= h;
    return wrt_a ? (loss(plus, b) - loss(minus, b)) / (2 * h) : (loss(a, plus) - loss(a, minus)) / (2 * h);
  };
  for (int64_t i = 0; i < a.numel(); ++i) CHECK(da.data()[i] == doctest::Approx(fd(a, i, true)).epsilon(1e-8));
  for (int64_t i = 0; i < b.numel(); ++i) CHECK(db.data()[i] == doctest::Approx(fd(b, i, false)).epsilon(1e-8));
}

TEST_CASE("matmul_backward against finite differences on 2x2 and 2x3 meshes") {
  for (auto [rows, cols] : {std::pair{2, 2}, {2, 3}}) {
    spmd(rows * cols, [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, {rows, cols});
      using S0 = Shard<0>;
      using S1 = Shard<1>;
      using R = Replicate;
      using P = Partial<Sum>;
      finite_difference_check(Placements<S0, S1>{}, Placements<R, S0>{}, mesh, 5, 4, 3);
      finite_difference_check(Placements<R, R>{}, Placements<S1, P>{}, mesh, 3, 5, 4);
      finite_difference_check(Placements<P, S1>{}, Placements<S1, S0>{}, mesh, 4, 7, 2);
    });
  }
}

TEST_CASE("contraction backward: bad shapes are a clear error on every rank") {
  spmd(2, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    auto a = zeros<double, Shard<0>>(Shape<2>{4, 3}, mesh);
    auto b = zeros<double, Replicate>(Shape<2>{3, 5}, mesh);
    auto dc = zeros<double, Replicate>(Shape<2>{4, 4}, mesh);
    CHECK_THROWS_WITH_AS(matmul_backward(a, b, dc), doctest::Contains("is not the shape of the product"),
                         InvalidArgument);
    auto x = zeros<double, Shard<1>>(Shape<3>{2, 3, 4}, mesh);
    CHECK_THROWS_WITH_AS(contract_last(x, b), doctest::Contains("contracted (and batch) extents differ"),
                         InvalidArgument);
  });
}

TEST_CASE("explain_matmul prints the rule and the operands' plans") {
  constexpr auto local = explain_matmul<DTensor<double, 2, Shard<1>>, DTensor<double, 2, Shard<0>>>();
  CHECK(local.view() ==
        "contraction [S(1)] x [S(0)] -> [P(sum)] on a 1-D mesh\n first operand: used as it is\n second operand: used as "
        "it is\n");
  constexpr auto moved = explain_contraction<contraction_specs::last(3), Placements<Shard<1>>, Placements<Shard<0>>>();
  CHECK(moved.view().find("contraction [S(1)] x [S(0)] -> [S(1)] on a 1-D mesh") == 0);
  CHECK(moved.view().find("second operand: redistribute [S(0)] -> [R]") != std::string_view::npos);
  CHECK(moved.view().find("all_gather") != std::string_view::npos);
}

TEST_CASE("batched matmul, matvec and dot backward") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    const int p = mesh.size();
    const int64_t nb = p + 1, m = 3, k = 2 * p + 1, n = 2;
    const auto a = iota_tensor<double, 3>({nb, m, k});
    const auto b = positive<double, 3>({nb, k, n});
    const auto dc = positive<double, 3>({nb, m, n});
    Tensor<double, 3> da_ref({nb, m, k}), db_ref({nb, k, n});
    for (int64_t i = 0; i < nb; ++i) {
      using Map = Eigen::Map<const EigenRowMatrix<double>>;
      Map am(a.data() + i * m * k, m, k), bm(b.data() + i * k * n, k, n), gm(dc.data() + i * m * n, m, n);
      Eigen::Map<EigenRowMatrix<double>>(da_ref.data() + i * m * k, m, k) = gm * bm.transpose();
      Eigen::Map<EigenRowMatrix<double>>(db_ref.data() + i * k * n, k, n) = am.transpose() * gm;
    }
    auto check = [&]<class PA, class PB, class PG>() {
      INFO(names<PA>(), " x ", names<PB>(), " dC ", names<PG>(), " on ", mesh.to_string());
      auto [ga, gb] = matmul_backward(make_source<PA>(a, mesh), make_source<PB>(b, mesh), make_source<PG>(dc, mesh));
      CHECK(close(reconstruct(ga), da_ref));
      CHECK(close(reconstruct(gb), db_ref));
    };
    check.template operator()<Shard<0>, Shard<0>, Shard<0>>();          // batch
    check.template operator()<Shard<2>, Shard<1>, Replicate>();         // contracted: dA S(2), dB S(1)
    check.template operator()<Shard<1>, Replicate, Shard<1>>();         // rows of A
    check.template operator()<Replicate, Shard<2>, Partial<Sum>>();     // columns of B, a Partial gradient
    // matvec y = A x and dot s = x . y, through the generic contract_backward.
    const auto am = iota_tensor<double, 2>({2 * p + 1, p + 2});
    const auto x = positive<double, 1>({p + 2});
    const auto dy = positive<double, 1>({2 * p + 1});
    Tensor<double, 2> dam({2 * p + 1, p + 2});
    Tensor<double, 1> dx({p + 2});
    as_eigen(dam) = as_eigen(dy) * as_eigen(x).transpose();
    as_eigen(dx) = as_eigen(am).transpose() * as_eigen(dy);
    auto [gam, gx] = contract_backward<contraction_specs::matvec()>(make_source<Shard<0>>(am, mesh),
                                                                    make_source<Replicate>(x, mesh),
                                                                    make_source<Shard<0>>(dy, mesh));
    static_assert(std::is_same_v<decltype(gam)::placements, Placements<Shard<0>>>);
    CHECK(close(reconstruct(gam), dam));
    CHECK(close(reconstruct(gx), dx));
    Tensor<double, 0> ds(Shape<0>{});
    ds() = 2.5;
    auto [gdx, gdy] = contract_backward<contraction_specs::dot()>(make_source<Shard<0>>(x, mesh),
                                                                  make_source<Replicate>(x, mesh),
                                                                  make_source<Replicate>(ds, mesh));
    Tensor<double, 1> two_x({p + 2});
    as_eigen(two_x) = 2.5 * as_eigen(x);
    CHECK(close(reconstruct(gdx), two_x));
    CHECK(close(reconstruct(gdy), two_x));
  });
}
