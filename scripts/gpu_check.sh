#!/usr/bin/env bash
# The GPU check: the one command to run on a machine with an NVIDIA GPU.
#   scripts/gpu_check.sh
# 1. installs the build dependencies (scripts/setup.sh);
# 2. checks for nvcc and a usable GPU (nvidia-smi where installed, then a tiny
#    CUDA device query compiled with that nvcc), and stops with a clear message
#    when either is missing;
# 3. configures build/ with the CUDA backend and the benchmarks
#    (-DDTENSOR_BUILD_BENCH=ON) for this GPU's architecture, and builds it;
# 4. runs the GPU tests (ctest -L gpu --output-on-failure), then build/bench/bench_cuda;
# 5. prints a summary: GPU, driver, CUDA and NCCL versions, tests passed, failed and
#    skipped, and where the logs and the benchmark results are.
# Idempotent: a second run reuses build/ and rebuilds only what changed.
#
# Environment:
#   DTENSOR_JOBS                  build jobs (default: the number of cores)
#   DTENSOR_BUILD_DIR             build directory (default build)
#   CUDACXX                       the nvcc to use (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc)
#   CUDAARCHS                     CUDA architectures (default: this GPU's, e.g. 90)
#   DTENSOR_GPU_CHECK_SKIP_BENCH=1  skip bench_cuda
# Exit status: 0 when every GPU test passed and the benchmark ran; 2 without nvcc;
# 3 without a usable GPU; 1 when the build, a test or the benchmark failed.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${DTENSOR_JOBS:-$(nproc)}
build=${DTENSOR_BUILD_DIR:-build}
out=$build/gpu_check
say() { printf '== gpu_check: %s\n' "$*"; }
die() {
  local code=$1
  shift
  printf '\ngpu_check: FAILED: %s\n' "$*" >&2
  exit "$code"
}

./scripts/setup.sh
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute, for the summary

# --- nvcc ---
nvcc=${CUDACXX:-}
if [[ -z $nvcc ]]; then
  if command -v nvcc > /dev/null; then nvcc=$(command -v nvcc)
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then nvcc=/usr/local/cuda/bin/nvcc
  fi
fi
if [[ -n ${CUDACXX:-} && ! -x $nvcc ]]; then
  die 2 "CUDACXX=$CUDACXX is not an executable nvcc. Point it at the CUDA toolkit's nvcc, or unset it."
fi
[[ -n $nvcc ]] ||
  die 2 "nvcc not found (not on PATH, no /usr/local/cuda/bin/nvcc): the GPU build needs the CUDA toolkit." \
        "Install it (https://developer.nvidia.com/cuda-downloads), or set CUDACXX to its nvcc."
nvcc_version=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
say "nvcc $nvcc_version ($nvcc)"

# --- the GPU ---
smi_name="" smi_driver=""
if command -v nvidia-smi > /dev/null; then
  if ! smi=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1) || [[ -z $smi ]]; then
    die 3 "no usable GPU: nvidia-smi fails: ${smi:-no output}." \
          "Check that the NVIDIA driver is loaded and this machine (or container: --gpus all) sees a GPU."
  fi
  smi_name=$(head -1 <<< "$smi" | cut -d, -f1 | sed 's/^ *//;s/ *$//')
  smi_driver=$(head -1 <<< "$smi" | cut -d, -f2 | sed 's/^ *//;s/ *$//')
  say "nvidia-smi: $(wc -l <<< "$smi") GPU(s); GPU 0: $smi_name, driver $smi_driver"
else
  say "nvidia-smi is not installed; asking the CUDA runtime instead"
fi

# A tiny device query, compiled with the nvcc that builds dtensor: the authoritative
# check (the driver, the runtime and a device all work together).
cat > "$out/device_query.cu" << 'EOF'
#include <cstdio>
#include <cuda_runtime_api.h>
int main() {
  int driver = 0, runtime = 0, n = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("driver_cuda=%d.%d\nruntime_cuda=%d.%d\n", driver / 1000, driver % 1000 / 10, runtime / 1000,
              runtime % 1000 / 10);
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("error=%s\n", e != cudaSuccess ? cudaGetErrorString(e) : "the CUDA runtime reports 0 devices");
    return 1;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
    std::printf("error=cudaGetDeviceProperties(0) failed\n");
    return 1;
  }
  std::printf("devices=%d\nname=%s\ncc=%d%d\nmemory_gib=%.1f\n", n, p.name, p.major, p.minor,
              static_cast<double>(p.totalGlobalMem) / (1 << 30));
  return 0;
}
EOF
if ! "$nvcc" -o "$out/device_query" "$out/device_query.cu" > "$out/device_query.log" 2>&1; then
  cat "$out/device_query.log" >&2
  die 2 "nvcc cannot compile a 20-line CUDA program (above; $out/device_query.log): check the toolkit and its host compiler."
fi
query_rc=0
query=$("$out/device_query" 2>&1) || query_rc=$?
field() { sed -n "s/^$1=//p" <<< "$query" | head -1; }
if ((query_rc != 0)); then
  driver="the driver supports CUDA $(field driver_cuda)"
  [[ $(field driver_cuda) != 0.0 ]] || driver="no NVIDIA driver (libcuda) is installed or loaded"
  die 3 "no usable GPU: the CUDA runtime $(field runtime_cuda) says: $(field error); $driver." \
        "The GPU tests need an NVIDIA GPU and its driver; on this machine run scripts/test.sh instead" \
        "(the device paths run on the emulated device there)."
