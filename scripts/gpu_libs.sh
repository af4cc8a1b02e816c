# Sourced by a bundle's run.sh (scripts/gpu_run_bundle.sh) and scripts/gpu_compare.sh:
# gpu_libpath DIR prints the library path for the bundle's binaries: DIR/lib (the
# non-CUDA libraries the bundle carries), then the directories of CUDA's libraries
# found on this machine: the toolkit, the system, or PyTorch's wheels
# (DTENSOR_BUNDLE_LIBS: directories searched first). A library not found is said on
# stderr.
gpu_libpath() {
  local path=$1/lib lib f
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcufft.so.12 libcudnn.so.9 libnccl.so.2 libnvrtc.so.13; do
    f=$(find ${DTENSOR_BUNDLE_LIBS:-} /usr/local/cuda/ /usr/lib /usr/local/lib /opt -name "$lib" 2>/dev/null | head -1)
    if [[ -z $f ]]; then
      echo "== $lib not found on this machine" >&2
    elif [[ :$path: != *:$(dirname "$f"):* ]]; then
      path=$path:$(dirname "$f")
    fi
  done
  echo "$path"
}
