// bench_multigrid: time to solution of the Poisson problem, dtensor's geometric
// multigrid (solvers/multigrid.hpp) against PETSc's CG preconditioned by hypre's
// BoomerAMG and by GAMG, in the same run, setup and solve reported separately.
//
//   mpirun -np 2 build/bench/bench_multigrid [2d:N ...] [3d:N ...] [--reps=R] [--no-gamg] [PETSc options]
//   bench/multigrid.sh [same arguments]     builds it, runs it on 1 and 2 processes
//
// The problem (both sides, exactly): the unscaled 5-point (2-D, N x N) or 7-point
// (3-D, N^3) Laplacian, 2d (resp. 6) on the diagonal and -1 for each neighbour inside
// the grid (homogeneous Dirichlet just outside), b = 1, x0 = 0, stop at
// ||b - A x||_2 <= 1e-8 ||b||_2 (the unpreconditioned residual on both sides:
// KSP_NORM_UNPRECONDITIONED for PETSc's CG).
//
// PETSc: DMDA (process grid PETSC_DECIDE), AIJ matrix, KSPCG; PCHYPRE boomeramg with
// the options PETSc sets for it (V-cycle, one per application, Falgout coarsening,
// symmetric hybrid Gauss-Seidel relaxation, Gaussian elimination on the coarsest);
// PCGAMG with its defaults. Setup = KSPSetUp (the hierarchy), solve = KSPSolve; each
// repeat a fresh KSP, the median of R repeats. Command-line options reach PETSc
// (KSPSetFromOptions before the forced settings: -pc_hypre_* tuning works).
//
// dtensor: the grid's first dim sharded over the processes (Shard<0>), MgSolver with
// its defaults (Chebyshev degree 2, V-cycles; rediscretized coarse operators while
// the extents are odd, Galerkin from the first even one); setup = the constructor,
// solve = solve() (V-cycles to 1e-8) or PcgSolver with one V-cycle per iteration.
// Also, in the same run: a STREAM-triad-like bandwidth, and the multigrid solve's time
// per level (MgSolver::level_seconds) with the finest level's bandwidth by the byte
// model below.
//
// Byte model of the finest level per V-cycle of MgSolver::solve (n nodes, 8-byte
// values, written vectors counted once as in STREAM): 2 Chebyshev steps before and 2
// after (each: read x, b, 1/diag, d; write d, x: 48n), the residual for restriction
// (read x, b; write r: 24n), restriction (read r: 8n), prolongation (read-modify-write
// x: 16n), the stopping test's residual (24n): 4*48 + 24 + 8 + 16 + 24 = 264n.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dtensor/mpi.hpp>
#include <dtensor/solvers.hpp>
#include <exception>
#include <string>
#include <vector>

#include "petsc_poisson.hpp"
#include "poisson_timing.hpp"

namespace {

using namespace bench::poisson;

struct Problem {
  int dim = 2;
  int n = 1024;
};

struct Args {
  std::vector<Problem> problems;
  int reps = 3;
  bool gamg = true;
  std::vector<char*> petsc_argv;
};

Args parse(int argc, char** argv) {
  Args a;
  a.petsc_argv.push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const char* s = argv[i];
    if (std::strncmp(s, "--reps=", 7) == 0) {
      a.reps = std::atoi(s + 7);
    } else if (std::strcmp(s, "--no-gamg") == 0) {
      a.gamg = false;
    } else if (std::strncmp(s, "2d:", 3) == 0 || std::strncmp(s, "3d:", 3) == 0) {
      a.problems.push_back({s[0] - '0', std::atoi(s + 3)});
    } else {
      a.petsc_argv.push_back(argv[i]);
      if (i + 1 < argc && argv[i + 1][0] != '-' && s[0] == '-' && s[1] != '-') a.petsc_argv.push_back(argv[++i]);
    }
  }
  if (a.problems.empty()) a.problems = {{2, 1024}, {2, 2048}, {3, 128}};
  for (const auto& p : a.problems)
    if (p.n < 8 || a.reps < 1) {
      std::fprintf(stderr, "bench_multigrid: sizes must be at least 8 and --reps at least 1\n");
      std::exit(2);
    }
  a.petsc_argv.push_back(nullptr);
  return a;
}

