#pragma once
// The PETSc side of bench_poisson: CG without preconditioner on the 2-D 5-point
// Poisson problem, PETSc's way (DMDA + assembled AIJ matrix + KSPCG + PCNONE), and
// its ghost exchange (DMGlobalToLocalBegin/End).
//
// The problem, which the dtensor side must reproduce exactly:
//   - grid N x N, unknowns u(i, j), 0 <= i, j < N, row-major (i fastest in PETSc's
//     DMDA natural ordering: i is x, j is y);
//   - operator: the unscaled integer 5-point Laplacian, (A u)(i,j) = 4 u(i,j)
//     - u(i-1,j) - u(i+1,j) - u(i,j-1) - u(i,j+1), where a neighbour outside the grid
//     is left out (homogeneous Dirichlet boundary just outside the grid). No 1/h^2:
//     every coefficient is an exact integer, so both sides apply the same operator;
//   - right-hand side b = 1 everywhere, initial guess x0 = 0;
//   - exactly K iterations of unpreconditioned CG (no convergence test; N >= 64 is
//     far from converged after a few hundred iterations, so no breakdown).
//   With the same K, the final residual norm ||r_K||_2 must agree between the two
//   sides to rounding: it is reported as a cross-check.
//
// Settings of the PETSc side: DMDACreate2d(DM_BOUNDARY_NONE x 2, DMDA_STENCIL_STAR,
// stencil width 1, dof 1, process grid PETSC_DECIDE unless -da_processors_x/_y say
// otherwise); DMCreateMatrix (AIJ: SeqAIJ on one process, MPIAIJ on more), filled with
// MatSetValuesStencil; KSPCG, PCNONE, KSP_NORM_NATURAL (for PCNONE the natural norm
// sqrt(r'z) = ||r||_2 comes from the dot product CG needs anyway, so no extra norm is
// computed), KSPConvergedSkip with max_it = K (exactly K iterations), rtol = atol = 0.
// Options given on the command line (-ksp_monitor, -log_view, -da_processors_x...)
// are read first; the settings above are then forced.
//
// Byte model of one PETSc CG iteration (n = N*N unknowns, nnz = 5n - 4N nonzeros,
// isz = sizeof(PetscInt), 4 in Debian's build; 8-byte scalars; bytes that must cross
// the memory bus at least once, STREAM convention: a written vector counts 8n, its
// write-allocate read is not counted). KSPSolve_CG with PCNONE does per iteration
// (W aliases Z without single reduction; PCApply_None is a VecCopy):
//   VecAYPX  p = z + b p          24n   (read p, z; write p)
//   MatMult  z = A p              nnz*(8 + isz)  values and column indices
//                                 + n*isz        row offsets
//                                 + 16n          read p, write z
//   VecTDot  p'z                  16n
//   VecAXPY  x = x + a p          24n
//   VecAXPY  r = r - a z          24n
//   PCApply  z = r (VecCopy)      16n
//   VecTDot  z'r                  16n
// Vectors: 120n; matrix: nnz*(8 + isz) + n*(isz + 16). With isz = 4: about
// 60n + 20n + 120n = 200n bytes (200 MiB-ish at N = 1024). The off-process ghost
// values of MatMult (one grid line per neighbour) are O(N) and not counted.
// Verify the operation counts of a build with: bench_poisson 256 -log_view.
//
// The ghost exchange: DMGlobalToLocalBegin/End(INSERT_VALUES) from a global vector to
// the ghosted local vector. It copies the owned block into the local vector as well as
// receiving the ghost lines, so on one process it is a copy of the whole vector.
#include <petscdmda.h>
#include <petscksp.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "poisson_timing.hpp"

