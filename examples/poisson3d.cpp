// Poisson's equation on the unit cube, solved matrix-free by conjugate gradients on
// a grid sharded over a 3-D mesh of ranks, with a grid-refinement study.
//
//   -div(k grad u) = f  in (0,1)³,   u = 0 on the boundary,
//
// with the manufactured solution u = g(x) g(y) g(z), g(t) = t (1 - t) e^t (f computed
// from it; unlike sin(πx) sin(πy) sin(πz), which is an eigenvector of the discrete
// Laplacians and would let CG finish in one iteration), on n x n x n interior nodes
// x_i = (i + 1) h, h = 1 / (n + 1). Three discretizations:
//   7      the 7-point Laplacian (k = 1)
//   27     the compact 27-point Laplacian (k = 1)
//   var    the variable-coefficient 7-point -div(k grad u), k = 1 + x² + y/2
// For each, the grid is refined (n -> 2n + 1 halves h) and the table shows the max
// error against u, the error ratio (about 4 for a second-order method), the observed
// order, the CG iterations and the time per iteration. The program exits with 1 if an
// observed order is below 1.8.
//
// Usage (PETSc-style options, all optional):
//   build/examples/poisson3d [-ranks 4] [-n 15] [-levels 3] [-stencil 7|27|var|all]
//                            [-variant cg|classic] [-overlap 1|0] [-rtol 1e-10]
//   mpirun -np 4 build/examples/poisson3d_mpi [options]     (any process count works)
//
//   -ranks    in-process ranks (threads) when not started by mpirun; default 4
//   -n        interior nodes per dim on the coarsest grid; default 15
//   -levels   number of grids (15, 31, 63 by default)
//   -stencil  which discretization(s); default all
//   -variant  cg: Chronopoulos–Gear CG (one all-reduce per iteration, the default);
//             classic: Hestenes–Stiefel CG (two)
//   -overlap  1: overlap the halo exchange with the interior rows (default); 0: not
//   -rtol     the solver stops at ||r|| <= rtol ||b||; default 1e-10
//   -solver   cg (default); mg: multigrid cycles (solvers/multigrid.hpp); pcg-mg: CG
//             preconditioned by one multigrid V-cycle
//   -mg_cycle v|w, -mg_smoother chebyshev|jacobi|gs, -mg_steps k (smoothing steps before
//             and after the coarse correction), -mg_lower (Chebyshev's interval starts
//             at that fraction of λmax), -mg_coarse (nodes of the coarsest grid, at most),
//             -mg_galerkin 1 (coarse operators R A P on every level, not only where needed)
//   -out      out.h5: writes the solution on the finest grid of each stencil (datasets
//             u_7, u_27, u_var), in parallel, and out.xmf beside it, which ParaView and
//             VisIt open (needs parallel HDF5; scripts/plot_field.py draws a slice as a PNG)
//
// The P ranks form a near-cubic A x B x C mesh (4 -> 2x2x1, 8 -> 2x2x2, 6 -> 3x2x1);
// the grid is sharded Shard<0> x Shard<1> x Shard<2>, unevenly where n is not a
// multiple of the mesh extents. Dims 0, 1, 2 are z, y, x (u(i, j, k) at z_i, y_j, x_k),
// the order of a C array, of the HDF5 dataset and of XDMF's extents.
// Examples:
//   build/examples/poisson3d                                 default study, 4 threads, a few s on 2 cores
//   build/examples/poisson3d -ranks 1 -n 127 -levels 1       one big solve on one rank
//   mpirun -np 3 build/examples/poisson3d_mpi -stencil 27    3 processes on a 3x1x1 mesh
//   build/examples/poisson3d -solver mg -levels 4            multigrid V-cycles up to 127^3
//   mpirun -np 4 build/examples/poisson3d_mpi -stencil var -out u.h5   u.h5 + u.xmf for ParaView
#ifdef DTENSOR_WITH_MPI
#include <dtensor/mpi.hpp>
#else
#include <dtensor/dtensor.hpp>
#endif
#if defined(DTENSOR_EXAMPLE_ON_GPU)
#include <dtensor/cuda.hpp>
#elif defined(DTENSOR_EXAMPLE_ON_EMULATED_GPU)
// A build on the tests' emulated device (as tests/CMakeLists.txt makes poisson2d_emulated
// for CI) runs -device cuda without a GPU.
#include "emulated_device.hpp"
#endif
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dtensor/solvers.hpp>

