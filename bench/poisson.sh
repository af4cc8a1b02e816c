#!/usr/bin/env bash
# Builds bench_poisson (needs PETSc: scripts/setup.sh --bench) and runs it under
# mpirun on 1 and 2 processes; the arguments go to bench_poisson (sizes first, then
# --iters=K, --reps=R, PETSc options). Prints one table per process count.
#   bench/poisson.sh                    N = 1024 and 2048
#   bench/poisson.sh 512 --iters=50     a quick look
# Environment: BUILD_DIR (default build), POISSON_NP (default "1 2").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTENSOR_BUILD_BENCH=ON > /dev/null
if ! grep -q bench_poisson "$build/bench/Makefile" 2>/dev/null; then
  echo "poisson.sh: bench_poisson is not configured (PETSc not found): run scripts/setup.sh --bench" >&2
  exit 1
fi
cmake --build "$build" -j"$(nproc)" --target bench_poisson
# Root allowed (containers); shared memory without ptrace, as the MPI tests run.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
for np in ${POISSON_NP:-1 2}; do
  echo
  mpirun -np "$np" "$build/bench/bench_poisson" "$@"
done
