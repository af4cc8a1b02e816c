// Poisson's equation on the unit square, solved matrix-free by conjugate gradients on
// a grid sharded over a 2-D mesh of ranks, with a grid-refinement study.
//
//   -div(k grad u) = f  in (0,1)²,   u = 0 on the boundary,
//
// with the manufactured solution u = g(x) g(y), g(t) = t (1 - t) e^t (f computed from
// it; unlike sin(πx) sin(πy), which is an eigenvector of the discrete Laplacians and
// would let CG finish in one iteration), on n x n interior nodes x_i = (i + 1) h,
// h = 1 / (n + 1). Three discretizations:
//   5      the 5-point Laplacian (k = 1)
//   9      the compact 9-point Laplacian (k = 1)
//   var    the variable-coefficient 5-point -div(k grad u), k = 1 + x² + y/2
// For each, the grid is refined (n -> 2n + 1 halves h) and the table shows the max
// error against u, the error ratio (about 4 for a second-order method), the observed
// order, the CG iterations and the time per iteration. The program exits with 1 if an
// observed order is below 1.8.
//
// Usage (PETSc-style options, all optional):
//   build/examples/poisson2d [-ranks 4] [-n 31] [-levels 4] [-stencil 5|9|var|all]
//                            [-variant cg|classic] [-overlap 1|0] [-rtol 1e-10]
//   mpirun -np 4 build/examples/poisson2d_mpi [options]     (any process count works)
//
//   -ranks    in-process ranks (threads) when not started by mpirun; default 4
//   -n        interior nodes per dim on the coarsest grid; default 31
//   -levels   number of grids (31, 63, 127, 255 by default)
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
//             u_5, u_9, u_var), in parallel, and out.xmf beside it, which ParaView and
//             VisIt open (needs parallel HDF5; scripts/plot_field.py draws it as a PNG)
//
// The P ranks form a near-square R x C mesh (4 -> 2x2, 6 -> 3x2, 3 -> 3x1); the grid
// is sharded Shard<0> x Shard<1>, unevenly where n is not a multiple of R or C. Dim 0
// is y and dim 1 is x (u(i, j) at y_i, x_j), the order of a C array, of the HDF5
// dataset and of XDMF's extents, so that ParaView shows x across.
// Examples:
//   build/examples/poisson2d                                 default study, 4 threads, ~2 s on 2 cores
//   build/examples/poisson2d -ranks 1 -n 1023 -levels 1      one big solve on one rank
//   mpirun -np 3 build/examples/poisson2d_mpi -stencil var   3 processes on a 3x1 mesh
//   build/examples/poisson2d -solver pcg-mg -levels 6         multigrid-preconditioned CG up to 2047 x 2047
//   mpirun -np 4 build/examples/poisson2d_mpi -stencil var -levels 3 -out u.h5   u.h5 + u.xmf for ParaView
#ifdef DTENSOR_WITH_MPI
#include <dtensor/mpi.hpp>
#else
#include <dtensor/dtensor.hpp>
#endif
#if defined(DTENSOR_EXAMPLE_ON_GPU)
#include <dtensor/cuda.hpp>
#elif defined(DTENSOR_EXAMPLE_ON_EMULATED_GPU)
// CI has no GPU: this build (tests/CMakeLists.txt, poisson2d_emulated) runs -device cuda on
// the tests' emulated device instead of the CUDA backend.
#include "emulated_device.hpp"
#endif
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

// A near-square factorization rows x cols = p, rows >= cols.
std::array<int, 2> mesh_shape(int p) {
  int c = static_cast<int>(std::sqrt(double(p)));
  while (p % c) --c;
  return {p / c, c};
}

using P0 = Shard<0>;
using P1 = Shard<1>;
using Vec = DTensor<double, 2, P0, P1>;

