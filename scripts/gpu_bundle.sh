#!/usr/bin/env bash
# The GPU check for a GPU machine that cannot build dtensor (no Eigen, doctest or
# Google Benchmark there, and no package registry to install them from): build here,
# run there.
#   scripts/gpu_bundle.sh [bundle.tar.xz]       (default build-gpu/gpu_bundle.tar.xz)
# builds the GPU test entries (ctest -L gpu), train_cnn_cuda and bench_cuda in
# build-gpu/ with this machine's CUDA toolkit, for CUDAARCHS (default 90: H100/H200),
# and packs them with the non-CUDA libraries they load (Google Benchmark), the list
# of entries as ctest runs them (arguments, environment, time limit) and a runner.
# On the GPU machine, whose CUDA toolkit (or PyTorch's wheels) provides cuBLAS,
# cuDNN 9 and NCCL 2 of the same CUDA major version:
#   mkdir b && tar -xJf bundle.tar.xz -C b && b/run.sh [results dir] [compare]
# or, through the device tool, scripts/gpu_session.sh (a part per call, under a
# deadline, its files in $OUT):
#   scripts/gpu_bundle.sh .gpu/bundle.tar.xz          (here; .gpu/ in .git/info/exclude)
#   run: scripts/gpu_session.sh .gpu/bundle.tar.xz tests 540      (carry: .gpu)
#   run: scripts/gpu_session.sh .gpu/bundle.tar.xz compare 540    (carry: .gpu)
# runs every entry, train_cnn_cuda and bench_cuda, with "compare" (or
# DTENSOR_GPU_COMPARE=1) then dtensor against PyTorch on the same GPU
# (scripts/gpu_compare.sh: bench_cuda_attention where this tree builds it,
# bench/gpu_torch.py, the table bench/gpu_report.py writes), and with
# DTENSOR_GPU_CHECK_SANITIZER=1 each test again under compute-sanitizer memcheck, then
# prints the summary that scripts/gpu_check.sh prints (tests passed, failed, skipped).
# Where the GPU machine can build, scripts/gpu_check.sh is the one command instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-build-gpu/gpu_bundle.tar.xz}
build=${DTENSOR_BUILD_DIR:-build-gpu}
jobs=${DTENSOR_JOBS:-$(nproc)}
export CUDAARCHS=${CUDAARCHS:-90}

mkdir -p "$build"
log=$build/gpu_bundle_configure.log
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDTENSOR_WITH_CUDA=ON -DDTENSOR_BUILD_BENCH=ON -DDTENSOR_ARCH= > "$log" ||
  { cat "$log"; exit 1; }
grep -q "dtensor: CUDA backend enabled" "$log" ||
  { echo "gpu_bundle: CMake did not enable the CUDA backend (see $log)" >&2; exit 1; }

# Every GPU test binary first: ctest names an entry's executable only once it exists.
cmake --build "$build" -j"$jobs" --target dtensor_gpu_tests train_cnn_cuda

# The entries labelled gpu, as ctest would run them: name, environment, time limit,
# executable and arguments (a tab between fields, a space within them).
entries=$(ctest --test-dir "$build" -L gpu --show-only=json-v1 | python3 -c '
import json, os, sys
for t in json.load(sys.stdin)["tests"]:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    env = " ".join(props.get("ENVIRONMENT", []))
    cmd = t["command"]
    print("\t".join([t["name"], env or "-", str(int(float(props.get("TIMEOUT", 600)))), os.path.basename(cmd[0])] + cmd[1:]))
')
# The solvers on the GPU (issue 46): the poisson examples with -device cuda, built here
# only (EXCLUDE_FROM_ALL: CI runs poisson2d's device path on the emulated device). Each
# checks second-order convergence itself and prints its time per iteration.
entries+=$'\n'"example_poisson2d_cuda"$'\t'"DTENSOR_TIMEOUT_S=120"$'\t'"300"$'\t'"poisson2d_cuda"$'\t'"-device cuda -ranks 4 -solver pcg-mg -levels 4"
entries+=$'\n'"example_poisson3d_cuda"$'\t'"DTENSOR_TIMEOUT_S=120"$'\t'"300"$'\t'"poisson3d_cuda"$'\t'"-device cuda -ranks 4 -solver pcg-mg -levels 3"
targets=$(cut -f4 <<< "$entries" | sort -u)
# The benchmarks: bench_cuda, and bench_cuda_attention where this tree has it.
benches=bench_cuda
help=$(cmake --build "$build" --target help)  # whole, not piped into grep -q: pipefail
grep -qw bench_cuda_attention <<< "$help" && benches+=" bench_cuda_attention"
cmake --build "$build" -j"$jobs" --target $targets $benches

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for t in $targets; do cp "$(find "$build" -type f -name "$t" -perm -u+x | head -1)" "$stage/bin/"; done
for b in $benches; do cp "$build/bench/$b" "$stage/bin/"; done
strip "$stage"/bin/*
printf '%s\n' "$entries" > "$stage/entries.tsv"
# Shared libraries outside the CUDA toolkit and the C/C++ runtime: carried.
ldd "$stage"/bin/* | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | libgcc_s.so* | libstdc++.so* | ld-linux*) ;;
    libcu* | libnccl* | libnv*) ;;  # CUDA's: the GPU machine's own
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
cp scripts/gpu_run_bundle.sh "$stage/run.sh"
# The comparison with PyTorch (run.sh DIR compare): its script and the Python sides.
mkdir -p "$stage/scripts" "$stage/bench"
cp scripts/gpu_libs.sh scripts/gpu_compare.sh "$stage/scripts/"
cp bench/gpu_torch.py bench/gpu_report.py "$stage/bench/"
{
  echo "dtensor $(git describe --always --dirty 2>/dev/null || echo unknown)"
  echo "built $(date -u +%FT%TZ) with $("${CUDACXX:-/usr/local/cuda/bin/nvcc}" --version | sed -n 's/.*release \([0-9.]*\).*/nvcc \1/p'), architectures $CUDAARCHS"
  sed -n 's/.*dtensor: \(cuDNN .* found\|NCCL .* found\).*/\1/p' "$log"
} > "$stage/BUILD_INFO"
mkdir -p "$(dirname "$bundle")"
# One xz stream with a dictionary larger than a binary: the test binaries share most of
# their code, which xz's default 8 MiB window does not reach across (3-4x smaller;
# unpacking needs as much memory as the dictionary).
tar -C "$stage" -cf - . | xz -9 --lzma2=preset=9,dict=192MiB > "$bundle"
size=$(stat -c %s "$bundle")
echo "gpu_bundle: $bundle ($((size >> 20)) MiB): $(wc -l < "$stage/entries.tsv") test entries, train_cnn_cuda," \
  "${benches// /, } and the comparison with PyTorch (run.sh DIR compare)"
# The device tool carries at most 64 MiB with the working tree (scripts/gpu_session.sh).
((size < 56 << 20)) || echo "gpu_bundle: warning: $((size >> 20)) MiB leaves little of the device tool's 64 MiB" \
  "for the working tree it travels with" >&2