fi
gpu_name=$(field name) cc=$(field cc)
say "GPU 0: $gpu_name (sm_$cc, $(field memory_gib) GiB), $(field devices) device(s); driver supports CUDA" \
    "$(field driver_cuda), runtime $(field runtime_cuda)"

# --- configure and build ---
archs=${CUDAARCHS:-$cc}
say "configuring $build (CUDA architectures $archs, benchmarks on)"
if ! cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTENSOR_WITH_CUDA=ON -DDTENSOR_BUILD_BENCH=ON \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$archs" 2>&1 | tee "$out/configure.log"; then
  die 1 "CMake failed to configure $build (see $out/configure.log)"
fi
grep -q "dtensor: CUDA backend enabled" "$out/configure.log" ||
  die 1 "CMake did not enable the CUDA backend (see $out/configure.log): is the CUDA toolkit complete (cudart, cuBLAS)?"
nccl=$(sed -n 's/.*dtensor: NCCL \(.*\) found.*/\1/p' "$out/configure.log" | head -1)
[[ -n $nccl ]] || nccl="not found (NcclComm and its tests are left out)"
say "building $build with $jobs jobs"
cmake --build "$build" -j"$jobs" 2>&1 | tee "$out/build.log" || die 1 "the build failed (see $out/build.log)"

# --- the GPU tests ---
say "running the GPU tests: ctest -L gpu"
test_rc=0
ctest --test-dir "$build" -L gpu --output-on-failure 2>&1 | tee "$out/ctest.log" || test_rc=$?
# One line per test: "  1/4 Test #12: gpu_test_kernels ......   Passed    1.2 sec".
results=$(grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$out/ctest.log" || true)
count() { if [[ -z $results ]]; then echo 0; else grep -cE "$1" <<< "$results" || true; fi; }
passed=$(count ' Passed ')
skipped=$(count '\*\*\*Skipped|Not Run')
total=$(if [[ -z $results ]]; then echo 0; else wc -l <<< "$results"; fi)
failed=$((total - passed - skipped))
# Entries that need more GPUs than this machine has (gpu_test_nccl_multi_gpu needs 2)
# say so and are skipped by design; any other skip on a GPU machine is a fault.
expected_skips=0
for t in $(grep -E '\*\*\*Skipped|Not Run' <<< "$results" | sed -n 's/.*Test *#[0-9]*: \([^ ]*\) .*/\1/p'); do
  # The entry's output in ctest's log: from "Testing: <name>" to "<end of output>".
  awk -v t="$t" '$0 ~ ("Testing: " t "$") {on = 1} on {print} on && /<end of output>/ {exit}' \
    "$build/Testing/Temporary/LastTest.log" 2>/dev/null | grep -q "SKIPPED: needs [0-9]* GPUs" &&
    expected_skips=$((expected_skips + 1))
done

# --- the benchmark ---
bench=$build/bench/bench_cuda
bench_status="skipped (DTENSOR_GPU_CHECK_SKIP_BENCH=1)"
bench_rc=0
if [[ ${DTENSOR_GPU_CHECK_SKIP_BENCH:-0} != 1 ]]; then
  if [[ -x $bench ]]; then
    say "running $bench"
    "$bench" --benchmark_out="$out/bench_cuda.json" --benchmark_out_format=json 2>&1 |
      tee "$out/bench_cuda.txt" || bench_rc=$?
    if ((bench_rc == 0)); then
      bench_status="$out/bench_cuda.txt (console), $out/bench_cuda.json (JSON)"
    else
      bench_status="FAILED (exit $bench_rc; $out/bench_cuda.txt)"
    fi
  else
    bench_rc=1
    bench_status="FAILED: $bench was not built (Google Benchmark missing? see $out/configure.log)"
  fi
fi

# --- summary ---
cat << EOF

================================ gpu_check summary ================================
GPU            $gpu_name (sm_$cc, $(field memory_gib) GiB, $(field devices) device(s))
driver         ${smi_driver:-unknown (no nvidia-smi)}; supports CUDA $(field driver_cuda)
CUDA           runtime $(field runtime_cuda), nvcc $nvcc_version; built for architectures $archs
NCCL           $nccl
GPU tests      $passed passed, $failed failed, $skipped skipped, $expected_skips of them for want of GPUs (of $total; log $out/ctest.log)
bench_cuda     $bench_status
===================================================================================
EOF
((total > 0)) || die 1 "no GPU test is registered in $build (ctest -L gpu found none): see $out/configure.log"
((failed == 0 && test_rc == 0)) || die 1 "$failed GPU test(s) failed (ctest exit $test_rc): see the output above"
((skipped == expected_skips)) ||
  die 1 "$((skipped - expected_skips)) GPU test(s) were skipped although a GPU was found: see $out/ctest.log"
((bench_rc == 0)) || die 1 "bench_cuda failed"
echo "gpu_check: OK"
