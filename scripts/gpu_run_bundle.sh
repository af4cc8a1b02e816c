#!/usr/bin/env bash
# The runner inside a bundle of scripts/gpu_bundle.sh (as run.sh): runs the GPU test
# entries as ctest would, then bench_cuda, on a machine with an NVIDIA GPU.
#   run.sh [results dir] [compare]              (default: results/ beside run.sh)
# With "compare" as the second argument, or DTENSOR_GPU_COMPARE=1, the comparison with
# PyTorch on the same GPU runs after the tests (scripts/gpu_compare.sh: bench_cuda's
# results reused, gpu_torch.py, bench_cuda_attention where the bundle has it; the table
# in <results dir>/compare/compare.md; about 5.5 minutes on an H200 on 2026-11-28, the
# attention's cuDNN graphs most of it).
# Environment:
#   DTENSOR_GPU_CHECK_SANITIZER=1     also run each test binary under compute-sanitizer memcheck
#   DTENSOR_GPU_CHECK_SKIP_BENCH=1    skip bench_cuda
#   DTENSOR_BUNDLE_LIBS               directories searched first for libcudart, cuBLAS, cuDNN and NCCL
# Exit status: 0 when every entry passed or was skipped for want of GPUs it names, the
# benchmark ran and the sanitizer found nothing; 1 otherwise; 3 without a usable GPU.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$here"

# CUDA's libraries from this machine: the toolkit, the system, or PyTorch's wheels.
# PyTorch (the comparison) keeps the library path it was given: it loads its own.
source "$here/scripts/gpu_libs.sh"
given_ld_path=${LD_LIBRARY_PATH-}
export LD_LIBRARY_PATH=$(gpu_libpath "$here")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1) || {
  echo "run.sh: no usable GPU: nvidia-smi says: $gpu" >&2
  exit 3
}
echo "== run.sh: $(head -1 BUILD_INFO); GPU $gpu"

passed=0 failed=0 skipped=0 expected_skips=0
failures=()
while IFS=$'\t' read -r name env limit exe args; do
  [[ -n $name ]] || continue
  envs=()
  [[ $env != - ]] && read -r -a envs <<< "$env"
  read -r -a argv <<< "${args:-}"
  start=$(date +%s)
  env "${envs[@]}" timeout "$limit" "bin/$exe" "${argv[@]}" > "$out/$name.log" 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  if ((rc == 0)); then
    passed=$((passed + 1)) verdict=Passed
  elif ((rc == 77)); then
    skipped=$((skipped + 1)) verdict="Skipped ($(grep -m1 SKIPPED "$out/$name.log"))"
    grep -q "SKIPPED: needs [0-9]* GPUs" "$out/$name.log" && expected_skips=$((expected_skips + 1))
  else
    failed=$((failed + 1)) verdict="FAILED (exit $rc)" failures+=("$name")
  fi
  printf '%-40s %s  %ss\n' "$name" "$verdict" "$took"
done < entries.tsv
for f in "${failures[@]}"; do
  echo "----- $f (last lines of $out/$f.log)"
  tail -30 "$out/$f.log"
done

bench_status="skipped (DTENSOR_GPU_CHECK_SKIP_BENCH=1)" bench_rc=0
if [[ ${DTENSOR_GPU_CHECK_SKIP_BENCH:-0} != 1 ]]; then
  timeout 300 bin/bench_cuda --benchmark_out="$out/bench_cuda.json" --benchmark_out_format=json \
    > "$out/bench_cuda.txt" 2>&1
  bench_rc=$?
  cat "$out/bench_cuda.txt"
  bench_status="$out/bench_cuda.txt, $out/bench_cuda.json"
  ((bench_rc == 0)) || bench_status="FAILED (exit $bench_rc; $out/bench_cuda.txt)"
fi

compare_status="not run (run.sh DIR compare, or DTENSOR_GPU_COMPARE=1, runs it)" compare_rc=0
if [[ ${2:-} == compare || ${DTENSOR_GPU_COMPARE:-0} == 1 ]]; then
  reuse=()  # bench_cuda's results of this run, not an older run's left in $out
  [[ ${DTENSOR_GPU_CHECK_SKIP_BENCH:-0} != 1 && $bench_rc == 0 && -s $out/bench_cuda.json ]] &&
    reuse=("$out/bench_cuda.json")
  LD_LIBRARY_PATH=$given_ld_path scripts/gpu_compare.sh "$out/compare" "${reuse[@]}"
  compare_rc=$?
  compare_status="$out/compare/compare.md"
  ((compare_rc == 0)) || compare_status="FAILED (exit $compare_rc; logs in $out/compare)"
fi

sanitizer_status="not run (DTENSOR_GPU_CHECK_SANITIZER=1 runs it)" sanitizer_bad=0
if [[ ${DTENSOR_GPU_CHECK_SANITIZER:-0} == 1 ]]; then
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  sanitizer_status=""
  while IFS=$'\t' read -r name env limit exe args; do
    [[ -n $name && $name != *multi_gpu ]] || continue
    envs=()
    [[ $env != - ]] && read -r -a envs <<< "$env"
    read -r -a argv <<< "${args:-}"
    # API errors are not reported: dtensor checks the result of every CUDA call itself
    # (a failure fails the test), and NCCL's init probes kernel images and handles the
    # cudaErrorNoKernelImageForDevice it gets, which memcheck would count as errors.
    env "${envs[@]}" timeout "$limit" "$cs" --tool memcheck --report-api-errors no --print-limit 10 \
      "bin/$exe" "${argv[@]}" > "$out/memcheck_$name.log" 2>&1
    rc=$?
    summary=$(grep -m1 "ERROR SUMMARY" "$out/memcheck_$name.log" || echo "no summary (exit $rc)")
    [[ $summary == *" 0 errors"* && ($rc == 0 || $rc == 77) ]] || sanitizer_bad=$((sanitizer_bad + 1))
    sanitizer_status+=$'\n'"               $name: ${summary#========= }"
  done < entries.tsv
fi

cat << EOF

============================ gpu bundle summary ============================
build          $(tail -n +2 BUILD_INFO | paste -sd';' | sed 's/;/; /g')
GPU            $gpu
GPU tests      $passed passed, $failed failed, $skipped skipped ($expected_skips for want of GPUs); logs in $out
bench_cuda     $bench_status
vs PyTorch     $compare_status
memcheck       $sanitizer_status
============================================================================
EOF
((failed == 0 && skipped == expected_skips && bench_rc == 0 && compare_rc == 0 && sanitizer_bad == 0)) || exit 1
echo "run.sh: OK"
