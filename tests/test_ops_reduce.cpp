// Reductions, norms and softmax against the global computation; the exact mean on
// uneven shards (3,3,3,1 and 3,3,3,0).
#include "ops_support.hpp"

#include <cmath>

using namespace dtensor;
using namespace dtensor::test;

template <Reduction R>
Tensor<double, 1> reference(const Tensor<double, 2>& g, int dim) {
  auto e = as_eigen(g);
  Tensor<double, 1> out({g.shape()[1 - dim]});
  auto o = as_eigen(out);
  for (int64_t i = 0; i < out.numel(); ++i) {
    auto v = dim == 0 ? e.col(i).array().eval() : e.row(i).transpose().array().eval();
    if constexpr (R == Reduction::Sum) o(i) = v.sum();
    else if constexpr (R == Reduction::Mean) o(i) = v.sum() / double(v.size());
    else if constexpr (R == Reduction::Max) o(i) = v.size() ? v.maxCoeff() : -INFINITY;
    else o(i) = v.size() ? v.minCoeff() : INFINITY;
  }
  return out;
}

template <class... P>
void check_reductions(const DeviceMesh<sizeof...(P)>& mesh, const Shape<2>& shape) {
  const auto g = iota_tensor<double, 2>(shape);
  auto x = make_source<P...>(g, mesh);
  INFO(names<P...>(), " ", to_string(shape), " on ", mesh.to_string());
  CHECK(close(reconstruct(sum<0>(x)), reference<Reduction::Sum>(g, 0)));
  CHECK(close(reconstruct(sum<1>(x)), reference<Reduction::Sum>(g, 1)));
  if (shape[0] > 0) CHECK(close(reconstruct(mean<0>(x)), reference<Reduction::Mean>(g, 0)));
  if (shape[1] > 0) CHECK(close(reconstruct(mean<1>(x)), reference<Reduction::Mean>(g, 1)));
  CHECK(close(reconstruct(max<0>(x)), reference<Reduction::Max>(g, 0)));
  CHECK(close(reconstruct(min<1>(x)), reference<Reduction::Min>(g, 1)));
  auto v = sum<0, Reduced::Value>(x);  // no Partial left; other shards stay
  for (auto p : decltype(v)::placement_state) CHECK(!p.is_partial());
  CHECK(close(reconstruct(v), reference<Reduction::Sum>(g, 0)));
}

TEST_CASE("sum, mean, max, min over either dim, every 1-D placement") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    for (const auto& shape : op_shapes(mesh.size())) {
      check_reductions<Replicate>(mesh, shape);
      check_reductions<Shard<0>>(mesh, shape);
      check_reductions<Shard<1>>(mesh, shape);
      check_reductions<Partial<Sum>>(mesh, shape);
      check_reductions<Partial<Max>>(mesh, shape);
      check_reductions<Partial<Avg>>(mesh, shape);
    }
  });
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    check_reductions<Shard<0>, Shard<0>>(mesh, {7, 3});
    check_reductions<Shard<1>, Partial<Sum>>(mesh, {5, 5});
    check_reductions<Partial<Max>, Shard<0>>(mesh, {3, 2});
  });
}

TEST_CASE("the mean over uneven shards is exact: 3,3,3,1 and 3,3,3,0") {
  spmd(4, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    for (int64_t n : {10, 9}) {
      Tensor<double, 1> g({n});
      for (int64_t i = 0; i < n; ++i) g(i) = double(i * i);  // uneven values make a mean of means wrong
      auto x = distribute<Shard<0>>(g, mesh);
      CHECK(x.local().numel() == (comm.rank() < 3 ? 3 : n - 9));
      const double exact = as_eigen(g).sum() / double(n);
      CHECK(value(mean<0>(x)) == doctest::Approx(exact).epsilon(1e-15));
      // What a naive implementation computes, the average over the 4 ranks of their
      // local means (an empty shard's taken as 0), is wrong for both splits.
      double naive = 0;
      for (int64_t r = 0; r < 4; ++r) {
        const int64_t lo = std::min<int64_t>(3 * r, n), hi = std::min<int64_t>(3 * r + 3, n);
        double s = 0;
        for (int64_t i = lo; i < hi; ++i) s += g(i);
        naive += hi > lo ? s / double(hi - lo) : 0.0;
      }
      CHECK(naive / 4 != doctest::Approx(exact));
    }
    // Explicit sizes, as in ShardTensor, with an empty block.
    Tensor<double, 1> g({8}, {1, 2, 3, 4, 5, 6, 7, 100});
    auto x = distribute<Shard<0>>(g, mesh, 0, {std::vector<int64_t>{5, 0, 2, 1}});
    CHECK(value(mean<0>(x)) == doctest::Approx(128.0 / 8).epsilon(1e-15));
    CHECK(mean<0, Reduced::Value>(x).local()() == doctest::Approx(128.0 / 8).epsilon(1e-15));
  });
}

