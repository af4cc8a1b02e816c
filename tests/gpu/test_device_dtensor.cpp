// DTensors on a device: the in-process runtime with device buffers (ranks as threads
// sharing one GPU), 1, 2 and 4 ranks, 1-D and 2x2 meshes, even, uneven and empty
// shapes. Every program runs twice, once on host tensors and once on device
// tensors, and the device result (copied back) must equal the host one: bit for bit
// where only data moves, within rounding where the device computes.
//
// Compiled once (it names no backend) and linked twice: with the CUDA backend
// (gpu_test_device_dtensor, label gpu, a real GPU), and with the emulated device of tests/emulated_device.hpp
// (test_device_emulated, every CI run), whose device pointers fault when the host
// dereferences them, so that every device path of the core is exercised without a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include <dtensor/dtensor.hpp>
#include <dtensor/ops/backward.hpp>

#include "device_vs_host.hpp"

using namespace dtensor;
using test::check_close;
using test::iota;

namespace {

// Runs program(mesh) on n ranks with buffers on `dev`; returns rank 0's copy of the
// global result on the host.
template <int M, class Program>
auto run_on(Device dev, const std::array<int, M>& mesh_shape, Program&& program) {
  using Result = decltype(program(std::declval<const DeviceMesh<M>&>()).full_tensor());
  int n = 1;
  for (int s : mesh_shape) n *= s;
  Result out;
  RunOptions opt;
  opt.device = dev;
  run_threads(
      n,
      [&](Comm& comm) {
        DeviceMesh<M> mesh(comm, mesh_shape);
        auto y = program(mesh).full_tensor();
        REQUIRE(y.device() == dev);
        if (comm.rank() == 0) out = y.to(Device::host());
      },
      opt);
  return out;
}


// Host and device runs of one program must agree.
template <int M, class Program>
void same_on_gpu(const std::array<int, M>& mesh_shape, Program&& program, double tol = 0) {
  const auto host = run_on<M>(Device::host(), mesh_shape, program);
  const auto gpu = run_on<M>(Device::cuda(0), mesh_shape, program);
  if (tol == 0)
    CHECK(gpu == host);
  else
    check_close(gpu, host, tol);
}

std::vector<Shape<2>> shapes(int n) { return {{2 * n, 3 * n}, {2 * n + 1, 3 * n - 1}, {n - 1, 2}, {3, 0}}; }

using Set = std::tuple<Placements<Replicate>, Placements<Shard<0>>, Placements<Shard<1>>, Placements<Partial<Sum>>,
                       Placements<Partial<Max>>>;

template <class A, class B>
struct Redistribute1D;
template <class P, class Q>
struct Redistribute1D<Placements<P>, Placements<Q>> {
  static void run(int n, const Shape<2>& shape) {
    // The pairs the compiler accepts (Shard -> Partial and Partial<A> -> Partial<B> do not compile).
    if constexpr (!(is_shard_v<P> && is_partial_v<Q>) && !(is_partial_v<P> && is_partial_v<Q> && !std::is_same_v<P, Q>)) {
      const auto g = iota<float, 2>(shape);
      INFO(DTensor<float, 2, P>::placements_string(), " -> ", DTensor<float, 2, Q>::placements_string(), " on ", n,
           " ranks, shape ", to_string(shape));
      same_on_gpu<1>({n}, [&](const DeviceMesh<1>& mesh) { return redistribute<Q>(distribute<P>(g, mesh)); });
    }
  }
};

}  // namespace

