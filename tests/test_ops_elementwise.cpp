// Elementwise operators on every pair of placements of a 1-D mesh (and a 2x2
// mesh), against the same operation on the global tensor.
#include "ops_support.hpp"

#include <cmath>
#include <complex>
#include <limits>

using namespace dtensor;
using namespace dtensor::test;

// Output placements, decided by the compiler.
template <class X>
using P1 = typename X::placements;
using DS0 = DTensor<float, 2, Shard<0>>;
using DS1 = DTensor<float, 2, Shard<1>>;
using DR = DTensor<float, 2, Replicate>;
using DPS = DTensor<float, 2, Partial<Sum>>;
using DPM = DTensor<float, 2, Partial<Max>>;
static_assert(std::is_same_v<P1<decltype(add(std::declval<DS0>(), std::declval<DR>()))>, Placements<Shard<0>>>);
static_assert(std::is_same_v<P1<decltype(add(std::declval<DR>(), std::declval<DS1>()))>, Placements<Shard<1>>>);
static_assert(std::is_same_v<P1<decltype(add(std::declval<DPS>(), std::declval<DPS>()))>, Placements<Partial<Sum>>>);
static_assert(std::is_same_v<P1<decltype(add(std::declval<DPS>(), std::declval<DR>()))>, Placements<Partial<Sum>>>);
static_assert(std::is_same_v<P1<decltype(mul(std::declval<DPS>(), std::declval<DR>()))>, Placements<Partial<Sum>>>);
static_assert(std::is_same_v<P1<decltype(mul(std::declval<DPS>(), std::declval<DPS>()))>, Placements<Partial<Sum>>>);
static_assert(std::is_same_v<P1<decltype(div(std::declval<DR>(), std::declval<DPS>()))>, Placements<Replicate>>);
static_assert(std::is_same_v<P1<decltype(add(std::declval<DPS>(), std::declval<DS1>()))>, Placements<Shard<1>>>);
static_assert(std::is_same_v<P1<decltype(add(std::declval<DPM>(), std::declval<DPM>()))>, Placements<Replicate>>);
static_assert(std::is_same_v<P1<decltype(mul(std::declval<DPS>(), 2.f))>, Placements<Partial<Sum>>>);
static_assert(std::is_same_v<P1<decltype(neg(std::declval<DPS>()))>, Placements<Partial<Sum>>>);
static_assert(std::is_same_v<P1<decltype(exp(std::declval<DPS>()))>, Placements<Replicate>>);

using Set = std::tuple<Placements<Replicate>, Placements<Shard<0>>, Placements<Shard<1>>, Placements<Partial<Sum>>,
                       Placements<Partial<Avg>>, Placements<Partial<Max>>>;

template <class T, BinaryOp K, class PA, class PB>
struct CheckBinary;
template <class T, BinaryOp K, class... PA, class... PB>
struct CheckBinary<T, K, Placements<PA...>, Placements<PB...>> {
  template <int M>
  static void run(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
    const auto ga = iota_tensor<T, 2>(shape);
    const auto gb = positive<T, 2>(shape);  // nonzero: a divisor
    auto y = binary<K>(make_source<PA...>(ga, mesh), make_source<PB...>(gb, mesh));
    Tensor<T, 2> ref(shape);
    for (int64_t i = 0; i < ref.numel(); ++i) {  // element by element, apart from the library's Eigen code
      const T a = ga.data()[i], b = gb.data()[i];
      ref.data()[i] = K == BinaryOp::Add ? a + b : K == BinaryOp::Sub ? a - b : K == BinaryOp::Mul ? a * b : a / b;
    }
    INFO(names<PA...>(), " op ", names<PB...>(), " shape ", to_string(shape), " on ", mesh.to_string());
    CHECK(close(reconstruct(y), ref));
  }
};

template <class T>
void all_binary_pairs() {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    for (const auto& shape : op_shapes(mesh.size()))
      for_each_pair<Set>([&]<class A, class B>() {
        CheckBinary<T, BinaryOp::Add, A, B>::run(mesh, shape);
        CheckBinary<T, BinaryOp::Sub, A, B>::run(mesh, shape);
        CheckBinary<T, BinaryOp::Mul, A, B>::run(mesh, shape);
        CheckBinary<T, BinaryOp::Div, A, B>::run(mesh, shape);
      });
  });
}