struct Timing {
  std::string method;
  double setup_s = 0, solve_s = 0;
  int iterations = 0;
  double relres = 0;  // ||b - A x|| / ||b|| as the solver reports it
};

// ---------------------------------------------------------------------------------
// PETSc

Timing run_petsc(MPI_Comm comm, const Problem& pb, const char* pc_type, int reps) {
  const int n = pb.n;
  DM da;
  if (pb.dim == 2)
    BENCH_PETSC(DMDACreate2d(comm, DM_BOUNDARY_NONE, DM_BOUNDARY_NONE, DMDA_STENCIL_STAR, n, n, PETSC_DECIDE,
                             PETSC_DECIDE, 1, 1, nullptr, nullptr, &da));
  else
    BENCH_PETSC(DMDACreate3d(comm, DM_BOUNDARY_NONE, DM_BOUNDARY_NONE, DM_BOUNDARY_NONE, DMDA_STENCIL_STAR, n, n, n,
                             PETSC_DECIDE, PETSC_DECIDE, PETSC_DECIDE, 1, 1, nullptr, nullptr, nullptr, &da));
  BENCH_PETSC(DMSetFromOptions(da));
  BENCH_PETSC(DMSetUp(da));
  Mat A;
  BENCH_PETSC(DMCreateMatrix(da, &A));
  DMDALocalInfo info;
  BENCH_PETSC(DMDAGetLocalInfo(da, &info));
  const PetscInt zs = pb.dim == 3 ? info.zs : 0, zm = pb.dim == 3 ? info.zm : 1;
  for (PetscInt k = zs; k < zs + zm; ++k)
    for (PetscInt j = info.ys; j < info.ys + info.ym; ++j)
      for (PetscInt i = info.xs; i < info.xs + info.xm; ++i) {
        const MatStencil row{.k = k, .j = j, .i = i, .c = 0};
        MatStencil col[7];
        PetscScalar v[7];
        int c = 0;
        auto add = [&](PetscInt kk, PetscInt jj, PetscInt ii, PetscScalar value) {
          col[c] = MatStencil{.k = kk, .j = jj, .i = ii, .c = 0};
          v[c++] = value;
        };
        if (pb.dim == 3 && k > 0) add(k - 1, j, i, -1);
        if (j > 0) add(k, j - 1, i, -1);
        if (i > 0) add(k, j, i - 1, -1);
        add(k, j, i, 2.0 * pb.dim);
        if (i < n - 1) add(k, j, i + 1, -1);
        if (j < n - 1) add(k, j + 1, i, -1);
        if (pb.dim == 3 && k < n - 1) add(k + 1, j, i, -1);
        BENCH_PETSC(MatSetValuesStencil(A, 1, &row, c, col, v, INSERT_VALUES));
      }
  BENCH_PETSC(MatAssemblyBegin(A, MAT_FINAL_ASSEMBLY));
  BENCH_PETSC(MatAssemblyEnd(A, MAT_FINAL_ASSEMBLY));
  Vec b, x;
  BENCH_PETSC(DMCreateGlobalVector(da, &b));
  BENCH_PETSC(VecDuplicate(b, &x));
  BENCH_PETSC(VecSet(b, 1.0));

  std::vector<double> setup, solve;
  Timing t;
  t.method = std::string("PETSc CG + ") + (std::strcmp(pc_type, PCHYPRE) == 0 ? "hypre BoomerAMG" : "GAMG");
  for (int r = 0; r < reps; ++r) {
    KSP ksp;
    BENCH_PETSC(KSPCreate(comm, &ksp));
    BENCH_PETSC(KSPSetOperators(ksp, A, A));
    BENCH_PETSC(KSPSetType(ksp, KSPCG));
    PC pc;
    BENCH_PETSC(KSPGetPC(ksp, &pc));
    BENCH_PETSC(PCSetType(pc, pc_type));
    if (std::strcmp(pc_type, PCHYPRE) == 0) BENCH_PETSC(PCHYPRESetType(pc, "boomeramg"));
    BENCH_PETSC(KSPSetFromOptions(ksp));
    BENCH_PETSC(KSPSetNormType(ksp, KSP_NORM_UNPRECONDITIONED));
    BENCH_PETSC(KSPSetTolerances(ksp, 1e-8, 0.0, PETSC_DEFAULT, 10000));
    BENCH_PETSC(KSPSetInitialGuessNonzero(ksp, PETSC_FALSE));
    BENCH_PETSC(VecSet(x, 0.0));
    setup.push_back(time_once(comm, [&] { BENCH_PETSC(KSPSetUp(ksp)); }));
    solve.push_back(time_once(comm, [&] { BENCH_PETSC(KSPSolve(ksp, b, x)); }));
    PetscInt its = 0;
    KSPConvergedReason reason;
    BENCH_PETSC(KSPGetIterationNumber(ksp, &its));
    BENCH_PETSC(KSPGetConvergedReason(ksp, &reason));
    if (reason <= 0)
      throw std::runtime_error(t.method + " did not converge (reason " + std::to_string(int(reason)) + ")");
    PetscReal rnorm = 0, bnorm = 0;
    BENCH_PETSC(KSPGetResidualNorm(ksp, &rnorm));
    BENCH_PETSC(VecNorm(b, NORM_2, &bnorm));
    t.iterations = int(its);
    t.relres = double(rnorm / bnorm);
    BENCH_PETSC(KSPDestroy(&ksp));
  }
  t.setup_s = median(setup);
  t.solve_s = median(solve);
  BENCH_PETSC(VecDestroy(&x));
  BENCH_PETSC(VecDestroy(&b));
  BENCH_PETSC(MatDestroy(&A));
  BENCH_PETSC(DMDestroy(&da));
  return t;
}