TEST_CASE("device tensors: allocation, copies, errors") {
  const auto h = iota<double, 2>({5, 7});
  auto d = h.to(Device::cuda(0));
  CHECK(d.device() == Device::cuda(0));
  const Tensor<double, 2> d2 = d;  // device-to-device copy
  CHECK(d2.to(Device::host()) == h);
  const Tensor<float, 1> z(Shape<1>{1000}, Device::cuda(0));  // zero-filled on the device
  CHECK(z.to(Device::host()) == Tensor<float, 1>(Shape<1>{1000}));
  CHECK_THROWS_WITH_AS(d.fill(1.0), doctest::Contains("lives on cuda:0"), InvalidArgument);

  // A host block on a mesh whose communicator moves device buffers, and the reverse.
  RunOptions opt;
  opt.device = Device::cuda(0);
  CHECK_THROWS_WITH_AS(run_threads(
                           2,
                           [&](Comm& comm) {
                             DeviceMesh<1> mesh(comm);
                             DTensor<double, 2, Replicate> x(mesh, {{5, 7}, {}}, h);
                           },
                           opt),
                       doctest::Contains("local block lives on host"), RankFailure);
  run_threads(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    auto x = distribute<Replicate>(h, mesh);
    x.local() = d;  // a device block under a host mesh: operators refuse to mix them
    CHECK_THROWS_WITH_AS((void)add(x, distribute<Replicate>(h, mesh)), doctest::Contains("one operand lives on"),
                         InvalidArgument);
  });
}

TEST_CASE("redistribution on device buffers, 1-D meshes of 1, 2 and 4 ranks") {
  for (int n : {1, 2, 4})
    for (const auto& shape : shapes(n))
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        (
            [&]<std::size_t A>(std::integral_constant<std::size_t, A>) {
              (Redistribute1D<std::tuple_element_t<A, Set>, std::tuple_element_t<I, Set>>::run(n, shape), ...);
            }(std::integral_constant<std::size_t, I>{}),
            ...);
      }(std::make_index_sequence<std::tuple_size_v<Set>>{});
}

TEST_CASE("redistribution on device buffers, 2x2 mesh: all-to-all, nested shards, partials") {
  for (const auto& shape : shapes(2)) {
    const auto g = iota<double, 2>(shape);
    INFO("shape ", to_string(shape));
    same_on_gpu<2>({2, 2}, [&](const DeviceMesh<2>& mesh) {
      return redistribute<Shard<1>, Shard<0>>(distribute<Shard<0>, Shard<1>>(g, mesh));
    });
    same_on_gpu<2>({2, 2}, [&](const DeviceMesh<2>& mesh) {
      return redistribute<Shard<0>, Shard<0>>(distribute<Replicate, Shard<1>>(g, mesh));
    });
    same_on_gpu<2>({2, 2}, [&](const DeviceMesh<2>& mesh) {
      return redistribute<Shard<1>, Replicate>(distribute<Partial<Sum>, Partial<Avg>>(g, mesh));
    });
    same_on_gpu<2>({2, 2}, [&](const DeviceMesh<2>& mesh) {
      return redistribute<Replicate, Shard<0>>(redistribute<Partial<Sum>, Shard<0>>(distribute<Replicate, Shard<0>>(g, mesh)));
    });
  }
}