TEST_CASE("binary operators on every pair of 1-D placements, double") { all_binary_pairs<double>(); }
TEST_CASE("binary operators on every pair of 1-D placements, float") { all_binary_pairs<float>(); }

TEST_CASE("binary operators on a 2x2 mesh, nested and mixed placements") {
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    for (const auto& shape : {Shape<2>{5, 7}, Shape<2>{1, 3}}) {
      CheckBinary<double, BinaryOp::Add, Placements<Shard<0>, Shard<0>>, Placements<Shard<1>, Replicate>>::run(mesh, shape);
      CheckBinary<double, BinaryOp::Mul, Placements<Partial<Sum>, Shard<1>>, Placements<Replicate, Partial<Sum>>>::run(mesh, shape);
      CheckBinary<double, BinaryOp::Sub, Placements<Partial<Sum>, Partial<Avg>>, Placements<Replicate, Replicate>>::run(mesh, shape);
      CheckBinary<float, BinaryOp::Div, Placements<Shard<1>, Partial<Max>>, Placements<Partial<Sum>, Shard<0>>>::run(mesh, shape);
    }
  });
}

// The operators are the functions (ops/arithmetic.hpp): the same placements, decided
// by the same rule, and the same values bit for bit.
template <class X, class Y>
constexpr bool same_as_functions = std::is_same_v<decltype(std::declval<X>() + std::declval<Y>()),
                                                  decltype(add(std::declval<X>(), std::declval<Y>()))> &&
                                   std::is_same_v<decltype(std::declval<X>() - std::declval<Y>()),
                                                  decltype(sub(std::declval<X>(), std::declval<Y>()))> &&
                                   std::is_same_v<decltype(std::declval<X>() * std::declval<Y>()),
                                                  decltype(mul(std::declval<X>(), std::declval<Y>()))> &&
                                   std::is_same_v<decltype(std::declval<X>() / std::declval<Y>()),
                                                  decltype(div(std::declval<X>(), std::declval<Y>()))>;
static_assert(same_as_functions<DS0, DR> && same_as_functions<DPS, DR> && same_as_functions<DPS, DS1> &&
              same_as_functions<DPM, DPS>);
static_assert(std::is_same_v<P1<decltype(-std::declval<DPS>())>, Placements<Partial<Sum>>>);
static_assert(std::is_same_v<P1<decltype(2.f - std::declval<DPS>())>, Placements<Partial<Sum>>>);
static_assert(std::is_same_v<P1<decltype(std::declval<DPM>() * 2)>, Placements<Replicate>>);
// Compound forms exist where the result keeps the left operand's placements.
static_assert(requires(DS0 x, const DR& r, const DS0& y) { x += r, x -= y, x *= 2.f, x /= r; });

template <class T, class PA, class PB>
struct CheckOperators;
template <class T, class... PA, class... PB>
struct CheckOperators<T, Placements<PA...>, Placements<PB...>> {
  template <int M>
  static void run(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
    const auto ga = iota_tensor<T, 2>(shape);
    const auto gb = positive<T, 2>(shape);
    const auto a = make_source<PA...>(ga, mesh);
    const auto b = make_source<PB...>(gb, mesh);
    INFO(names<PA...>(), " op ", names<PB...>(), " shape ", to_string(shape), " on ", mesh.to_string());
    CHECK(reconstruct(a + b) == reconstruct(add(a, b)));
    CHECK(reconstruct(a - b) == reconstruct(sub(a, b)));
    CHECK(reconstruct(a * b) == reconstruct(mul(a, b)));
    CHECK(reconstruct(a / b) == reconstruct(div(a, b)));
    CHECK(reconstruct(-a) == reconstruct(neg(a)));
    CHECK(reconstruct(a * T(2.5)) == reconstruct(mul(a, T(2.5))));
    CHECK(reconstruct(T(2.5) * a) == reconstruct(mul(a, T(2.5))));
    CHECK(reconstruct(a + T(1.5)) == reconstruct(add(a, T(1.5))));
    CHECK(reconstruct(T(1.5) + a) == reconstruct(add(a, T(1.5))));
    CHECK(reconstruct(a - T(1.5)) == reconstruct(sub(a, T(1.5))));
    CHECK(reconstruct(a / T(4)) == reconstruct(div(a, T(4))));
    // s - a against the global tensor (no function of that name to compare with).
    Tensor<T, 2> ref(shape);
    for (int64_t i = 0; i < ref.numel(); ++i) ref.data()[i] = T(1.5) - ga.data()[i];
    CHECK(close(reconstruct(T(1.5) - a), ref));
    if constexpr (std::is_same_v<decltype(a + b), std::remove_const_t<decltype(a)>>) {
      auto c = a;
      c += b;
      CHECK(reconstruct(c) == reconstruct(add(a, b)));
      c = a;
      c /= b;
      CHECK(reconstruct(c) == reconstruct(div(a, b)));
    }
  }
};