// ---------------------------------------------------------------------------------
// dtensor

struct DtensorRun {
  Timing mg, pcg;
  int levels = 0;
  std::vector<double> level_s;  // MgSolver::solve's time per level (rank 0's clock), last repeat
  std::vector<dtensor::Shape<3>> grids;
  double finest_gbs = 0;        // the byte model above / the finest level's time
};

template <int R, class Op>
DtensorRun run_dtensor_dim(dtensor::Comm& comm, const Problem& pb, const Op& A, int reps) {
  using namespace dtensor;
  MPI_Comm world = MPI_COMM_WORLD;
  DeviceMesh<1> mesh(comm);
  Shape<R> shape;
  shape.fill(pb.n);
  auto b = full<double, Shard<0>>(shape, mesh, 1.0);
  auto x = zeros<double, Shard<0>>(shape, mesh);
  MgOptions opt;
  opt.stop = {.max_iters = 200, .rtol = 1e-8};
  DtensorRun out;
  out.mg.method = "dtensor multigrid (V-cycles)";
  out.pcg.method = "dtensor CG + multigrid";
  std::vector<double> setup, solve, pcg_solve;
  for (int r = 0; r < reps; ++r) {
    std::unique_ptr<MgSolver<Op, double, R, Shard<0>>> mg;
    setup.push_back(time_once(world, [&] { mg = std::make_unique<MgSolver<Op, double, R, Shard<0>>>(A, b, opt); }));
    movement::fill(x.local(), 0.0);
    SolveResult res;
    mg->reset_timers();
    solve.push_back(time_once(world, [&] { res = mg->solve(b, x); }));
    if (!res.converged) throw std::runtime_error("dtensor multigrid did not converge: " + res.to_string());
    out.mg.iterations = res.iterations;
    out.mg.relres = res.relative_residual();
    out.levels = mg->levels();
    out.level_s.clear();
    out.grids.clear();
    for (int l = 0; l < mg->levels(); ++l) {
      out.level_s.push_back(mg->level_seconds(l));
      Shape<3> g{1, 1, 1};
      for (int d = 0; d < R; ++d) g[d] = mg->grid(l)[d];
      out.grids.push_back(g);
    }
    movement::fill(x.local(), 0.0);
    PcgSolver pcg(A, *mg, b, CgOptions{.stop = opt.stop});
    pcg_solve.push_back(time_once(world, [&] { res = pcg.solve(b, x); }));
    if (!res.converged) throw std::runtime_error("dtensor CG + multigrid did not converge: " + res.to_string());
    out.pcg.iterations = res.iterations;
    out.pcg.relres = res.relative_residual();
  }
  out.mg.setup_s = out.pcg.setup_s = median(setup);
  out.mg.solve_s = median(solve);
  out.pcg.solve_s = median(pcg_solve);
  double n = 1;
  for (int d = 0; d < R; ++d) n *= pb.n;
  out.finest_gbs = 264.0 * n * out.mg.iterations / out.level_s[0] / 1e9;
  return out;
}

