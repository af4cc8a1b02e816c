#!/usr/bin/env bash
# dtensor's 16-bit host convolutions (bench_conv_float16: float, bfloat16 through oneDNN,
# bfloat16 and float16 by conversion) and PyTorch's conv2d in bfloat16 and float32
# (conv_torch.py), one thread each, alternated `rounds` times in the same time window;
# each program prints its best of 5 per shape and pass.
#
#   bench/conv_float16_vs_torch.sh build-bench [rounds]
set -euo pipefail
build=${1:?usage: conv_float16_vs_torch.sh BUILD_DIR [rounds]}
rounds=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
for r in $(seq "$rounds"); do
  echo "== round $r"
  "$build/bench/bench_conv_float16" 1
  python3 "$here/conv_torch.py" --dtype bfloat16 1
  python3 "$here/conv_torch.py" --dtype float32 1
done