TEST_CASE("operators + - * / and unary minus are add, sub, mul, div and neg, bit for bit") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    for (const auto& shape : op_shapes(mesh.size()))
      for_each_pair<Set>([&]<class A, class B>() { CheckOperators<double, A, B>::run(mesh, shape); });
  });
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    for (const auto& shape : {Shape<2>{5, 7}, Shape<2>{1, 3}}) {
      CheckOperators<float, Placements<Shard<0>, Shard<0>>, Placements<Shard<1>, Replicate>>::run(mesh, shape);
      CheckOperators<float, Placements<Partial<Sum>, Shard<1>>, Placements<Replicate, Partial<Sum>>>::run(mesh, shape);
    }
  });
}

template <class F, class G>
void check_unary(F&& op, G&& ref_fn, bool positive_input) {
  on_1d_meshes([&](const DeviceMesh<1>& mesh) {
    for (const auto& shape : op_shapes(mesh.size())) {
      const auto g = positive_input ? positive<double, 2>(shape) : iota_tensor<double, 2>(shape);
      Tensor<double, 2> ref(shape);
      as_eigen_array(ref) = ref_fn(as_eigen_array(g));
      CHECK(close(reconstruct(op(make_source<Shard<1>>(g, mesh))), ref));
      CHECK(close(reconstruct(op(make_source<Partial<Sum>>(g, mesh))), ref));
      CHECK(close(reconstruct(op(make_source<Partial<Max>>(g, mesh))), ref));
      CHECK(close(reconstruct(op(make_source<Replicate>(g, mesh))), ref));
    }
  });
}

TEST_CASE("unary functions") {
  check_unary([](const auto& x) { return neg(x); }, [](const auto& a) { return (-a).eval(); }, false);
  check_unary([](const auto& x) { return exp(mul(x, 0.1)); }, [](const auto& a) { return (a * 0.1).exp().eval(); }, false);
  check_unary([](const auto& x) { return log(x); }, [](const auto& a) { return a.log().eval(); }, true);
  check_unary([](const auto& x) { return sqrt(x); }, [](const auto& a) { return a.sqrt().eval(); }, true);
  check_unary([](const auto& x) { return abs(x); }, [](const auto& a) { return a.abs().eval(); }, false);
  check_unary([](const auto& x) { return relu(x); }, [](const auto& a) { return a.max(0.0).eval(); }, false);
  check_unary([](const auto& x) { return tanh(mul(x, 0.1)); }, [](const auto& a) { return (a * 0.1).tanh().eval(); }, false);
  check_unary([](const auto& x) { return sigmoid(x); }, [](const auto& a) { return (1.0 + (-a).exp()).inverse().eval(); }, false);
}

TEST_CASE("scalar operands: a scalar added to Partial<Sum> terms is added once") {
  check_unary([](const auto& x) { return add(x, 2.5); }, [](const auto& a) { return (a + 2.5).eval(); }, false);
  check_unary([](const auto& x) { return sub(x, 1.0); }, [](const auto& a) { return (a - 1.0).eval(); }, false);
  check_unary([](const auto& x) { return mul(x, -3.0); }, [](const auto& a) { return (a * -3.0).eval(); }, false);
  check_unary([](const auto& x) { return div(x, 4.0); }, [](const auto& a) { return (a / 4.0).eval(); }, false);
}

