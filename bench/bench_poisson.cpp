// bench_poisson: CG without preconditioner on the 2-D 5-point Poisson problem and its
// ghost exchange, against PETSc (DMDA + KSPCG) and a STREAM-triad-like loop, all
// measured in the same run, size after size. The problem, the PETSc settings and the
// byte model are described in petsc_poisson.hpp; the timing rules and the triad in
// poisson_timing.hpp.
//
//   mpirun -np 2 build/bench/bench_poisson [N ...] [--iters=K] [--reps=R] [PETSc options]
//   bench/poisson.sh [same arguments]     builds it, runs it on 1 and 2 processes
// (as root, Open MPI wants OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;
// poisson.sh sets them).
//
// N defaults to 1024 and 2048; K (CG iterations per timed solve) to 100; R (timed
// solves, median) to 5. Arguments starting with a single '-' go to PETSc, each with
// the next argument as its value unless that starts with '-' (e.g. -log_view,
// -da_processors_x 2): give the sizes first. Rank 0 prints a table.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "dtensor_poisson.hpp"
#include "petsc_poisson.hpp"
#include "poisson_timing.hpp"

namespace {

using namespace bench::poisson;

struct Args {
  std::vector<int> sizes;
  PetscConfig petsc;
  std::vector<char*> petsc_argv;  // argv[0] and the PETSc options
};

Args parse(int argc, char** argv) {
  Args a;
  a.petsc_argv.push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const char* s = argv[i];
    if (std::strncmp(s, "--iters=", 8) == 0) {
      a.petsc.iterations = std::atoi(s + 8);
    } else if (std::strncmp(s, "--reps=", 7) == 0) {
      a.petsc.reps = std::atoi(s + 7);
    } else if (s[0] >= '0' && s[0] <= '9') {
      a.sizes.push_back(std::atoi(s));
    } else {
      // a PETSc option and, when the next argument is no option of ours, its value
      a.petsc_argv.push_back(argv[i]);
      if (i + 1 < argc && argv[i + 1][0] != '-' && s[0] == '-' && s[1] != '-') a.petsc_argv.push_back(argv[++i]);
    }
  }
  if (a.sizes.empty()) a.sizes = {1024, 2048};
  if (a.petsc.iterations < 1 || a.petsc.reps < 1) {
    std::fprintf(stderr, "bench_poisson: --iters and --reps must be at least 1\n");
    std::exit(2);
  }
  a.petsc_argv.push_back(nullptr);
  return a;
}

// One line of the table: everything measured for one grid size.
struct Row {
  PetscResult petsc;
  DtensorResult dt;
  TriadResult triad;
};

void print_table(const std::vector<Row>& rows, const Args& args) {
  const Row& r0 = rows.front();
  std::printf("bench_poisson: %d process(es), PetscInt %d bytes, CG %d iterations per solve, median of %d solves; "
              "triad arrays %.0f MiB each (all ranks), median of %d sweeps\n",
              r0.petsc.procs, r0.petsc.index_bytes, args.petsc.iterations, args.petsc.reps,
              double(r0.triad.bytes_per_array) / (1 << 20), r0.triad.reps);
  std::printf("\n| N | procs | DMDA grid | PETSc CG ms/iter | PETSc MatMult ms | PETSc exchange us | triad GB/s "
              "| PETSc CG GB/s (model) | PETSc CG / triad | model MB/iter | ||r_K||_2 |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const PetscResult& p = r.petsc;
    std::printf("| %d | %d | %dx%d | %.3f | %.3f | %.1f | %.2f | %.2f | %.2f | %.1f | %.6e |\n", p.n, p.procs, p.px,
                p.py, p.cg_iter_s * 1e3, p.matmult_s * 1e3, p.exchange_s * 1e6, r.triad.gbs, p.cg_gbs,
                p.cg_gbs / r.triad.gbs, p.bytes_per_iter / 1e6, p.residual);
  }
  std::printf("\n**dtensor against PETSc, same run** (ratios: dtensor / PETSc; goals: CG <= 0.5, exchange <= 1.0, "
              "CG bandwidth / triad >= 0.8)\n");
  std::printf("\n| N | procs | dtensor CG ms/iter (1 all-reduce) | classic CG ms/iter | CG time vs PETSc | "
              "exchange us | exchange vs PETSc | CG GB/s (model 88n) | CG / triad | ||r_K||_2 | same as PETSc |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const PetscResult& p = r.petsc;
    const DtensorResult& d = r.dt;
    const double rel = std::abs(d.residual - p.residual) / std::max(1e-300, std::abs(p.residual));
    std::printf("| %d | %d | %.3f | %.3f | %.2f | %.1f | %.2f | %.2f | %.2f | %.6e | %s (%.1e) |\n", p.n, p.procs,
                d.cg_iter_s * 1e3, d.cg_classic_iter_s * 1e3, d.cg_iter_s / p.cg_iter_s, d.exchange_s * 1e6,
                d.exchange_s / p.exchange_s, d.cg_gbs, d.cg_gbs / r.triad.gbs, d.residual, rel < 1e-8 ? "yes" : "NO",
                rel);
  }
  std::printf("\n**Overlap** (one stencil application; exposed exchange = time - stencil alone)\n");
  std::printf("\n| N | procs | stencil alone us | exchange then stencil us | overlapped us | exposed, sequential us | "
              "exposed, overlapped us |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const DtensorResult& d = r.dt;
    std::printf("| %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f |\n", r.petsc.n, r.petsc.procs, d.apply_local_s * 1e6,
                d.apply_plain_s * 1e6, d.apply_overlapped_s * 1e6, (d.apply_plain_s - d.apply_local_s) * 1e6,
                (d.apply_overlapped_s - d.apply_local_s) * 1e6);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);  // as dtensor::run_mpi does
  Args args = parse(argc, argv);
  int petsc_argc = int(args.petsc_argv.size()) - 1;
  char** petsc_argv = args.petsc_argv.data();
  if (PetscInitialize(&petsc_argc, &petsc_argv, nullptr, nullptr) != 0) MPI_Abort(MPI_COMM_WORLD, 1);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  std::vector<Row> rows;
  auto dcomm = dtensor::MpiComm::world();
  try {
    for (int n : args.sizes) {
      Row row;
      row.petsc = run_petsc(MPI_COMM_WORLD, n, args.petsc);
      row.dt = run_dtensor(*dcomm, n, DtensorConfig{args.petsc.iterations, args.petsc.reps});
      row.triad = triad(MPI_COMM_WORLD, int64_t(n) * n);
      rows.push_back(row);
      if (rank == 0) {
        std::fprintf(stderr, "bench_poisson: N = %d done\n", n);
        std::fflush(stderr);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_poisson: rank %d failed: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) print_table(rows, args);

  dcomm.reset();
  PetscFinalize();
  MPI_Finalize();
  return 0;
}