namespace bench::poisson {

inline void petsc_check(PetscErrorCode e, const char* call) {
  if (e) throw std::runtime_error("PETSc error " + std::to_string(int(e)) + " in " + call);
}
#define BENCH_PETSC(...) ::bench::poisson::petsc_check((__VA_ARGS__), #__VA_ARGS__)

struct PetscConfig {
  int iterations = 100;  // CG iterations per timed solve (exactly)
  int reps = 5;          // timed solves; the exchange and MatMult use 2 * reps + 1 repeats
};

struct PetscResult {
  int n = 0;               // grid N: N x N unknowns
  int procs = 0;
  int px = 0, py = 0;      // DMDA process grid (x = i, y = j)
  int iterations = 0;      // CG iterations in each timed solve
  int reps = 0;
  int index_bytes = int(sizeof(PetscInt));
  int64_t nnz = 0;         // nonzeros of the assembled matrix, all ranks
  double cg_iter_s = 0;    // median solve time / iterations (includes the solve's own start: r = b, first dot)
  double matmult_s = 0;    // one MatMult, median
  double exchange_s = 0;   // one DMGlobalToLocalBegin/End, median
  int64_t exchange_inner = 0;
  double bytes_per_iter = 0;  // the byte model above
  double cg_gbs = 0;          // bytes_per_iter / cg_iter_s, 1e9 bytes/s
  double residual = 0;        // ||r_K||_2 (CG's recursive residual) after K iterations
};

// The model above, for n unknowns and nnz nonzeros.
inline double petsc_cg_bytes_per_iter(int64_t n, int64_t nnz, int index_bytes = int(sizeof(PetscInt))) {
  const double matmult = double(nnz) * (8 + index_bytes) + double(n) * (index_bytes + 16);
  const double vectors = 120.0 * double(n);
  return matmult + vectors;
}

// Builds the problem for an N x N grid on comm, measures, tears down. Collective.
inline PetscResult run_petsc(MPI_Comm comm, int n, const PetscConfig& cfg = {}) {
  PetscResult res;
  res.n = n;
  res.iterations = cfg.iterations;
  res.reps = cfg.reps;
  MPI_Comm_size(comm, &res.procs);

  DM da;
  BENCH_PETSC(DMDACreate2d(comm, DM_BOUNDARY_NONE, DM_BOUNDARY_NONE, DMDA_STENCIL_STAR, n, n, PETSC_DECIDE,
                           PETSC_DECIDE, 1, 1, nullptr, nullptr, &da));
  BENCH_PETSC(DMSetFromOptions(da));
  BENCH_PETSC(DMSetUp(da));
  PetscInt px = 0, py = 0;
  BENCH_PETSC(DMDAGetInfo(da, nullptr, nullptr, nullptr, nullptr, &px, &py, nullptr, nullptr, nullptr, nullptr,
                          nullptr, nullptr, nullptr));
  res.px = int(px);
  res.py = int(py);

  // The operator: 4 on the diagonal, -1 for each neighbour inside the grid.
  Mat A;
  BENCH_PETSC(DMCreateMatrix(da, &A));
  DMDALocalInfo info;
  BENCH_PETSC(DMDAGetLocalInfo(da, &info));
  for (PetscInt j = info.ys; j < info.ys + info.ym; ++j) {
    for (PetscInt i = info.xs; i < info.xs + info.xm; ++i) {
      const MatStencil row{.k = 0, .j = j, .i = i, .c = 0};
      MatStencil col[5];
      PetscScalar v[5];
      int k = 0;
      auto add = [&](PetscInt jj, PetscInt ii, PetscScalar value) {
        col[k] = MatStencil{.k = 0, .j = jj, .i = ii, .c = 0};
        v[k++] = value;
      };
      if (j > 0) add(j - 1, i, -1);
      if (i > 0) add(j, i - 1, -1);
      add(j, i, 4);
      if (i < n - 1) add(j, i + 1, -1);
      if (j < n - 1) add(j + 1, i, -1);
      BENCH_PETSC(MatSetValuesStencil(A, 1, &row, k, col, v, INSERT_VALUES));
    }
  }
  BENCH_PETSC(MatAssemblyBegin(A, MAT_FINAL_ASSEMBLY));
  BENCH_PETSC(MatAssemblyEnd(A, MAT_FINAL_ASSEMBLY));
  MatInfo minfo;
  BENCH_PETSC(MatGetInfo(A, MAT_GLOBAL_SUM, &minfo));
  res.nnz = int64_t(minfo.nz_used);

  Vec b, x, y;
  BENCH_PETSC(DMCreateGlobalVector(da, &b));
  BENCH_PETSC(VecDuplicate(b, &x));
  BENCH_PETSC(VecDuplicate(b, &y));
  BENCH_PETSC(VecSet(b, 1.0));

  KSP ksp;
  BENCH_PETSC(KSPCreate(comm, &ksp));
  BENCH_PETSC(KSPSetOperators(ksp, A, A));
  BENCH_PETSC(KSPSetFromOptions(ksp));  // monitors, views; the method is forced below
  BENCH_PETSC(KSPSetType(ksp, KSPCG));
  PC pc;
  BENCH_PETSC(KSPGetPC(ksp, &pc));
  BENCH_PETSC(PCSetType(pc, PCNONE));
  BENCH_PETSC(KSPSetInitialGuessNonzero(ksp, PETSC_FALSE));
  BENCH_PETSC(KSPSetNormType(ksp, KSP_NORM_NATURAL));
  BENCH_PETSC(KSPSetConvergenceTest(ksp, KSPConvergedSkip, nullptr, nullptr));
  BENCH_PETSC(KSPSetUp(ksp));

  auto solve = [&](int iterations) {
    BENCH_PETSC(KSPSetTolerances(ksp, 0.0, 0.0, PETSC_DEFAULT, iterations));
    BENCH_PETSC(KSPSolve(ksp, b, x));
  };
  solve(10);  // warm-up: work vectors, first touch
  BENCH_PETSC(KSPSetTolerances(ksp, 0.0, 0.0, PETSC_DEFAULT, cfg.iterations));
  const double solve_s = median_time(comm, cfg.reps, [&] { BENCH_PETSC(KSPSolve(ksp, b, x)); });
  PetscInt its = 0;
  KSPConvergedReason reason;
  BENCH_PETSC(KSPGetIterationNumber(ksp, &its));
  BENCH_PETSC(KSPGetConvergedReason(ksp, &reason));
  if (its != cfg.iterations || reason != KSP_CONVERGED_ITS)
    throw std::runtime_error("PETSc CG ran " + std::to_string(int(its)) + " iterations (reason " +
                             std::to_string(int(reason)) + "), not " + std::to_string(cfg.iterations));
  PetscReal rnorm = 0;
  BENCH_PETSC(KSPGetResidualNorm(ksp, &rnorm));
  res.residual = double(rnorm);
  res.cg_iter_s = solve_s / cfg.iterations;
  res.bytes_per_iter = petsc_cg_bytes_per_iter(int64_t(n) * n, res.nnz);
  res.cg_gbs = res.bytes_per_iter / res.cg_iter_s / 1e9;

  const int short_reps = 2 * cfg.reps + 1;
  res.matmult_s = time_per_call(comm, short_reps, [&] { BENCH_PETSC(MatMult(A, x, y)); }).seconds;

  Vec local;
  BENCH_PETSC(DMCreateLocalVector(da, &local));
  const auto ex = time_per_call(comm, short_reps, [&] {
    BENCH_PETSC(DMGlobalToLocalBegin(da, x, INSERT_VALUES, local));
    BENCH_PETSC(DMGlobalToLocalEnd(da, x, INSERT_VALUES, local));
  });
  res.exchange_s = ex.seconds;
  res.exchange_inner = ex.inner;

  BENCH_PETSC(VecDestroy(&local));
  BENCH_PETSC(KSPDestroy(&ksp));
  BENCH_PETSC(VecDestroy(&y));
  BENCH_PETSC(VecDestroy(&x));
  BENCH_PETSC(VecDestroy(&b));
  BENCH_PETSC(MatDestroy(&A));
  BENCH_PETSC(DMDestroy(&da));
  return res;
}

}  // namespace bench::poisson