TEST_CASE("bias broadcast along rows and columns") {
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    for (const auto& shape : op_shapes(mesh.size())) {
      const auto g = iota_tensor<double, 2>(shape);
      const auto row = positive<double, 1>({shape[1]});
      const auto col = positive<double, 1>({shape[0]});
      Tensor<double, 2> ref_r(shape), ref_c(shape);
      as_eigen(ref_r) = as_eigen(g).rowwise() + as_eigen(row).transpose();
      as_eigen(ref_c) = as_eigen(g).colwise() + as_eigen(col);
      CHECK(close(reconstruct(add_bias<Along::Rows>(make_source<Shard<1>>(g, mesh), make_source<Replicate>(row, mesh))), ref_r));
      CHECK(close(reconstruct(add_bias<Along::Rows>(make_source<Shard<0>>(g, mesh), make_source<Shard<0>>(row, mesh))), ref_r));
      CHECK(close(reconstruct(add_bias<Along::Rows>(make_source<Partial<Sum>>(g, mesh), make_source<Replicate>(row, mesh))), ref_r));
      CHECK(close(reconstruct(add_bias<Along::Columns>(make_source<Shard<0>>(g, mesh), make_source<Shard<0>>(col, mesh))), ref_c));
      CHECK(close(reconstruct(add_bias<Along::Columns>(make_source<Partial<Max>>(g, mesh), make_source<Partial<Sum>>(col, mesh))), ref_c));
    }
  });
}

TEST_CASE("communication accounting: exactly the collectives the rules call for") {
  spmd(3, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const auto g = iota_tensor<double, 2>({7, 5});
    auto s0 = make_source<Shard<0>>(g, mesh);
    auto s1 = make_source<Shard<1>>(g, mesh);
    auto r = make_source<Replicate>(g, mesh);
    auto p = make_source<Partial<Sum>>(g, mesh);
    auto count = [](auto&& f) {
      CommCounter c;
      f();
      return std::pair{c.count(), c.count(StepKind::AllReduce)};
    };
    CHECK(count([&] { (void)add(s0, r); }) == std::pair{0, 0});
    CHECK(count([&] { (void)add(p, p); }) == std::pair{0, 0});
    CHECK(count([&] { (void)mul(p, r); }) == std::pair{0, 0});
    CHECK(count([&] { (void)add(p, 1.0); }) == std::pair{0, 0});
    CHECK(count([&] { (void)mul(p, p); }) == std::pair{1, 1});
    CHECK(count([&] { (void)exp(p); }) == std::pair{1, 1});
    CHECK(count([&] { (void)add(s0, s1); }) == std::pair{1, 0});  // one all-to-all
    CommCounter c;
    (void)add(p, s0);
    CHECK(c.count(StepKind::ReduceScatter) == 1);
    CHECK(c.count() == 1);
    CHECK(c.bytes() == 7 * 5 * sizeof(double));
  });
}

TEST_CASE("operands split into different blocks are a clear error") {
  spmd(2, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const auto g = iota_tensor<double, 2>({4, 2});
    auto a = distribute<Shard<0>>(g, mesh);
    auto b = distribute<Shard<0>>(g, mesh, 0, {std::vector<int64_t>{3, 1}, {}});
    CHECK_THROWS_WITH_AS(add(a, b), doctest::Contains("different block sizes"), InvalidArgument);
  });
}

// ---- The parts of complex tensors (ops/complex.hpp) ----
using Z = std::complex<double>;
using DZP = DTensor<Z, 2, Partial<Sum>>;
static_assert(std::is_same_v<P1<decltype(real(std::declval<DZP>()))>, Placements<Partial<Sum>>>);
static_assert(std::is_same_v<P1<decltype(imag(std::declval<DTensor<Z, 2, Partial<Avg>>>()))>,
                             Placements<Partial<Avg>>>);
static_assert(std::is_same_v<P1<decltype(conj(std::declval<DZP>()))>, Placements<Partial<Sum>>>);
static_assert(std::is_same_v<P1<decltype(abs(std::declval<DZP>()))>, Placements<Replicate>>);
static_assert(std::is_same_v<P1<decltype(angle(std::declval<DTensor<Z, 2, Shard<1>>>()))>, Placements<Shard<1>>>);
static_assert(std::is_same_v<decltype(abs(std::declval<DZP>()))::value_type, double>);
static_assert(std::is_same_v<P1<decltype(make_complex(std::declval<DPS>(), std::declval<DR>()))>,
                             Placements<Partial<Sum>>>);

