#pragma once
// The dtensor side of bench_poisson: the same problem as petsc_poisson.hpp (N x N
// grid, unscaled 5-point operator 4 / -1, Dirichlet zero, b = 1, x0 = 0, exactly K
// CG iterations), matrix-free on a 1-D mesh of the MPI processes, the grid's rows
// sharded (Shard<0>: the row blocks PETSc's DMDA picks for 1 and 2 processes).
//
// Byte model of one Chronopoulos–Gear iteration (cg.hpp), n = N*N, 8-byte values,
// written vectors counted once (no write-allocate), as in petsc_poisson.hpp:
//   fused pass p = r + b p, s = w + b s, x += a p, r -= a s (with r.r):
//     reads p s w x r, writes p s x r                      72n
//   stencil w = A r (with w.r in its epilogue, on rows still in cache):
//     reads r, writes w                                    16n
//   total                                                  88n
// Classic CG moves the same 88n: stencil q = A p (16n), x += a p and r -= a q with
// r.r (reads x p r q, writes x r: 48n), p = r + b p (24n). PETSc's assembled CG
// moves about 200n (its model), so the bytes alone bound the ratio near 0.44.
#include <dtensor/halo.hpp>
#include <dtensor/mpi.hpp>
#include <dtensor/solvers.hpp>

#include "poisson_timing.hpp"

namespace bench::poisson {

struct DtensorConfig {
  int iterations = 100;
  int reps = 5;
};

struct DtensorResult {
  double cg_iter_s = 0;          // Chronopoulos–Gear (one all-reduce per iteration), overlapped stencil
  double cg_classic_iter_s = 0;  // classic CG (two all-reduces), overlapped stencil
  double exchange_s = 0;         // one forward ghost exchange of the CG vector (width 1, star)
  double apply_local_s = 0;      // the stencil alone, ghosts already there
  double apply_plain_s = 0;      // exchange, then the stencil
  double apply_overlapped_s = 0; // begin, inner rows, end, boundary rows
  double bytes_per_iter = 0;     // the model above
  double cg_gbs = 0;
  double residual = 0;           // ||r_K||_2, CG's recursive residual
  int iterations = 0;
};

inline DtensorResult run_dtensor(dtensor::Comm& comm, int n, const DtensorConfig& cfg = {}) {
  using namespace dtensor;
  using Vec = DTensor<double, 2, Shard<0>>;
  MPI_Comm world = MPI_COMM_WORLD;
  DeviceMesh<1> mesh(comm);
  const Shape<2> shape{n, n};
  const Laplacian5 A{1.0};  // h = 1: the unscaled 4 / -1 stencil
  Vec b = full<double, Shard<0>>(shape, mesh, 1.0);
  Vec x = zeros<double, Shard<0>>(shape, mesh);
  DtensorResult res;
  res.iterations = cfg.iterations;

  auto time_solve = [&](CgVariant variant, double* residual) {
    CgOptions opt;
    opt.stop = {cfg.iterations, 0, 0};
    opt.variant = variant;
    CgSolver solver(A, b, opt);
    {  // warm-up, as PETSc's: a short solve
      CgOptions warm = opt;
      warm.stop.max_iters = 10;
      CgSolver w(A, b, warm);
      w.solve(b, x);
    }
    std::vector<double> t;
    for (int r = 0; r < cfg.reps; ++r) {
      movement::fill(x.local(), 0.0);
      SolveResult sr;
      t.push_back(time_once(world, [&] { sr = solver.solve(b, x); }));
      if (sr.iterations != cfg.iterations) throw std::runtime_error("dtensor CG stopped early");
      if (residual) *residual = sr.residual;
    }
    return median(t) / cfg.iterations;
  };
  res.cg_iter_s = time_solve(CgVariant::ChronopoulosGear, &res.residual);
  res.cg_classic_iter_s = time_solve(CgVariant::Classic, nullptr);
  res.bytes_per_iter = 88.0 * double(n) * double(n);
  res.cg_gbs = res.bytes_per_iter / res.cg_iter_s / 1e9;

  auto u = Ghosted<double, 2, Shard<0>>::from(b, A.halo());
  Tensor<double, 2> y(u.local_shape());
  res.exchange_s = time_per_call(world, cfg.reps, [&] { u.exchange(); }).seconds;
  res.apply_local_s = time_per_call(world, cfg.reps, [&] { apply_local(A, u, y); }).seconds;
  res.apply_plain_s = time_per_call(world, cfg.reps, [&] { apply_plain(A, u, y); }).seconds;
  res.apply_overlapped_s = time_per_call(world, cfg.reps, [&] { apply_overlapped(A, u, y); }).seconds;
  return res;
}

}  // namespace bench::poisson
