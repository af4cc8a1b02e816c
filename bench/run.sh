#!/usr/bin/env bash
# Builds the benchmarks, runs every family, writes JSON to bench/results/ and
# prints the ratio tables (bench/report.py). Usage:
#   bench/run.sh [--quick]      --quick: shorter runs and sizes up to 16 MiB
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0; [[ "${1:-}" == "--quick" ]] && quick=1
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDTENSOR_BUILD_BENCH=ON > /dev/null
cmake --build build -j"$(nproc)" --target bench_collectives bench_redistribute bench_dispatch bench_ops $(grep -q bench_mpi build/bench/Makefile 2>/dev/null && echo bench_mpi)
out=bench/results; mkdir -p "$out"
common=(--benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_min_time=$([[ $quick == 1 ]] && echo 0.05 || echo 0.2))
filter=$([[ $quick == 1 ]] && echo '--benchmark_filter=/(8|64|512|4096|32768|262144|2097152|16777216)/' || echo '--benchmark_filter=.')
build/bench/bench_dispatch "${common[@]}" --benchmark_out="$out/dispatch.json" > /dev/null
build/bench/bench_ops "${common[@]}" --benchmark_out="$out/ops.json" > /dev/null
build/bench/bench_collectives "${common[@]}" "$filter" --benchmark_out="$out/collectives.json" > /dev/null
build/bench/bench_redistribute "${common[@]}" "$filter" --benchmark_out="$out/redistribute.json" > /dev/null
if [[ -x build/bench/bench_mpi ]]; then
  export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  for np in 2 4; do
    mpirun -np $np build/bench/bench_mpi --benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_out="$out/mpi$np.json" > /dev/null
  done
fi
python3 bench/report.py "$out"
py=python3; $py -c "import matplotlib" 2>/dev/null || py=/usr/bin/python3
$py bench/plot.py "$out" && echo "plots: $out/collectives.png $out/dispatch.png"