namespace {
// The placements of a gradient of a tensor placed PL: Replicate for a Partial.
template <class PL>
struct GradSource;
template <class... P>
struct GradSource<Placements<P...>> {
  template <class T, int M>
  static auto make(const Tensor<T, 2>& g, const DeviceMesh<M>& mesh) {
    if constexpr (is_complex_v<T>) {  // made of its parts, each placed so
      Tensor<double, 2> re(g.shape()), im(g.shape());
      for (int64_t i = 0; i < g.numel(); ++i) re.data()[i] = g.data()[i].real(), im.data()[i] = g.data()[i].imag();
      return make_complex(make(re, mesh), make(im, mesh));
    } else {
      return make_source<std::conditional_t<is_partial_v<P>, Replicate, P>...>(g, mesh);
    }
  }
};

// Real and imaginary parts of the test's complex tensors: element 0 is 0 + 0i (where
// abs and angle take PyTorch's zero gradient), the others mixed signs and sizes.
std::pair<Tensor<double, 2>, Tensor<double, 2>> complex_parts_of(const Shape<2>& shape) {
  Tensor<double, 2> re(shape), im(shape);
  for (int64_t i = 0; i < re.numel(); ++i) {
    re.data()[i] = i == 0 ? 0 : static_cast<double>((i * 7 + 3) % 41 - 20) / 8;
    im.data()[i] = i == 0 ? 0 : static_cast<double>((i * 5 + 2) % 23 - 11) / 4;
  }
  return {std::move(re), std::move(im)};
}

template <class F>
double worst_over(int64_t n, F&& f) {
  double w = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = f(i);
    w = std::isnan(e) || std::isnan(w) ? std::numeric_limits<double>::quiet_NaN() : std::max(w, e);
  }
  return w;
}

// z = make_complex(re, im) with re placed PA and im placed PB: every part and its
// gradient against the element functions of the global tensors, and each gradient
// against central differences of L(z) = sum g part(z) in the real and imaginary
// directions (the gradient is dL/dx + i dL/dy).
template <class PA, class PB>
struct CheckComplexParts;
template <class... PA, class... PB>
struct CheckComplexParts<Placements<PA...>, Placements<PB...>> {
  template <int M>
  static void run(const DeviceMesh<M>& mesh, const Shape<2>& shape) {
    INFO("re ", names<PA...>(), " im ", names<PB...>(), " shape ", to_string(shape), " on ", mesh.to_string());
    const auto [gre, gim] = complex_parts_of(shape);
    const auto re = make_source<PA...>(gre, mesh);
    const auto im = make_source<PB...>(gim, mesh);
    const auto z = make_complex(re, im);
    const int64_t n = gre.numel();
    const auto zf = z.full_tensor();
    auto zat = [&](int64_t i) { return Z(gre.data()[i], gim.data()[i]); };
    CHECK(worst_over(n, [&](int64_t i) { return std::abs(zf.data()[i] - zat(i)); }) == 0);

    // The forward of each part, and its gradient for g = a real tensor placed as the
    // gradient of the part's output.
    const auto g = positive<double, 2>(shape);
    auto check_part = [&](auto part, auto part_backward, auto element, const char* what, bool linear) {
      INFO(what);
      const auto y = part(z);
      const auto yf = y.full_tensor();
      CHECK(worst_over(n, [&](int64_t i) { return std::abs(yf.data()[i] - element(zat(i))); }) <= 1e-15);
      using Y = std::remove_cvref_t<decltype(y)>;
      const auto dy = GradSource<typename Y::placements>::make(g, mesh);
      const auto dz = part_backward(z, dy);
      const auto dzf = dz.full_tensor();
      const double h = 1e-6;
      CHECK(worst_over(n, [&](int64_t i) {
              const Z zi = zat(i);
              const double gi = g.data()[i];
              // abs and angle have no derivative at 0: PyTorch's gradient there is 0.
              if (zi == Z(0) && !linear) return std::abs(dzf.data()[i]);
              auto L = [&](Z v) { return gi * element(v); };
              const Z fd((L(zi + h) - L(zi - h)) / (2 * h), (L(zi + Z(0, h)) - L(zi - Z(0, h))) / (2 * h));
              return std::abs(dzf.data()[i] - fd) / std::max(1.0, std::abs(fd));
            }) < 1e-8);
    };
    check_part([](const auto& v) { return real(v); }, [](const auto& v, const auto& d) { return real_backward(v, d); },
               [](Z v) { return v.real(); }, "real", true);
    check_part([](const auto& v) { return imag(v); }, [](const auto& v, const auto& d) { return imag_backward(v, d); },
               [](Z v) { return v.imag(); }, "imag", true);
    check_part([](const auto& v) { return abs(v); }, [](const auto& v, const auto& d) { return abs_backward(v, d); },
               [](Z v) { return std::abs(v); }, "abs", false);
    check_part([](const auto& v) { return angle(v); },
               [](const auto& v, const auto& d) { return angle_backward(v, d); }, [](Z v) { return std::arg(v); },
               "angle", false);

    // conj and its gradient conj(dy); make_complex's gradient: the parts of dz.
    Tensor<Z, 2> gz(shape);
    for (int64_t i = 0; i < n; ++i) gz.data()[i] = Z(g.data()[i], -0.5 * g.data()[i] + 1);
    const auto c = conj(z);
    const auto cf = c.full_tensor();
    CHECK(worst_over(n, [&](int64_t i) { return std::abs(cf.data()[i] - std::conj(zat(i))); }) == 0);
    using CZ = std::remove_cvref_t<decltype(c)>;
    const auto dc = GradSource<typename CZ::placements>::make(gz, mesh);
    const auto dcz = conj_backward(z, dc).full_tensor();
    CHECK(worst_over(n, [&](int64_t i) { return std::abs(dcz.data()[i] - std::conj(gz.data()[i])); }) == 0);
    const auto dz = GradSource<typename decltype(z)::placements>::make(gz, mesh);
    const auto [dre, dim] = make_complex_backward(re, im, dz);
    const auto dref = dre.full_tensor(), dimf = dim.full_tensor();
    CHECK(worst_over(n, [&](int64_t i) {
            return std::abs(dref.data()[i] - gz.data()[i].real()) + std::abs(dimf.data()[i] - gz.data()[i].imag());
          }) <= 1e-15);
  }
};
}  // namespace

