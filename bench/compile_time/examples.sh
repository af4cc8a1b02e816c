#!/usr/bin/env bash
# What a user's build of each example costs: g++ -O2 on one TU, as a plain Release
# build of a program like it would compile it; with dtensor's headers precompiled
# (dtensor_precompile_headers: dtensor.hpp and nn.hpp); with them precompiled and the
# runtimes compiled once elsewhere (dtensor::runtime_mpi: -DDTENSOR_COMPILED_RUNTIME,
# src/compiled_runtime*.cpp not counted); and the front end alone (-fsyntax-only).
# Prints the compiler's user time in seconds. Each .cpp of examples/ is a TU (an
# example of several TUs, such as train_gpt, is listed TU by TU).
#   bench/compile_time/examples.sh [example ...]   (default: every example TU)
#   bench/compile_time/examples.sh --built [TU ...]
#     only -O2 against the compiled runtime (dtensor::runtime, or runtime_mpi where
#     mpicxx is), no PCH, redistribute_tour header-only: the runtime each TU is built
#     against in examples/CMakeLists.txt, at -O2 (not the build's -Og or -march flags);
#     the goal's measure
# Run it on an otherwise idle machine: user time is less sensitive to load than wall
# time, not immune to it (on the 2-core VM another compile beside it adds about 40%).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$here/../..
cxx=${CXX:-g++}
flags=(-std=c++20 -O2 -DNDEBUG -I"$root/include" -I"$root/examples")
flags+=($(pkg-config --cflags-only-I eigen3 2> /dev/null || echo -I/usr/include/eigen3))
# What dtensor's CMake targets add where the libraries are found (CMakeLists.txt).
if [[ -d /usr/include/x86_64-linux-gnu/openblas-pthread ]]; then
  flags+=(-DDTENSOR_HAVE_OPENBLAS -I/usr/include/x86_64-linux-gnu/openblas-pthread)
fi
[[ -f /usr/include/oneapi/dnnl/dnnl.hpp ]] && flags+=(-DDTENSOR_HAVE_ONEDNN)
if command -v mpicxx > /dev/null; then
  flags+=(-DDTENSOR_WITH_MPI $(mpicxx --showme:compile))
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
user_s() { /usr/bin/time -f %U "$@" 2>&1 > /dev/null | tail -1; }
if [[ "${1:-}" == "--built" ]]; then
  shift
  examples=("$@")
  [[ ${#examples[@]} -gt 0 ]] || examples=($(cd "$root/examples" && ls *.cpp | sed 's/\.cpp$//'))
  printf '%-24s %18s\n' TU "-O2, runtime s"
  for e in "${examples[@]}"; do
    runtime=-DDTENSOR_COMPILED_RUNTIME
    [[ $e == redistribute_tour ]] && runtime=-UDTENSOR_COMPILED_RUNTIME  # built header-only (examples/CMakeLists.txt)
    t=$(user_s "$cxx" "${flags[@]}" "$runtime" -c "$root/examples/$e.cpp" -o "$work/$e.o")  # set -e: a failed compile stops here
    printf '%-24s %18s\n' "$e" "$t"
  done
  exit 0
fi
# One precompiled header per mode: a PCH is only used with the macros it was made with.
mkdir -p "$work/plain" "$work/compiled"
for mode in plain compiled; do
  printf '#include <dtensor/dtensor.hpp>\n#include <dtensor/nn.hpp>\n' > "$work/$mode/pch.hpp"
done
pch_s=$(user_s "$cxx" "${flags[@]}" -x c++-header "$work/plain/pch.hpp" -o "$work/plain/pch.hpp.gch")
user_s "$cxx" "${flags[@]}" -DDTENSOR_COMPILED_RUNTIME -x c++-header "$work/compiled/pch.hpp" \
  -o "$work/compiled/pch.hpp.gch" > /dev/null
echo "precompiling dtensor.hpp + nn.hpp once: $pch_s s"
printf '%-20s %8s %8s %20s %12s\n' example "-O2 s" "PCH s" "PCH + runtime s" "front end s"
examples=("$@")
[[ ${#examples[@]} -gt 0 ]] || examples=($(cd "$root/examples" && ls *.cpp | sed 's/\.cpp$//'))
for e in "${examples[@]}"; do
  src=$root/examples/$e.cpp
  plain=$(user_s "$cxx" "${flags[@]}" -c "$src" -o "$work/$e.o")
  pch=$(user_s "$cxx" "${flags[@]}" -Winvalid-pch -include "$work/plain/pch.hpp" -c "$src" -o "$work/$e.o")
  compiled=$(user_s "$cxx" "${flags[@]}" -DDTENSOR_COMPILED_RUNTIME -Winvalid-pch -include "$work/compiled/pch.hpp" \
    -c "$src" -o "$work/$e.o")
  front=$(user_s "$cxx" "${flags[@]}" -fsyntax-only "$src")
  printf '%-20s %8s %8s %20s %12s\n' "$e" "$plain" "$pch" "$compiled" "$front"
done
