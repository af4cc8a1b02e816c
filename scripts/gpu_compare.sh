#!/usr/bin/env bash
# dtensor against PyTorch on the same GPU (issue 46): runs bench_cuda (dtensor's side),
# bench_cuda_attention where it was built (the fused bf16 attention), bench/gpu_torch.py
# (PyTorch's side, the same cases) and bench/gpu_report.py, which joins them into a
# table of ratios, PyTorch time / dtensor time (above 1: dtensor faster), with issue 46's
# goal for each row.
#   scripts/gpu_compare.sh RESULTS_DIR [bench_cuda.json]
# From a bundle of scripts/gpu_bundle.sh (its binaries in bin/; run.sh DIR compare runs
# this after the tests, reusing the bench_cuda.json it wrote), or from a source tree
# with a CUDA build (binaries in $DTENSOR_BUILD_DIR/bench, default build-gpu/bench).
# A bench_cuda.json given as the second argument is used instead of running bench_cuda.
# Writes to RESULTS_DIR: compare.md (the table) and compare.json, torch.json,
# bench_cuda.json, bench_cuda_attention.json (the raw results) and each step's log.
# About 5.5 minutes on an H200 (2026-11-28: bench_cuda about 50 s, bench_cuda_attention
# 216 s, most of it building a cuDNN graph per case, PyTorch 67 s).
# Environment:
#   PYTHON                           the Python with PyTorch (default python3)
#   DTENSOR_COMPARE_TORCH_ARGS       more arguments for gpu_torch.py (e.g. --no-compile)
#   DTENSOR_COMPARE_ATTENTION_FILTER bench_cuda_attention's --benchmark_filter
#                                    (default BM_fused_attention: the cases joined, the
#                                    fused graph and the staged entry)
# Exit status: 0 when every side ran and the table was written (goals not met are in
# the table, not in the status); 1 when a side failed (the table lists what it has);
# 3 without a usable GPU.
set -uo pipefail
[[ $# -ge 1 ]] || { sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
out=$1
reuse=${2:-}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[[ -z $reuse ]] || reuse=$(cd "$(dirname "$reuse")" && pwd)/$(basename "$reuse")
cd "$root"
python=${PYTHON:-python3}

if [[ -d bin ]]; then bin=bin; else bin=${DTENSOR_BUILD_DIR:-build-gpu}/bench; fi
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1) || {
  echo "gpu_compare.sh: no usable GPU: nvidia-smi says: $gpu" >&2
  exit 3
}
# The C++ binaries get CUDA's libraries (scripts/gpu_libs.sh); PyTorch keeps this
# environment's path: it loads its own cuBLAS and cuDNN.
source scripts/gpu_libs.sh
libpath=$(gpu_libpath "$root")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "== gpu_compare.sh: GPU $gpu; results in $out"

status=0 notes=() benches=()
stage() { printf '== %-22s %s\n' "$1" "$2"; }

# dtensor: bench_cuda (or the results given), then the fused attention where built.
start=$SECONDS
if [[ -n $reuse && -s $reuse ]]; then
  [[ $reuse -ef $out/bench_cuda.json ]] || cp "$reuse" "$out/bench_cuda.json"
  stage bench_cuda "reused $reuse"
  benches+=(--bench "$out/bench_cuda.json")
elif [[ -x $bin/bench_cuda ]]; then
  LD_LIBRARY_PATH=$libpath timeout 300 "$bin/bench_cuda" --benchmark_out="$out/bench_cuda.json" \
    --benchmark_out_format=json > "$out/bench_cuda.txt" 2>&1
  rc=$?
  stage bench_cuda "exit $rc in $((SECONDS - start)) s ($out/bench_cuda.txt)"
  if ((rc == 0)); then benches+=(--bench "$out/bench_cuda.json"); else status=1; fi
else
  stage bench_cuda "not found in $bin"
  status=1
fi
start=$SECONDS
if [[ -x $bin/bench_cuda_attention ]]; then
  LD_LIBRARY_PATH=$libpath timeout 300 "$bin/bench_cuda_attention" \
    --benchmark_filter="${DTENSOR_COMPARE_ATTENTION_FILTER:-BM_fused_attention}" \
    --benchmark_out="$out/bench_cuda_attention.json" --benchmark_out_format=json > "$out/bench_cuda_attention.txt" 2>&1
  rc=$?
  stage bench_cuda_attention "exit $rc in $((SECONDS - start)) s ($out/bench_cuda_attention.txt)"
  if ((rc == 0)); then
    benches+=(--bench "$out/bench_cuda_attention.json")
  else
    status=1 notes+=(--note "attention=bench_cuda_attention failed (exit $rc): see bench_cuda_attention.txt")
  fi
else
  stage bench_cuda_attention "not built (not in $bin): the attention rows have PyTorch's side only"
  notes+=(--note "attention=bench_cuda_attention was not built into this bundle")
fi

# PyTorch: the same cases.
start=$SECONDS
read -r -a torch_args <<< "${DTENSOR_COMPARE_TORCH_ARGS:-}"
timeout 400 "$python" bench/gpu_torch.py --out "$out/torch.json" "${torch_args[@]}" > "$out/torch.txt" 2>&1
rc=$?
stage gpu_torch.py "exit $rc in $((SECONDS - start)) s ($out/torch.txt)"
torch=()
case $rc in
  0) torch=(--torch "$out/torch.json") ;;
  77) notes+=(--note "torch=PyTorch cannot be imported by $python") status=1 ;;
  *) notes+=(--note "torch=gpu_torch.py failed (exit $rc): see torch.txt") status=1 ;;
esac

build_info=()
[[ -f BUILD_INFO ]] && build_info=(--build-info BUILD_INFO)
"$python" bench/gpu_report.py "${benches[@]}" "${torch[@]}" "${notes[@]}" "${build_info[@]}" \
  --note "GPU: $gpu" --out "$out/compare.md" || status=1
[[ -f $out/compare.md ]] && cat "$out/compare.md"
exit $status
