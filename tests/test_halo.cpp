// Halo exchange conformance: forward against a single-rank padded reference built
// from the global tensor, reverse as the adjoint of forward, on 1-D, 2-D and 3-D
// meshes, even, uneven, explicit and thinner-than-the-halo shards, every boundary
// rule, Star and Box, symmetric and asymmetric widths. Runs in-process and, through
// test_halo_mpi, under mpirun on 1-4 processes.
#include <dtensor/halo.hpp>

#include "support.hpp"

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace dtensor::test {
namespace {

// The global tensor padded by the spec's widths, filled the way the definition
// reads: the interior is the tensor; then, for d = 0, 1, ..., every cell whose
// coordinate d lies beyond the boundary takes the constant, or the cell its
// periodic wrap or reflection names along d (the other coordinates unchanged).
// Computed on one rank from the global tensor alone.
template <class T, int Rank>
struct PaddedReference {
  Shape<Rank> lo{}, shape{};  // cell i of the global tensor is at padded index i + lo
  std::vector<T> v;

  PaddedReference(const Tensor<T, Rank>& g, const HaloSpec<Rank>& spec) : lo(spec.widths.lo) {
    for (int d = 0; d < Rank; ++d) shape[d] = g.shape()[d] + spec.widths.lo[d] + spec.widths.hi[d];
    v.assign(numel(shape), T(0));
    for_each(shape, [&](const Shape<Rank>& p) {
      Shape<Rank> i{};
      for (int d = 0; d < Rank; ++d) {
        i[d] = p[d] - lo[d];
        if (i[d] < 0 || i[d] >= g.shape()[d]) return;
      }
      at(p) = g.data()[linear(g.shape(), i)];
    });
    for (int d = 0; d < Rank; ++d) {
      const int64_t n = g.shape()[d];
      const Boundary b = spec.boundary[d];
      for_each(shape, [&](const Shape<Rank>& p) {
        const int64_t i = p[d] - lo[d];
        if (i >= 0 && i < n) return;
        if (b.kind == Boundary::Kind::Constant || n == 0) {
          at(p) = static_cast<T>(b.kind == Boundary::Kind::Constant ? b.value : 0);
          return;
        }
        Shape<Rank> q = p;
        const int64_t j = b.kind == Boundary::Kind::Periodic ? ((i % n) + n) % n : (i < 0 ? -i : 2 * (n - 1) - i);
        q[d] = j + lo[d];
        at(p) = at(q);
      });
    }
  }
  T& at(const Shape<Rank>& p) { return v[linear(shape, p)]; }

  static int64_t linear(const Shape<Rank>& s, const Shape<Rank>& i) {
    int64_t k = 0;
    for (int d = 0; d < Rank; ++d) k = k * s[d] + i[d];
    return k;
  }
  template <class F>
  static void for_each(const Shape<Rank>& s, F&& f) {
    if (numel(s) == 0) return;
    Shape<Rank> i{};
    while (true) {
      f(i);
      int d = Rank;
      while (d-- > 0) {
        if (++i[d] < s[d]) break;
        i[d] = 0;
      }
      if (d < 0) return;
    }
  }
};

// Whether reflect can be served from each rank's own padded block (the library's
// rule, restated from its definition: the mirrored cell must lie in the block).
template <int Rank>
bool reflect_serviceable(const ShardLayout<Rank>& layout, const HaloSpec<Rank>& spec) {
  for (int d = 0; d < Rank; ++d) {
    if (spec.boundary[d].kind != Boundary::Kind::Reflect) continue;
    const int64_t lo = spec.widths.lo[d], hi = spec.widths.hi[d], n = layout.global[d];
    if (lo == 0 && hi == 0) continue;
    if (n <= std::max(lo, hi)) return false;
    const auto sizes = layout.blocks[d].empty() ? std::vector<int64_t>{n} : layout.blocks[d];
    int64_t off = 0;
    for (int64_t s : sizes) {
      const int64_t first = off - lo, last = off + s + hi;
      if (first < 0 && -first >= last) return false;
      if (last > n && 2 * (n - 1) - (last - 1) < first) return false;
      off += s;
    }
  }
  return true;
}

template <class T, int Rank>
Tensor<T, Rank> distinct_tensor(const Shape<Rank>& shape) {
  Tensor<T, Rank> t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<T>(i + 1);
  return t;
}

template <class T, int Rank, class... P, int M>
DTensor<T, Rank, P...> block_of(const Tensor<T, Rank>& g, const DeviceMesh<M>& mesh, const Splits<Rank>& splits) {
  using DT = DTensor<T, Rank, P...>;
  auto layout = ShardLayout<Rank>::make(g.shape(), DT::placement_state, mesh.shape(), splits);
  const auto off = layout.local_offset(DT::placement_state, mesh.shape(), mesh.coords());
  const auto ext = layout.local_shape(DT::placement_state, mesh.shape(), mesh.coords());
  return DT(mesh, layout, box_of(g, off, ext));
}

template <int Rank>
struct Case {
  Shape<Rank> global;
  HaloSpec<Rank> spec;
  Splits<Rank> splits{};
};

template <int Rank>
std::string describe(const Case<Rank>& c) {
  std::string s = "global " + to_string(c.global) + " lo " + to_string(c.spec.widths.lo) + " hi " +
                  to_string(c.spec.widths.hi) + (c.spec.stencil == Stencil::Star ? " star" : " box") + " boundaries";
  for (auto b : c.spec.boundary) s += " " + to_string(b);
  for (int d = 0; d < Rank; ++d)
    if (!c.splits[d].empty()) {
      s += " splits[" + std::to_string(d) + "]=";
      for (auto v : c.splits[d]) s += std::to_string(v) + ",";
    }
  return s;
}

// Forward against the reference (bit for bit), and <forward(x), y> == <x, reverse(y)>.
template <class T, int Rank, class... P, int M>
void check_case(const DeviceMesh<M>& mesh, const Case<Rank>& c) {
  using G = Ghosted<T, Rank, P...>;
  INFO(names<P...>(), " on ", mesh.to_string(), " ", describe(c), " rank ", mesh.rank());
  const auto g = distinct_tensor<T, Rank>(c.global);
  const auto x = block_of<T, Rank, P...>(g, mesh, c.splits);
  if (!reflect_serviceable(x.layout(), c.spec)) {
    CHECK_THROWS_WITH_AS(G::from(x, c.spec), doctest::Contains("reflect boundary"), InvalidArgument);
    return;
  }
  auto u = G::from(x, c.spec);
  u.exchange();
  PaddedReference<T, Rank> ref(g, c.spec);
  const auto off = u.local_offset();
  const auto pad = u.padded();
  bool ok = true;
  PaddedReference<T, Rank>::for_each(u.padded_shape(), [&](const Shape<Rank>& p) {
    int ghost_dims = 0;
    Shape<Rank> q{};
    for (int d = 0; d < Rank; ++d) {
      ghost_dims += p[d] < u.lo()[d] || p[d] >= u.lo()[d] + u.local_shape()[d];
      q[d] = off[d] + p[d];  // global padded index: (off - lo + p) + lo
    }
    if (c.spec.stencil == Stencil::Star && ghost_dims > 1) return;  // corners: not part of a star halo
    if (pad[p] != ref.at(q)) {
      if (ok) FAIL_CHECK("padded cell ", to_string(p), " (global padded ", to_string(q), ") holds ", pad[p],
                         ", expected ", ref.at(q));
      ok = false;
    }
  });
  CHECK(ok);

  bool linear = true;  // a non-zero constant makes forward affine: no adjoint to check
  for (auto b : c.spec.boundary) linear = linear && !(b.kind == Boundary::Kind::Constant && b.value != 0);
  if (!linear) return;
  // Adjoint, exactly (small integers): y on the padded block, x on the interior.
  auto fx = G::from(x, c.spec);
  fx.exchange();
  auto y = G::zeros_like(fx);
  const auto yp = y.padded();
  const int64_t seed = 31 * mesh.rank() + 7;
  PaddedReference<T, Rank>::for_each(y.padded_shape(), [&](const Shape<Rank>& p) {
    int64_t h = seed;
    for (int d = 0; d < Rank; ++d) h = h * 131 + p[d];
    yp[p] = static_cast<T>(h % 7 - 3);
  });
  std::vector<double> dots(2, 0.0);
  PaddedReference<T, Rank>::for_each(fx.padded_shape(), [&](const Shape<Rank>& p) {
    dots[0] += static_cast<double>(fx.padded()[p]) * static_cast<double>(yp[p]);
  });
  y.reverse();
  const auto xi = x.local();
  const auto ri = y.interior();
  PaddedReference<T, Rank>::for_each(x.local().shape(), [&](const Shape<Rank>& i) {
    dots[1] += static_cast<double>(xi.data()[PaddedReference<T, Rank>::linear(xi.shape(), i)]) *
               static_cast<double>(ri[i]);
  });
  // After the reverse, the ghosts are zero.
  bool ghosts_zero = true;
  PaddedReference<T, Rank>::for_each(y.padded_shape(), [&](const Shape<Rank>& p) {
    for (int d = 0; d < Rank; ++d)
      if (p[d] < y.lo()[d] || p[d] >= y.lo()[d] + y.local_shape()[d]) ghosts_zero = ghosts_zero && yp[p] == T(0);
  });
  CHECK(ghosts_zero);
  all_reduce<double>(mesh.comm(), dots, ReduceOp::Sum);
  CHECK(dots[0] == dots[1]);
}

const std::vector<Boundary> kBoundaries = {Boundary::zero(), Boundary::constant(-5), Boundary::periodic(),
                                           Boundary::reflect()};

// Widths: symmetric 1, 2, 3 and asymmetric.
const std::vector<std::pair<int64_t, int64_t>> kWidths = {{1, 1}, {2, 2}, {3, 3}, {2, 1}, {0, 2}};

}  // namespace

TEST_CASE("halo: 1-D tensor sharded over a 1-D mesh, every boundary, width and shape") {
  for (int n : {1, 2, 3, 4}) {
    spmd(n, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm);
      // Even, uneven, thinner than the halo (chunk rule leaves small and empty
      // blocks), explicit splits with an empty block in the middle.
      std::vector<Case<1>> cases;
      for (int64_t len : {int64_t(4 * n), int64_t(4 * n + 3), int64_t(n + 1), int64_t(1)})
        for (auto [lo, hi] : kWidths)
          for (auto b : kBoundaries) cases.push_back({{len}, {{{lo}, {hi}}, {b}, Stencil::Star}, {}});
      if (n == 3)
        for (auto b : kBoundaries) cases.push_back({{9}, {{{2}, {3}}, {b}, Stencil::Box}, {{{6, 0, 3}}}});
      for (const auto& c : cases) check_case<double, 1, Shard<0>>(mesh, c);
    });
  }
}

