#!/usr/bin/env bash
# dtensor's 16-bit host products (bench_gemm_float16) and PyTorch's torch.mm in
# bfloat16 and float16 (gemm_torch.py), one thread each, alternated `rounds` times in
# the same time window; each program prints its best of 5 per shape.
#
#   bench/gemm_float16_vs_torch.sh build-bench [rounds]
set -euo pipefail
build=${1:?usage: gemm_float16_vs_torch.sh BUILD_DIR [rounds]}
rounds=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
for r in $(seq "$rounds"); do
  echo "== round $r"
  "$build/bench/bench_gemm_float16"
  python3 "$here/gemm_torch.py" --dtype bfloat16
  [ "$r" = 1 ] && python3 "$here/gemm_torch.py" --dtype float16  # seconds per product: once
  python3 "$here/gemm_torch.py" --dtype float32
done
