#!/usr/bin/env bash
# The test command of README.md and CI: installs the dependencies, builds and runs
# every test, then builds a focused subset under sanitizers and runs it:
#   AddressSanitizer + UndefinedBehaviorSanitizer: runtime, layout, redistribution,
#     construction and fault tests (build-asan/)
#   the checkpoint reader's fuzz target, a minute under ASan+UBSan (build-fuzz/)
#   ThreadSanitizer: the in-process runtime's tests (build-tsan/)
# Any sanitizer report fails the run. DTENSOR_SKIP_SANITIZERS=1 skips that part.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${DTENSOR_JOBS:-2}

./scripts/setup.sh
# Nothing runs the CUDA kernels here (no GPU): compile them for the oldest supported
# architecture and as PTX for the newest (kernels.cu: 39 s instead of 101 s for the
# default five targets), unless the caller chose (CUDAARCHS). scripts/gpu_check.sh
# builds for its GPU.
export CUDAARCHS=${CUDAARCHS:-80-real;90-virtual}
# The examples are built at -Og here (CI checks what they print, not their speed), and
# where no GPU is visible the code only a GPU runs is built at -O0: it must compile and
# link, nothing runs it (CMakeLists.txt: DTENSOR_EXAMPLE_OPT, DTENSOR_GPU_CODE_OPT).
gpu_code_opt=-O0
nvidia-smi -L 2> /dev/null | grep -q '^GPU' && gpu_code_opt=
# GCC collects garbage less often (CMakeLists.txt, DTENSOR_GCC_HEAP_MB): 9 to 19% off each
# compile for up to 5 GiB per compiler; with more jobs than about one per 6 GiB of memory,
# set DTENSOR_GCC_HEAP_MB= (empty) for GCC's default.
heap_mb=${DTENSOR_GCC_HEAP_MB-1024}
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDTENSOR_EXAMPLE_OPT=-Og -DDTENSOR_GPU_CODE_OPT="$gpu_code_opt" \
  -DDTENSOR_GCC_HEAP_MB="$heap_mb"
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
# The GPU tests (label gpu) pass only on a GPU; elsewhere ctest lists them as skipped.
if grep -q "SKIPPED: no CUDA device" build/Testing/Temporary/LastTest.log 2>/dev/null; then
  echo "== GPU tests (ctest -L gpu) were SKIPPED: this machine has no CUDA device; run them on a GPU machine"
fi

[[ "${DTENSOR_SKIP_SANITIZERS:-0}" == 1 ]] && exit 0

asan_tests=(test_tensor test_region test_comm test_faults test_p2p test_nonblocking test_grad_buckets test_halo test_solvers test_mesh test_layout test_factory test_redistribute_1d test_device_emulated test_emulator test_kernels_host test_compute test_compute_conv test_conv test_nn_mlp test_nn_layers test_checkpoint test_checkpoint_hostile test_multigrid test_nn_fsdp test_reduced_precision test_nn_mixed_precision)
tsan_tests=(test_hash_worker test_comm test_faults test_p2p test_nonblocking test_grad_buckets test_halo test_mesh test_redistribute_1d test_device_emulated test_emulator test_nn_mlp test_nn_cnn)
list() { local IFS=';'; echo "$*"; }

echo "== sanitizers: address,undefined on ${asan_tests[*]}"
# -O0: GCC at -O1 on UBSan-instrumented code takes 2.7 times as long to compile
# (most of this script's time). ASan checks every access at -O0; of UBSan's checks
# only object-size needs the optimizer, and ASan covers those overflows.
# Four UBSan checks are left out: alignment, vptr, null and pointer-overflow
# instrument every member access, cast and pointer step, and made up half of this
# build's time (test_solvers.cpp: 80 s with them, 40 s without, ASan alone 42 s).
# ASan reports a null dereference and an access through an overflowed pointer
# itself; x86 tolerates misaligned loads; the classes behind virtual calls (Comm, the
# device table) are few and tested directly. -g1: line tables are all a sanitizer's
# stack trace needs.
# The sanitizer builds compute host products with Eigen (DTENSOR_WITH_BLAS=OFF) and float
# convolutions with dtensor's own code (DTENSOR_WITH_ONEDNN=OFF): the main build takes
# OpenBLAS and oneDNN, so CI runs both paths of each; 16-bit products and layers here go
# through the conversion path (test_reduced_precision, test_nn_mixed_precision).
# test_device_emulated (the device paths on the emulated device) is built there from the
# cases that drive the runtime, device memory and the emulated device's stream threads;
# the model-level cases (training, pipeline, spectral, solvers, memory plan, loader) go
# through the same paths, took about 120 s of -Og compiling per build, and run in the
# main build (tests/CMakeLists.txt: DTENSOR_DEVICE_CASES).
san_device_cases=(test_device_dtensor test_device_collectives test_device_halo test_device_compute
  test_device_float16 test_device_nn_image test_device_checkpoint)
san_flags=(-DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DDTENSOR_BUILD_EXAMPLES=OFF -DDTENSOR_WITH_CUDA=OFF
  -DDTENSOR_WITH_BLAS=OFF -DDTENSOR_WITH_ONEDNN=OFF -DDTENSOR_GCC_HEAP_MB="$heap_mb"
  -DDTENSOR_DEVICE_CASES="$(list "${san_device_cases[@]}")")
cmake -S . -B build-asan "${san_flags[@]}" -DDTENSOR_SANITIZE=address,undefined -DDTENSOR_TEST_OPT=-O0 \
  -DDTENSOR_NO_SANITIZE=alignment,vptr,null,pointer-overflow -DDTENSOR_TEST_ONLY="$(list "${asan_tests[@]}")" > /dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"

# The checkpoint reader's fuzz target (tests/fuzz/) for a minute under ASan+UBSan: as a
# libFuzzer binary where clang has libFuzzer (coverage-guided), else under the seeded
# mutation driver in the GCC sanitizer build.
fuzz_flags=(-DDTENSOR_SANITIZE=address,undefined -DDTENSOR_TEST_OPT=-O1 -DDTENSOR_TEST_PCH=OFF
  -DDTENSOR_TEST_ONLY=fuzz_checkpoint -DDTENSOR_FUZZ_SECONDS=60)
if command -v clang++ > /dev/null && echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
  clang++ -x c++ -fsanitize=fuzzer,address,undefined - -o /tmp/dtensor-libfuzzer-probe 2> /dev/null; then
  echo "== fuzz: the checkpoint reader, libFuzzer (clang) with address,undefined, 60 s"
  cmake -S . -B build-fuzz "${san_flags[@]}" -DCMAKE_CXX_COMPILER=clang++ "${fuzz_flags[@]}" > /dev/null
else
  echo "== fuzz: the checkpoint reader, seeded mutations (no libFuzzer) with address,undefined, 60 s"
  cmake -S . -B build-fuzz "${san_flags[@]}" "${fuzz_flags[@]}" > /dev/null
fi
cmake --build build-fuzz -j"$jobs" --target fuzz_checkpoint
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-fuzz --output-on-failure

echo "== sanitizers: thread on ${tsan_tests[*]}"
cmake -S . -B build-tsan "${san_flags[@]}" -DDTENSOR_SANITIZE=thread \
  -DDTENSOR_TEST_ONLY="$(list "${tsan_tests[@]}")" > /dev/null
cmake --build build-tsan -j"$jobs"
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir build-tsan --output-on-failure -j"$jobs"