TEST_CASE("halo: 2-D grid, one dim sharded over a 1-D mesh, the other with boundary ghosts only") {
  for (int n : {2, 3, 4}) {
    spmd(n, [&](Comm& comm) {
      DeviceMesh<1> mesh(comm);
      for (Shape<2> shape : {Shape<2>{3 * n, 5}, Shape<2>{3 * n + 2, 4}, Shape<2>{n - 1, 3}})
        for (auto st : {Stencil::Star, Stencil::Box})
          for (auto b0 : kBoundaries)
            for (auto b1 : {Boundary::zero(), Boundary::periodic(), Boundary::reflect()}) {
              HaloSpec<2> spec{{{2, 1}, {1, 2}}, {b0, b1}, st};
              check_case<double, 2, Shard<0>>(mesh, {shape, spec, {}});
            }
    });
  }
}

TEST_CASE("halo: 2-D grid over 2-D meshes (2x2, 2x3, 3x1), star and box, uneven and thin shards") {
  for (std::array<int, 2> ms : {std::array<int, 2>{2, 2}, std::array<int, 2>{2, 3}, std::array<int, 2>{1, 3}}) {
    spmd(ms[0] * ms[1], [&](Comm& comm) {
      DeviceMesh<2> mesh(comm, ms);
      for (Shape<2> shape : {Shape<2>{4 * ms[0], 3 * ms[1]}, Shape<2>{7, 8}, Shape<2>{3, 2}})
        for (auto st : {Stencil::Star, Stencil::Box})
          for (auto b0 : kBoundaries)
            for (auto b1 : kBoundaries) {
              if (b0.kind == Boundary::Kind::Constant && b1.kind == Boundary::Kind::Constant && b0.value != b1.value)
                continue;  // covered by the constant/zero pairs below
              for (auto [lo, hi] : {std::pair<int64_t, int64_t>{1, 1}, std::pair<int64_t, int64_t>{2, 1}}) {
                HaloSpec<2> spec{{{lo, hi}, {hi, lo}}, {b0, b1}, st};
                check_case<double, 2, Shard<0>, Shard<1>>(mesh, {shape, spec, {}});
              }
            }
      // Explicit splits on both dims, one block empty, width 3.
      if (ms == std::array<int, 2>{2, 3})
        for (auto st : {Stencil::Star, Stencil::Box}) {
          HaloSpec<2> spec{HaloWidths<2>::uniform(3), {Boundary::periodic(), Boundary::zero()}, st};
          check_case<double, 2, Shard<0>, Shard<1>>(mesh, {{9, 7}, spec, {{{2, 7}, {3, 0, 4}}}});
        }
    });
  }
}