#include "poisson_options.hpp"
#include <functional>
#include <string>
#include <vector>

using namespace dtensor;

namespace {

using poisson_example::Args;

// A near-cubic factorization a x b x c = p, a >= b >= c: the prime factors of p,
// largest first, each multiplied into the smallest extent so far.
std::array<int, 3> mesh_shape(int p) {
  std::vector<int> f;
  for (int q = 2; q * q <= p; ++q)
    while (p % q == 0) f.push_back(q), p /= q;
  if (p > 1) f.push_back(p);
  std::sort(f.rbegin(), f.rend());
  std::array<int, 3> m{1, 1, 1};
  for (int q : f) *std::min_element(m.begin(), m.end()) *= q;
  std::sort(m.rbegin(), m.rend());
  return m;
}

using P0 = Shard<0>;
using P1 = Shard<1>;
using P2 = Shard<2>;
using Vec = DTensor<double, 3, P0, P1, P2>;

// g(t) = t (1 - t) e^t, zero at 0 and 1; g' = (1 - t - t²) e^t; g'' = -t (3 + t) e^t.
double g(double t) { return t * (1 - t) * std::exp(t); }
double dg(double t) { return (1 - t - t * t) * std::exp(t); }
double d2g(double t) { return -t * (3 + t) * std::exp(t); }
double exact(double x, double y, double z) { return g(x) * g(y) * g(z); }
double kcoef(double x, double y, double) { return 1 + x * x + 0.5 * y; }
// f = -div(k grad u) = -(k_x u_x + k_y u_y) - k Δu.
double rhs(double x, double y, double z, bool variable) {
  const double lap = d2g(x) * g(y) * g(z) + g(x) * d2g(y) * g(z) + g(x) * g(y) * d2g(z);
  if (!variable) return -lap;
  return -(2 * x * dg(x) * g(y) * g(z) + 0.5 * g(x) * dg(y) * g(z)) - kcoef(x, y, z) * lap;
}

struct Level {
  int64_t n;
  double error;
  SolveResult res;
};

// One solve on an n x n x n grid: the max error against the exact solution; `keep`
// (where set) receives the solution.
Level solve(const std::string& stencil, int64_t n, const DeviceMesh<3>& mesh, const Args& args,
            const std::function<void(const Vec&)>& keep = {}) {
  const double h = 1.0 / (n + 1);
  const bool variable = stencil == "var";
  // This rank's block of f, generated in place (no global array).
  Vec b = zeros<double, P0, P1, P2>(Shape<3>{n, n, n}, mesh);
  Vec x = zeros<double, P0, P1, P2>(Shape<3>{n, n, n}, mesh);
  const auto off = b.local_offset(), ls = b.local_shape();
  auto coord = [&](int d, int64_t i) { return (off[d] + i + 1) * h; };
  Tensor<double, 3> f(ls);  // filled on the host, then moved where the mesh keeps its blocks
  for (int64_t i = 0; i < ls[0]; ++i)
    for (int64_t j = 0; j < ls[1]; ++j)
      for (int64_t k = 0; k < ls[2]; ++k) f(i, j, k) = rhs(coord(2, k), coord(1, j), coord(0, i), variable);
  b.local() = f.to(mesh.device());

  SolveResult res;
  if (stencil == "7") {
    const Laplacian7 A{h};
    res = poisson_example::solve_with(A, b, x, args);
  } else if (stencil == "27") {
    const Laplacian27 A{h};
    res = poisson_example::solve_with(A, b, x, args);
  } else {
    // k at every node of the block and at the boundary nodes around it.
    const VarCoeffLaplacian7<double, P0, P1, P2> A(
        sample_coefficient<double, P0, P1, P2>(
            mesh, Shape<3>{n, n, n},
            [&](std::array<int64_t, 3> g) { return kcoef((g[2] + 1) * h, (g[1] + 1) * h, (g[0] + 1) * h); }),
        h);
    res = poisson_example::solve_with(A, b, x, args);
  }
  double err = 0;
  const Tensor<double, 3> xh = x.local().to(Device::host());
  for (int64_t i = 0; i < ls[0]; ++i)
    for (int64_t j = 0; j < ls[1]; ++j)
      for (int64_t k = 0; k < ls[2]; ++k)
        err = std::max(err, std::abs(xh(i, j, k) - exact(coord(2, k), coord(1, j), coord(0, i))));
  std::vector<double> e{err};
  all_reduce_values<double>(mesh.comm(), e.data(), 1, ReduceOp::Max);
  if (keep) keep(x);
  return {n, e[0], res};
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = poisson_example::parse(argc, argv, "poisson3d", Args{.n = 15, .levels = 3});
  std::vector<std::string> stencils = {"7", "27", "var"};
  if (args.stencil != "all") stencils = {args.stencil};
  for (const auto& s : stencils)
    if (s != "7" && s != "27" && s != "var") {
      std::fprintf(stderr, "poisson3d: -stencil must be 7, 27, var or all, not %s\n", s.c_str());
      return 2;
    }
  int failed = 0;

  auto program = [&](Comm& comm) {
    DeviceMesh<3> mesh(comm, mesh_shape(comm.size()));
    const bool root = comm.rank() == 0;
#ifdef DTENSOR_HAVE_HDF5
    poisson_example::SolutionOutput<3, Vec> output(args);
#endif
    for (const auto& s : stencils) {
      if (root)
        std::printf("\n%s, %s (%s, %s), %s mesh, %s runtime\n",
                    s == "7"    ? "7-point Laplacian"
                    : s == "27" ? "27-point Laplacian"
                                : "-div(k grad u), 7-point",
                    poisson_example::solver_name(args),
                    args.solver == "cg" ? to_string(args.variant) : to_string(args.mg.smoother), to_string(args.mode),
                    mesh.to_string().c_str(), comm.backend().c_str());
      if (root)
        std::printf("%8s %11s %11s %7s %6s %7s %10s %9s\n", "n", "h", "max error", "ratio", "order", "iters", "us/iter",
                    "seconds");
      std::vector<Level> levels;
      int64_t n = args.n;
      for (int l = 0; l < args.levels; ++l, n = 2 * n + 1) {
        std::function<void(const Vec&)> keep;
#ifdef DTENSOR_HAVE_HDF5
        keep = output.keep(s, l + 1 == args.levels, n);
#endif
        levels.push_back(solve(s, n, mesh, args, keep));
        const Level& L = levels.back();
        double ratio = 0, order = 0;
        if (l > 0) {
          ratio = levels[l - 1].error / L.error;
          order = std::log2(ratio);
          if (root && !(order >= 1.8)) failed = 1;
        }
        if (root && !L.res.converged) failed = 1;
        if (root) {
          if (l == 0)
            std::printf("%8lld %11.3e %11.3e %7s %6s %7d %10.2f %9.3f\n", static_cast<long long>(n), 1.0 / (n + 1),
                        L.error, "-", "-", L.res.iterations, L.res.seconds_per_iteration() * 1e6, L.res.seconds);
          else
            std::printf("%8lld %11.3e %11.3e %7.2f %6.2f %7d %10.2f %9.3f\n", static_cast<long long>(n), 1.0 / (n + 1),
                        L.error, ratio, order, L.res.iterations, L.res.seconds_per_iteration() * 1e6, L.res.seconds);
        }
      }
    }
#ifdef DTENSOR_HAVE_HDF5
    output.finish(comm, root);
#endif
    if (root)
      std::printf("\n%s\n", failed ? "FAILED: an observed order is below 1.8 (or the solver did not converge)"
                                   : "second-order convergence observed");
  };
#ifdef DTENSOR_WITH_MPI
  run(argc, argv, args.ranks, program);
  return failed;
#else
  return poisson_example::run_in_process(args, "poisson3d", program, failed);
#endif
}