TEST_CASE("operators on device tensors agree with the host") {
  for (int n : {1, 2, 4}) {
    INFO(n, " ranks");
    const auto a = iota<float, 2>({2 * n + 1, 3 * n + 2});
    const auto b = iota<float, 2>({3 * n + 2, n + 3});
    const auto c = iota<float, 2>({2 * n + 1, 3 * n + 2});
    // Matrix products: every strategy of a 1-D mesh (local, row/col split, Partial sum).
    same_on_gpu<1>({n}, [&](const auto& m) { return matmul(distribute<Shard<0>>(a, m), distribute<Replicate>(b, m)); }, 1e-5);
    same_on_gpu<1>({n}, [&](const auto& m) { return matmul(distribute<Replicate>(a, m), distribute<Shard<1>>(b, m)); }, 1e-5);
    same_on_gpu<1>({n}, [&](const auto& m) { return matmul(distribute<Shard<1>>(a, m), distribute<Shard<0>>(b, m)); }, 1e-5);
    same_on_gpu<1>({n}, [&](const auto& m) {
      return matvec(distribute<Shard<0>>(a, m), distribute<Replicate>(Tensor<float, 1>(Shape<1>{b.extent(0)}, std::vector<float>(b.data(), b.data() + b.extent(0))), m));
    }, 1e-5);
    // Elementwise, bias, unary functions.
    same_on_gpu<1>({n}, [&](const auto& m) { return add(distribute<Shard<0>>(a, m), distribute<Shard<1>>(c, m)); });
    same_on_gpu<1>({n}, [&](const auto& m) { return div(mul(distribute<Shard<1>>(a, m), 3.0f), 7.0f); });
    same_on_gpu<1>({n}, [&](const auto& m) { return sigmoid(tanh(exp(mul(distribute<Shard<0>>(a, m), 0.1f)))); }, 1e-6);
    same_on_gpu<1>({n}, [&](const auto& m) { return relu(abs(neg(distribute<Partial<Sum>>(a, m)))); });
    same_on_gpu<1>({n}, [&](const auto& m) {
      const Tensor<float, 1> v(Shape<1>{a.extent(1)}, std::vector<float>(a.data(), a.data() + a.extent(1)));
      return add_bias<Along::Rows>(distribute<Shard<1>>(a, m), distribute<Replicate>(v, m));
    });
    // Reductions over sharded and unsharded dims, softmax along a sharded dim.
    same_on_gpu<1>({n}, [&](const auto& m) { return sum<0, Reduced::Value>(distribute<Shard<0>>(a, m)); }, 1e-5);
    same_on_gpu<1>({n}, [&](const auto& m) { return mean<1, Reduced::Value>(distribute<Shard<1>>(a, m)); }, 1e-5);
    same_on_gpu<1>({n}, [&](const auto& m) { return max<1, Reduced::Value>(distribute<Shard<0>>(a, m)); });
    same_on_gpu<1>({n}, [&](const auto& m) { return min<0, Reduced::Value>(distribute<Shard<1>>(a, m)); });
    same_on_gpu<1>({n}, [&](const auto& m) { return softmax<1>(distribute<Shard<1>>(a, m)); }, 1e-5);
    same_on_gpu<1>({n}, [&](const auto& m) { return log_softmax<0>(distribute<Shard<0>>(a, m)); }, 1e-5);
    // Shapes: slice, concat, transpose, reshape; fills.
    same_on_gpu<1>({n}, [&](const auto& m) { return slice<1>(distribute<Shard<1>>(a, m), 1, a.extent(1) - 1); });
    same_on_gpu<1>({n}, [&](const auto& m) { return concat<0>(distribute<Shard<1>>(a, m), distribute<Shard<1>>(c, m)); });
    same_on_gpu<1>({n}, [&](const auto& m) { return transpose(distribute<Shard<0>>(a, m)); });
    // Normal values: a GPU's log and cos are within 2 ulp (the rand test above).
    same_on_gpu<1>({n}, [&](const auto& m) { return randn<double, Shard<1>>(Shape<2>{5, 2 * n + 1}, m, 42); }, 1e-15);
    // Backwards on device buffers: max over a sharded dim (ties counted across ranks),
    // transpose, add_bias.
    same_on_gpu<1>({n}, [&](const auto& m) {
      const auto x = distribute<Shard<1>>(a, m);
      const auto y = max<1, Reduced::Value>(x);
      return max_backward<1>(x, y, full<float, Replicate>(Shape<1>{a.extent(0)}, m, 1.5f));
    });
    same_on_gpu<1>({n}, [&](const auto& m) {
      const auto x = distribute<Shard<0>>(a, m);
      return transpose_backward(x, transpose(x));
    });
    same_on_gpu<1>({n}, [&](const auto& m) {
      const Tensor<float, 1> v(Shape<1>{a.extent(1)}, std::vector<float>(a.data(), a.data() + a.extent(1)));
      const auto x = distribute<Shard<0>>(a, m);
      const auto dv = add_bias_backward<Along::Rows>(x, distribute<Replicate>(v, m), x).second;
      return redistribute<Replicate>(dv);
    }, 1e-6);
    same_on_gpu<1>({n}, [&](const auto& m) { return full<float, Shard<0>>(Shape<2>{2 * n + 1, 3}, m, 2.5f); });

    // 64-bit integer scalars travel exactly (a double would round them).
    const int64_t big = (int64_t{1} << 62) + 1;
    same_on_gpu<1>({n}, [&](const auto& m) {
      return add(full<int64_t, Shard<0>>(Shape<2>{2 * n + 1, 3}, m, big), int64_t{3});
    });
    same_on_gpu<1>({n}, [&](const auto& m) { return mul(distribute<Shard<1>>(Tensor<int64_t, 2>::full({3, n + 2}, big), m), int64_t{1}); });

    // Norms and dot products come back to the host on every rank.
    double host_norm = 0, gpu_norm = 0;
    for (Device dev : {Device::host(), Device::cuda(0)}) {
      RunOptions opt;
      opt.device = dev;
      run_threads(n, [&](Comm& comm) {
        DeviceMesh<1> mesh(comm);
        const Tensor<float, 1> u(Shape<1>{a.extent(1)}, std::vector<float>(a.data(), a.data() + a.extent(1)));
        const double v = norm2(distribute<Shard<0>>(a.to(Device::host()), mesh)) + norm_max(distribute<Shard<1>>(a, mesh)) +
                         value(dot(distribute<Shard<0>>(u, mesh), distribute<Shard<0>>(u, mesh)));
        if (comm.rank() == 0) (dev.is_host() ? host_norm : gpu_norm) = v;
      }, opt);
    }
    CHECK(gpu_norm == doctest::Approx(host_norm).epsilon(1e-5));
  }
}