TEST_CASE("halo: batch sharded on one mesh dim, space on the other; one dim sharded over two mesh dims") {
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    for (auto st : {Stencil::Star, Stencil::Box})
      for (auto b : kBoundaries) {
        // [B, H, W]: B over mesh dim 0 (no ghosts), H over mesh dim 1, W whole.
        HaloSpec<3> spec{{{0, 2, 1}, {0, 1, 1}}, {Boundary::zero(), b, Boundary::periodic()}, st};
        check_case<double, 3, Shard<0>, Shard<1>>(mesh, {{3, 9, 4}, spec, {}});
        // H sharded over both mesh dims (a chunk of a chunk): neighbours differ in both coordinates.
        HaloSpec<2> spec2{{{2, 1}, {1, 1}}, {b, Boundary::reflect()}, st};
        check_case<double, 2, Shard<0>, Shard<0>>(mesh, {{11, 5}, spec2, {}});
      }
  });
}

TEST_CASE("halo: 3-D volumes over 1-D, 2-D and 3-D meshes") {
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    for (auto st : {Stencil::Star, Stencil::Box})
      for (auto b : kBoundaries) {
        HaloSpec<3> spec{HaloWidths<3>::uniform(1), {b, Boundary::zero(), Boundary::periodic()}, st};
        check_case<double, 3, Shard<2>>(mesh, {{3, 4, 5}, spec, {}});
      }
  });
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    for (auto st : {Stencil::Star, Stencil::Box})
      for (auto b : kBoundaries) {
        HaloSpec<3> spec{{{1, 2, 1}, {2, 1, 1}}, {b, Boundary::periodic(), b}, st};
        check_case<double, 3, Shard<0>, Shard<1>>(mesh, {{5, 4, 3}, spec, {}});
      }
    DeviceMesh<3> cube(comm, {1, 2, 2});
    for (auto st : {Stencil::Star, Stencil::Box})
      for (auto b : kBoundaries) {
        HaloSpec<3> spec{HaloWidths<3>::uniform(2), {b, b, Boundary::periodic()}, st};
        check_case<double, 3, Shard<0>, Shard<1>, Shard<2>>(cube, {{4, 5, 3}, spec, {}});
      }
  });
}

