#!/usr/bin/env bash
# Builds bench_multigrid (needs PETSc: scripts/setup.sh --bench) and runs it under
# mpirun on 1 and 2 processes; the arguments go to bench_multigrid (problems such as
# 2d:2048 3d:128, --reps=R, --no-gamg, PETSc options). Prints one table per problem.
#   bench/multigrid.sh                      2d:1024 2d:2048 3d:128
#   bench/multigrid.sh 2d:512 --reps=1      a quick look
# Environment: BUILD_DIR (default build-bench), MULTIGRID_NP (default "1 2").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-bench}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTENSOR_BUILD_BENCH=ON > /dev/null
if ! grep -q bench_multigrid "$build/bench/Makefile" 2>/dev/null; then
  echo "multigrid.sh: bench_multigrid is not configured (PETSc not found): run scripts/setup.sh --bench" >&2
  exit 1
fi
cmake --build "$build" -j"$(nproc)" --target bench_multigrid
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
for np in ${MULTIGRID_NP:-1 2}; do
  echo
  mpirun -np "$np" "$build/bench/bench_multigrid" "$@"
done
