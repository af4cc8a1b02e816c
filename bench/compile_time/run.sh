#!/usr/bin/env bash
# Front-end time of contractions on meshes of 1 to 4 dims: compiles
# bench/compile_time/contraction.cpp with -fsyntax-only -ftime-report for
# DTENSOR_CT_MESH_DIMS = 0 (baseline: the includes) .. 4, six matmuls each, and prints
# the compiler's user time and its "constant expression evaluation" time (where the
# placement rules and plans run).
#   bench/compile_time/run.sh [include-dir] [extra compiler flags...]
# The include dir defaults to this checkout's include/; give another checkout's to
# compare before and after. Run it on an otherwise idle machine: user time is less
# sensitive to load than wall time, but not immune to it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
inc=${1:-$here/../../include}
shift || true
cxx=${CXX:-g++}
eigen=$(pkg-config --cflags-only-I eigen3 2>/dev/null || echo -I/usr/include/eigen3)
printf '%-10s %10s %12s %s\n' "mesh dims" "user s" "constexpr s" "status"
for d in 0 1 2 3 4; do
  out=$(LC_ALL=C "$cxx" -std=c++20 -fsyntax-only -ftime-report -I"$inc" $eigen "$@" \
        -DDTENSOR_CT_MESH_DIMS=$d "$here/contraction.cpp" 2>&1) && status=ok || status=FAILED
  user=$(grep -E '^ TOTAL' <<<"$out" | awk '{print $3}')
  cexpr=$(grep -E 'constant expression evaluation' <<<"$out" | awk -F: '{print $2}' | awk '{print $1}')
  [[ $status == FAILED ]] && status="FAILED: $(grep -m1 -o 'error: .*' <<<"$out" | cut -c1-90)"
  printf '%-10s %10s %12s %s\n' "$d" "${user:-?}" "${cexpr:-?}" "$status"
done
