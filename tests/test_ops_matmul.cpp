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