TEST_CASE("2x2 mesh: batched matmul and a conjugate-gradient step on device tensors") {
  const auto a = iota<double, 3>({3, 5, 6});
  const auto b = iota<double, 3>({3, 6, 4});
  same_on_gpu<2>({2, 2}, [&](const auto& m) {
    return matmul(distribute<Shard<0>, Shard<1>>(a, m), distribute<Shard<0>, Replicate>(b, m));
  }, 1e-12);
  const auto s = iota<double, 2>({9, 9});
  same_on_gpu<2>({2, 2}, [&](const auto& m) {
    auto A = distribute<Shard<0>, Shard<1>>(s, m);
    auto x = matmul(A, transpose(A));
    return add(x, mul(x, 0.5));
  }, 1e-12);
}

TEST_CASE("rand and randn on a device mesh are generated there, as the host generates them") {
  // Uneven shards on a 1-D mesh of 3 and a 2x2 mesh with both tensor dims sharded; the
  // reference is the single-rank fill (factory.hpp), the device fill is the backend's
  // random_fill (no host staging). Uniform values are the same bits everywhere; a
  // normal value takes a log and a cosine, which a GPU computes within 1 and 2 ulp
  // (compute/counter_rng.hpp), so it may differ from the host's in the last bits.
  auto check = [](auto make, auto reference, uint64_t max_ulps) {
    for (Device dev : {Device::host(), Device::cuda(0)}) {
      RunOptions opt;
      opt.device = dev;
      run_threads(4, [&](Comm& comm) {
        const auto x = make(comm);
        CHECK(x.local().device() == dev);
        const auto full = x.full_tensor().to(Device::host());
        const auto want = reference();
        REQUIRE(full.shape() == want.shape());
        test::check_ulps(full, want, dev.is_host() ? 0 : max_ulps);
      }, opt);
    }
  };
  check([](Comm& comm) { return randn<double, Shard<0>>(Shape<2>{7, 5}, DeviceMesh<1>(comm), 11); },
        [] { return randn<double>(Shape<2>{7, 5}, 11); }, 4);
  check([](Comm& comm) { return rand<float, Shard<1>>(Shape<2>{3, 9}, DeviceMesh<1>(comm), 12); },
        [] { return rand<float>(Shape<2>{3, 9}, 12); }, 0);
  check([](Comm& comm) { return randn<float, Shard<0>, Shard<1>>(Shape<3>{5, 7, 2}, DeviceMesh<2>(comm, {2, 2}), 13); },
        [] { return randn<float>(Shape<3>{5, 7, 2}, 13); }, 1);
  check([](Comm& comm) { return rand<double, Replicate, Shard<2>>(Shape<3>{2, 3, 5}, DeviceMesh<2>(comm, {2, 2}), 14); },
        [] { return rand<double>(Shape<3>{2, 3, 5}, 14); }, 0);
}