TEST_CASE("halo: float and integer elements") {
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    for (auto b : kBoundaries) {
      HaloSpec<2> spec{{{1, 0}, {2, 0}}, {b, Boundary::zero()}, Stencil::Box};
      check_case<float, 2, Shard<0>>(mesh, {{8, 3}, spec, {}});
      check_case<int32_t, 2, Shard<0>>(mesh, {{7, 3}, spec, {}});
      check_case<int64_t, 2, Shard<0>>(mesh, {{5, 2}, spec, {}});
    }
  });
}

TEST_CASE("halo: begin/end overlap a computation on the interior; repeated exchanges reuse the ghosts") {
  spmd(3, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    const Shape<2> shape{10, 6};
    auto g = distinct_tensor<double, 2>(shape);
    auto x = block_of<double, 2, Shard<0>>(g, mesh, {});
    HaloSpec<2> spec{HaloWidths<2>::uniform(1), {Boundary::zero(), Boundary::zero()}, Stencil::Star};
    auto u = Ghosted<double, 2, Shard<0>>::from(x, spec);
    // y = 5-point sum over u, computed with for_each_overlapped, vs the reference.
    Tensor<double, 2> y(u.local_shape());
    for (int rep = 0; rep < 3; ++rep) {
      for_each_overlapped(u, [&](const IndexBox<2>& b) {
        const auto p = u.padded();
        for (int64_t i = b.begin[0]; i < b.begin[0] + b.size[0]; ++i)
          for (int64_t j = b.begin[1]; j < b.begin[1] + b.size[1]; ++j)
            y(i, j) = p(i + 1, j + 1) + p(i, j + 1) + p(i + 2, j + 1) + p(i + 1, j) + p(i + 1, j + 2);
      });
      PaddedReference<double, 2> ref(g, spec);
      const auto off = u.local_offset();
      for (int64_t i = 0; i < u.local_shape()[0]; ++i)
        for (int64_t j = 0; j < u.local_shape()[1]; ++j) {
          const Shape<2> q{off[0] + i + 1, j + 1};
          const double want = ref.at(q) + ref.at({q[0] - 1, q[1]}) + ref.at({q[0] + 1, q[1]}) +
                              ref.at({q[0], q[1] - 1}) + ref.at({q[0], q[1] + 1});
          REQUIRE(y(i, j) == want);
        }
    }
    // The inner box and the strips tile the interior exactly once.
    const auto in = inner_box<2>({5, 4}, HaloWidths<2>{{2, 1}, {1, 1}});
    int64_t covered = in.numel();
    for (const auto& b : boundary_boxes<2>({5, 4}, HaloWidths<2>{{2, 1}, {1, 1}})) covered += b.numel();
    CHECK(covered == 20);
    CHECK(in == IndexBox<2>{{2, 1}, {2, 2}});
  });
}