TEST_CASE("norms") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    const auto g = iota_tensor<double, 2>({2 * mesh.size() + 1, 3});
    const double n2 = as_eigen(g).norm(), nmax = as_eigen(g).cwiseAbs().maxCoeff();
    CHECK(norm2(make_source<Shard<0>>(g, mesh)) == doctest::Approx(n2));
    CHECK(norm2(make_source<Replicate>(g, mesh)) == doctest::Approx(n2));
    CHECK(norm2(make_source<Partial<Sum>>(g, mesh)) == doctest::Approx(n2));
    CHECK(norm_max(make_source<Shard<1>>(g, mesh)) == nmax);
    CHECK(norm_max(make_source<Partial<Max>>(g, mesh)) == nmax);
  });
}

template <bool Log>
Tensor<double, 2> softmax_reference(const Tensor<double, 2>& g, int dim) {
  Tensor<double, 2> out(g.shape());
  auto e = as_eigen(g);
  auto o = as_eigen(out);
  for (int64_t i = 0; i < (dim == 1 ? g.shape()[0] : g.shape()[1]); ++i) {
    Eigen::ArrayXd v = dim == 1 ? e.row(i).transpose().array().eval() : e.col(i).array().eval();
    const double mx = v.maxCoeff();
    const double lse = mx + std::log((v - mx).exp().sum());
    Eigen::ArrayXd r = Log ? (v - lse).eval() : (v - lse).exp().eval();
    if (dim == 1) o.row(i) = r.transpose().matrix();
    else o.col(i) = r.matrix();
  }
  return out;
}

TEST_CASE("softmax and log_softmax along a sharded or unsharded dim, numerically stable") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    for (const auto& shape : {Shape<2>{3, 2 * mesh.size() + 1}, Shape<2>{2 * mesh.size() + 1, 3}}) {
      auto g = iota_tensor<double, 2>(shape);
      g(0, 0) = -1000;  // exp underflows: log_softmax must stay finite
      g(shape[0] - 1, shape[1] - 1) = 800;  // exp overflows without the max shift
      for (int dim : {0, 1}) {
        INFO("dim ", dim, " shape ", to_string(shape), " on ", mesh.to_string());
        auto check = [&](const auto& x) {
          if (dim == 0) {
            CHECK(close(reconstruct(softmax<0>(x)), softmax_reference<false>(g, 0)));
            CHECK(close(reconstruct(log_softmax<0>(x)), softmax_reference<true>(g, 0)));
          } else {
            CHECK(close(reconstruct(softmax<1>(x)), softmax_reference<false>(g, 1)));
            CHECK(close(reconstruct(log_softmax<1>(x)), softmax_reference<true>(g, 1)));
          }
        };
        check(make_source<Shard<1>>(g, mesh));
        check(make_source<Shard<0>>(g, mesh));
        check(make_source<Replicate>(g, mesh));
        check(make_source<Partial<Sum>>(g, mesh));
      }
    }
  });
}

TEST_CASE("softmax along a sharded dim all-reduces a max and a sum, nothing else") {
  spmd(3, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    auto x = rand<double, Shard<1>>(Shape<2>{4, 7}, mesh, 3);
    CommCounter c;
    (void)softmax<1>(x);
    CHECK(c.count() == 2);
    CHECK(c.count(StepKind::AllReduce) == 2);
    CommCounter local;
    (void)softmax<0>(x);
    CHECK(local.count() == 0);
  });
}

template <class T, int Rank>
Tensor<T, Rank> cast(const Tensor<double, Rank>& g) {
  Tensor<T, Rank> t(g.shape());
  for (int64_t i = 0; i < g.numel(); ++i) t.data()[i] = static_cast<T>(g.data()[i]);
  return t;
}

TEST_CASE("reductions and softmax in float, against the double reference at float tolerance") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    for (const auto& shape : op_shapes(mesh.size())) {
      const auto g = iota_tensor<double, 2>(shape);
      const auto f = cast<float>(g);
      Tensor<double, 2> scaled = g;  // softmax of 0.1 x: values of moderate range for float
      for (int64_t i = 0; i < scaled.numel(); ++i) scaled.data()[i] *= 0.1;
      auto check = [&](const auto& x) {
        CHECK(close(reconstruct(sum<0>(x)), cast<float>(reference<Reduction::Sum>(g, 0))));
        if (shape[1] > 0) CHECK(close(reconstruct(mean<1>(x)), cast<float>(reference<Reduction::Mean>(g, 1))));
        CHECK(close(reconstruct(max<0>(x)), cast<float>(reference<Reduction::Max>(g, 0))));
        CHECK(close(reconstruct(softmax<1>(mul(x, 0.1f))), cast<float>(softmax_reference<false>(scaled, 1))));
      };
      check(make_source<Shard<0>>(f, mesh));
      check(make_source<Shard<1>>(f, mesh));
      check(make_source<Partial<Sum>>(f, mesh));
    }
  });
}