DtensorRun run_dtensor(dtensor::Comm& comm, const Problem& pb, int reps) {
  if (pb.dim == 2) return run_dtensor_dim<2>(comm, pb, dtensor::Laplacian5{1.0}, reps);
  return run_dtensor_dim<3>(comm, pb, dtensor::Laplacian7{1.0}, reps);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  Args args = parse(argc, argv);
  int petsc_argc = int(args.petsc_argv.size()) - 1;
  char** petsc_argv = args.petsc_argv.data();
  if (PetscInitialize(&petsc_argc, &petsc_argv, nullptr, nullptr) != 0) MPI_Abort(MPI_COMM_WORLD, 1);
  int rank = 0, procs = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &procs);
  auto dcomm = dtensor::MpiComm::world();
  if (rank == 0)
    std::printf("bench_multigrid: %d process(es), relative residual 1e-8, median of %d repeats (seconds)\n", procs,
                args.reps);
  try {
    for (const Problem& pb : args.problems) {
      const DtensorRun dt = run_dtensor(*dcomm, pb, args.reps);
      const Timing hypre = run_petsc(MPI_COMM_WORLD, pb, PCHYPRE, args.reps);
      Timing gamg;
      if (args.gamg) gamg = run_petsc(MPI_COMM_WORLD, pb, PCGAMG, args.reps);
      const TriadResult tr = triad(MPI_COMM_WORLD, pb.dim == 2 ? int64_t(pb.n) * pb.n : int64_t(pb.n) * pb.n * pb.n);
      if (rank != 0) continue;
      const char* shape = pb.dim == 2 ? "^2, 5-point" : "^3, 7-point";
      const double ref = hypre.setup_s + hypre.solve_s;
      std::printf("\n%d%s, %d process(es)\n\n", pb.n, shape, procs);
      std::printf("| method | setup s | solve s | total s | iterations | ||r||/||b|| | total / (PETSc + hypre) |\n");
      std::printf("|---|---|---|---|---|---|---|\n");
      std::vector<Timing> rows{dt.mg, dt.pcg, hypre};
      if (args.gamg) rows.push_back(gamg);
      for (const Timing& t : rows)
        std::printf("| %s | %.3f | %.3f | %.3f | %d | %.2e | %.3f |\n", t.method.c_str(), t.setup_s, t.solve_s,
                    t.setup_s + t.solve_s, t.iterations, t.relres, (t.setup_s + t.solve_s) / ref);
      double total = 0;
      for (double s : dt.level_s) total += s;
      std::printf("\nmultigrid solve by level (rank 0; %d levels): ", dt.levels);
      for (int l = 0; l < dt.levels; ++l)
        std::printf("%s%lld%s %.0f%%", l ? ", " : "", static_cast<long long>(dt.grids[l][0]),
                    pb.dim == 2 ? "^2" : "^3", 100 * dt.level_s[l] / total);
      std::printf("\nfinest level: %.2f GB/s (byte model 264n per cycle), triad %.2f GB/s: %.2f of the triad; "
                  "coarse levels %.0f%% of the solve\n",
                  dt.finest_gbs, tr.gbs, dt.finest_gbs / tr.gbs, 100 * (1 - dt.level_s[0] / total));
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_multigrid: rank %d failed: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  dcomm.reset();
  PetscFinalize();
  MPI_Finalize();
  return 0;
}