// g(t) = t (1 - t) e^t, zero at 0 and 1; g' = (1 - t - t²) e^t; g'' = -t (3 + t) e^t.
double g(double t) { return t * (1 - t) * std::exp(t); }
double dg(double t) { return (1 - t - t * t) * std::exp(t); }
double d2g(double t) { return -t * (3 + t) * std::exp(t); }
double exact(double x, double y) { return g(x) * g(y); }
double kcoef(double x, double y) { return 1 + x * x + 0.5 * y; }
// f = -div(k grad u) = -(k_x u_x + k_y u_y) - k Δu.
double rhs(double x, double y, bool variable) {
  const double lap = d2g(x) * g(y) + g(x) * d2g(y);
  if (!variable) return -lap;
  return -(2 * x * dg(x) * g(y) + 0.5 * g(x) * dg(y)) - kcoef(x, y) * lap;
}

struct Level {
  int64_t n;
  double error;
  SolveResult res;
};

// One solve on an n x n grid: the max error against the exact solution; `keep` (where
// set) receives the solution.
Level solve(const std::string& stencil, int64_t n, const DeviceMesh<2>& mesh, const Args& args,
            const std::function<void(const Vec&)>& keep = {}) {
  const double h = 1.0 / (n + 1);
  const bool variable = stencil == "var";
  // This rank's block of f, generated in place (no global array).
  Vec b = zeros<double, P0, P1>(Shape<2>{n, n}, mesh);
  Vec x = zeros<double, P0, P1>(Shape<2>{n, n}, mesh);
  const auto off = b.local_offset(), ls = b.local_shape();
  Tensor<double, 2> f(ls);  // filled on the host, then moved where the mesh keeps its blocks
  for (int64_t i = 0; i < ls[0]; ++i)
    for (int64_t j = 0; j < ls[1]; ++j) f(i, j) = rhs((off[1] + j + 1) * h, (off[0] + i + 1) * h, variable);
  b.local() = f.to(mesh.device());

  SolveResult res;
  if (stencil == "5") {
    const Laplacian5 A{h};
    res = poisson_example::solve_with(A, b, x, args);
  } else if (stencil == "9") {
    const Laplacian9 A{h};
    res = poisson_example::solve_with(A, b, x, args);
  } else {
    // k at every node of the block and at the boundary nodes around it.
    const VarCoeffLaplacian5<double, P0, P1> A(
        sample_coefficient<double, P0, P1>(
            mesh, Shape<2>{n, n}, [&](std::array<int64_t, 2> g) { return kcoef((g[1] + 1) * h, (g[0] + 1) * h); }),
        h);
    res = poisson_example::solve_with(A, b, x, args);
  }
  double err = 0;
  const Tensor<double, 2> xh = x.local().to(Device::host());
  for (int64_t i = 0; i < ls[0]; ++i)
    for (int64_t j = 0; j < ls[1]; ++j)
      err = std::max(err, std::abs(xh(i, j) - exact((off[1] + j + 1) * h, (off[0] + i + 1) * h)));
  std::vector<double> e{err};
  all_reduce_values<double>(mesh.comm(), e.data(), 1, ReduceOp::Max);
  if (keep) keep(x);
  return {n, e[0], res};
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = poisson_example::parse(argc, argv, "poisson2d", Args{.n = 31, .levels = 4});
  std::vector<std::string> stencils = {"5", "9", "var"};
  if (args.stencil != "all") stencils = {args.stencil};
  for (const auto& s : stencils)
    if (s != "5" && s != "9" && s != "var") {
      std::fprintf(stderr, "poisson2d: -stencil must be 5, 9, var or all, not %s\n", s.c_str());
      return 2;
    }
  int failed = 0;

  auto program = [&](Comm& comm) {
    DeviceMesh<2> mesh(comm, mesh_shape(comm.size()));
    const bool root = comm.rank() == 0;
#ifdef DTENSOR_HAVE_HDF5
    poisson_example::SolutionOutput<2, Vec> output(args);
#endif
    for (const auto& s : stencils) {
      if (root)
        std::printf("\n%s, %s (%s, %s), %s mesh, %s runtime\n",
                    s == "5"   ? "5-point Laplacian"
                    : s == "9" ? "9-point Laplacian"
                               : "-div(k grad u), 5-point",
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
  return poisson_example::run_in_process(args, "poisson2d", program, failed);
#endif
}