TEST_CASE("complex parts: real, imag, abs, angle, conj and make_complex with their gradients") {
  using Set4 = std::tuple<Placements<Replicate>, Placements<Shard<0>>, Placements<Shard<1>>, Placements<Partial<Sum>>>;
  on_1d_meshes([](const DeviceMesh<1>& mesh) {
    for (const auto& shape : op_shapes(mesh.size()))
      for_each_pair<Set4>([&]<class A, class B>() { CheckComplexParts<A, B>::run(mesh, shape); });
  });
  spmd(4, [](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    for (const auto& shape : {Shape<2>{5, 7}, Shape<2>{1, 3}}) {
      CheckComplexParts<Placements<Shard<0>, Partial<Sum>>, Placements<Shard<0>, Replicate>>::run(mesh, shape);
      CheckComplexParts<Placements<Shard<1>, Shard<0>>, Placements<Shard<1>, Shard<0>>>::run(mesh, shape);
      CheckComplexParts<Placements<Partial<Sum>, Shard<1>>, Placements<Replicate, Partial<Sum>>>::run(mesh, shape);
    }
  });
}

TEST_CASE("complex parts: the collectives the rules call for, and bad input") {
  spmd(3, [](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const auto [gre, gim] = complex_parts_of({7, 5});
    const auto p = make_complex(make_source<Partial<Sum>>(gre, mesh), make_source<Partial<Sum>>(gim, mesh));
    auto count = [](auto&& f) {
      CommCounter c;
      f();
      return std::pair{c.count(), c.count(StepKind::AllReduce)};
    };
    CHECK(count([&] { (void)real(p); }) == std::pair{0, 0});
    CHECK(count([&] { (void)conj(p); }) == std::pair{0, 0});
    CHECK(count([&] { (void)abs(p); }) == std::pair{1, 1});
    CHECK(count([&] { (void)angle(p); }) == std::pair{1, 1});
    // Parts of other shapes or blocks are refused by name.
    const auto a = distribute<Shard<0>>(gre, mesh);
    const auto b = distribute<Shard<0>>(gim, mesh, 0, {std::vector<int64_t>{1, 2, 4}, {}});
    CHECK_THROWS_WITH_AS(make_complex(a, b), doctest::Contains("different block sizes"), InvalidArgument);
  });
}