TEST_CASE("halo: the reverse adds a cell's ghosts in a fixed order, whatever order they arrive in") {
  // Global cell (1, 1) of a 4x4 grid on a 2x2 mesh is a ghost of the three other
  // ranks (box stencil). Their gradients 1e16, 1 and -1e16 give 0 or 1 depending on
  // the order of the additions: the reverse must give the same bits every time,
  // with the ranks arriving in varying orders.
  spmd(4, [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, {2, 2});
    const auto g = distinct_tensor<double, 2>({4, 4});
    const auto x = block_of<double, 2, Shard<0>, Shard<1>>(g, mesh, {});
    HaloSpec<2> spec{HaloWidths<2>::uniform(1), {Boundary::zero(), Boundary::zero()}, Stencil::Box};
    const double term[4] = {0.0, 1e16, 1.0, -1e16};
    std::vector<double> seen;
    for (int rep = 0; rep < 24; ++rep) {
      auto y = Ghosted<double, 2, Shard<0>, Shard<1>>::zeros_like(Ghosted<double, 2, Shard<0>, Shard<1>>::from(x, spec));
      const auto off = y.local_offset();
      const auto yp = y.padded();
      PaddedReference<double, 2>::for_each(y.padded_shape(), [&](const Shape<2>& p) {
        const bool interior = p[0] >= 1 && p[0] < 1 + y.local_shape()[0] && p[1] >= 1 && p[1] < 1 + y.local_shape()[1];
        if (!interior && off[0] + p[0] - 1 == 1 && off[1] + p[1] - 1 == 1) yp[p] = term[mesh.rank()];
      });
      // a different rank late each time
      if (mesh.rank() == rep % 4) std::this_thread::sleep_for(std::chrono::milliseconds(2 + rep % 3));
      y.reverse();
      if (mesh.rank() == 0) seen.push_back(y.interior()[{1, 1}]);
    }
    for (double v : seen) CHECK(v == seen.front());
  });
}

