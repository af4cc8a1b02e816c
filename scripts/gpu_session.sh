#!/usr/bin/env bash
# One call of a lent GPU machine (the device tool: 10 minutes a command, at most 8 files
# back from $OUT, 15 minutes of device time a session): unpacks a bundle of
# scripts/gpu_bundle.sh, runs one part of it under a deadline, and leaves what it found
# in $OUT as at most three files: summary.txt (the part's output), compare.md (the table
# against PyTorch, where the part made one) and results.tar.xz (every log and JSON).
#   scripts/gpu_session.sh BUNDLE [tests|compare|all] [DEADLINE_S]
# tests:   every GPU test entry and the solver examples (run.sh without bench_cuda)
# compare: bench_cuda, bench_cuda_attention and PyTorch on the same cases, the table
#          (scripts/gpu_compare.sh)
# all:     both, as `run.sh DIR compare` runs them (over 6 minutes on an H200: split it
#          into two calls where the device time allows only one rerun)
# DEADLINE_S (default 540) bounds the part: what has not finished by then is stopped
# (its log says where), and the files are still written. Without $OUT (run by hand) the
# files go to ./gpu_session_out.
# Exit status: the part's (0: every entry passed, or the comparison ran whole), 124 past
# the deadline (137 where the part ignored the stop for 15 s and was killed), 2 for a
# missing bundle.
set -uo pipefail
bundle=${1:?usage: scripts/gpu_session.sh BUNDLE [tests|compare|all] [DEADLINE_S]}
part=${2:-tests}
deadline=${3:-540}
[[ -s $bundle ]] || { echo "gpu_session: no bundle at $bundle (scripts/gpu_bundle.sh makes one)" >&2; exit 2; }
out=${OUT:-$PWD/gpu_session_out}
mkdir -p "$out"

# Unpacked once per machine (a warm machine keeps /tmp between calls).
b=/tmp/dtensor-bundle
stamp=$(stat -c '%s %Y' "$bundle")
if [[ ! -x $b/run.sh || $(cat "$b/.stamp" 2>/dev/null) != "$stamp" ]]; then
  rm -rf "$b" && mkdir -p "$b"
  tar -xJf "$bundle" -C "$b" || { echo "gpu_session: cannot unpack $bundle" >&2; exit 2; }
  echo "$stamp" > "$b/.stamp"
fi
results=/tmp/dtensor-results/$part
rm -rf "$results" && mkdir -p "$results"

start=$SECONDS
{
  echo "== gpu_session: $part, deadline ${deadline} s; $(head -1 "$b/BUILD_INFO")"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1
  case $part in
    tests) DTENSOR_GPU_CHECK_SKIP_BENCH=1 timeout --kill-after=15 "$deadline" "$b/run.sh" "$results" ;;
    compare) timeout --kill-after=15 "$deadline" "$b/scripts/gpu_compare.sh" "$results/compare" ;;
    all) timeout --kill-after=15 "$deadline" "$b/run.sh" "$results" compare ;;
    *) echo "gpu_session: the part is tests, compare or all, not $part" >&2; exit 2 ;;
  esac
  rc=$?
  ((rc == 124 || rc == 137)) && echo "== gpu_session: stopped at the ${deadline} s deadline; the logs say what had finished"
  echo "== gpu_session: $part exit $rc in $((SECONDS - start)) s"
  exit "$rc"
} 2>&1 | tee "$out/summary.txt"
rc=${PIPESTATUS[0]}

[[ -f $results/compare/compare.md ]] && cp "$results/compare/compare.md" "$out/compare.md"
tar -C /tmp/dtensor-results -cJf "$out/results.tar.xz" "$part"
exit "$rc"
