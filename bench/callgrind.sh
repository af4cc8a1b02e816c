#!/usr/bin/env bash
# Instructions per operation on the dispatch path, from callgrind: stable on noisy
# machines. Each case runs twice (N1 and N2 iterations) and the difference of the
# totals is divided by N2 - N1, which cancels start-up and set-up.
#   bench/callgrind.sh            (after building bench_dispatch)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bench/bench_dispatch
n1=1000; n2=11000
count() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" --callgrind="$1" --iters="$2" 2>&1 \
          | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'; }
printf "| case | instructions per op |\n|---|---|\n"
for c in baseline replicate_to_shard identity shard_to_replicate; do
  a=$(count $c $n1); b=$(count $c $n2)
  printf "| %s | %d |\n" "$c" $(( (b - a) / (n2 - n1) ))
done