TEST_CASE("halo: misuse is a clear error") {
  spmd(2, [&](Comm& comm) {
    DeviceMesh<1> mesh(comm);
    auto x = block_of<double, 1, Shard<0>>(distinct_tensor<double, 1>({8}), mesh, {});
    HaloSpec<1> spec{HaloWidths<1>::uniform(1), {Boundary::zero()}, Stencil::Star};
    auto u = Ghosted<double, 1, Shard<0>>::from(x, spec);
    CHECK_THROWS_WITH_AS(u.exchange_end(), doctest::Contains("no exchange in flight"), InvalidArgument);
    u.exchange_begin();
    CHECK_THROWS_WITH_AS(u.exchange_begin(), doctest::Contains("already in flight"), InvalidArgument);
    CHECK_THROWS_WITH_AS(u.reverse_end(), doctest::Contains("a forward one"), InvalidArgument);
    u.exchange_end();
    HaloSpec<1> bad{{{-1}, {1}}, {Boundary::zero()}, Stencil::Star};
    using G = Ghosted<double, 1, Shard<0>>;
    CHECK_THROWS_WITH_AS(G::from(x, bad),
                         doctest::Contains("negative ghost width"), InvalidArgument);
  });
}

// A failure on one rank reaches every rank within the timeout, never a hang. (The
// in-process runtime; under MPI a failing rank aborts the job: tests/CMakeLists.txt.)
TEST_CASE("halo faults: a rank that throws between begin and end, never posts, or posts late") {
  if (skip_under_mpi("fault test: a failing rank aborts an MPI job")) return;
  using namespace std::chrono_literals;
  RunOptions opt;
  opt.timeout = 500ms;
  const HaloSpec<1> spec{HaloWidths<1>::uniform(1), {Boundary::periodic()}, Stencil::Star};
  for (const char* mode : {"throw", "skip", "late"}) {
    INFO(std::string(mode));
    std::vector<std::string> errors(3);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(run_threads(
                        3,
                        [&](Comm& comm) {
                          DeviceMesh<1> mesh(comm);
                          auto x = block_of<double, 1, Shard<0>>(distinct_tensor<double, 1>({9}), mesh, {});
                          auto u = Ghosted<double, 1, Shard<0>>::from(x, spec);
                          const bool odd = comm.rank() == 1;
                          try {
                            if (odd && std::string(mode) == "skip") return;
                            if (odd && std::string(mode) == "late") std::this_thread::sleep_for(1500ms);
                            u.exchange_begin();
                            if (odd && std::string(mode) == "throw") throw std::runtime_error("rank 1 fails on purpose");
                            u.exchange_end();
                            // A rank whose messages all arrived before the failure
                            // completes its exchange; its next call reports the failure.
                            comm.barrier();
                          } catch (const std::exception& e) {
                            errors[comm.rank()] = e.what();
                            throw;
                          }
                        },
                        opt),
                    RankFailure);
    CHECK(std::chrono::steady_clock::now() - t0 < 10s);
    for (int r : {0, 2}) {
      INFO("rank ", r, ": ", errors[r]);
      CHECK(!errors[r].empty());
    }
    if (std::string(mode) == "skip") CHECK(errors[0].find("returned from its function") != std::string::npos);
    if (std::string(mode) == "late") CHECK((errors[0] + errors[2]).find("timed out") != std::string::npos);
  }
}

}  // namespace dtensor::test
