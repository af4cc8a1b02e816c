#!/usr/bin/env bash
# Installs dtensor's build and test dependencies from Debian packages. Idempotent:
# packages already present are left alone, and nothing is fetched when all are.
#   scripts/setup.sh            build, test, MPI and benchmark libraries
#   scripts/setup.sh --bench    also valgrind and matplotlib, for bench/callgrind.sh and bench/plot.py,
#                               and PETSc with pkg-config, for bench_poisson (bench/poisson.sh)
#   scripts/setup.sh --paraview also ParaView and its Python modules (0.5 GB), for the
#                               paraview_open test (tests/paraview_open.py; skipped without)
set -euo pipefail

packages=(
  cmake g++ make            # build
  libeigen3-dev             # CPU compute
  libopenblas-dev           # host products (optional at configure time: Eigen without it)
  libdnnl-dev               # host float convolutions, oneDNN (optional at configure time)
  doctest-dev               # tests
  libopenmpi-dev openmpi-bin  # the MPI runtime (optional at configure time)
  libbenchmark-dev          # bench/ (optional)
  nlohmann-json3-dev        # checkpoints' JSON (dtensor/io.hpp; optional at configure time)
  libxxhash-dev             # checkpoints' checksums (dtensor/io.hpp; optional at configure time)
  python3-numpy             # the Python interop test of checkpoints (tests/checkpoint_read.py)
  libhdf5-openmpi-dev pkg-config  # parallel HDF5 for dtensor/io/hdf5.hpp (optional at configure time)
  python3-h5py              # the HDF5 interop and XDMF tests (tests/hdf5_interop.py; skipped without it)
  libfftw3-dev              # local transforms of dtensor/spectral.hpp (optional at configure time)
  ccache                    # compiler cache, used by CMake where found (rebuilds after a pull)
)
if [[ "${1:-}" == "--bench" ]]; then packages+=(valgrind python3-matplotlib petsc-dev pkg-config libfftw3-mpi-dev); fi
if [[ "${1:-}" == "--paraview" ]]; then packages+=(paraview python3-paraview); fi

# safetensors and xxhash are not packaged by Debian (bookworm): pip installs them,
# with numpy, for the python3 that ctest runs. Failure is not fatal: without numpy or
# safetensors that one test is skipped; without xxhash it checks the checksums with
# its own (slower) Python XXH3 and XXH64.
python_interop() {
  python3 -c "import numpy, safetensors, xxhash" 2>/dev/null && return 0
  # Bounded: a machine without network must not stall here.
  local pip=(timeout 180 python3 -m pip install --quiet --retries 1 --timeout 20)
  "${pip[@]}" numpy safetensors xxhash 2>/dev/null ||
    "${pip[@]}" --break-system-packages numpy safetensors xxhash 2>/dev/null ||
    echo "setup: could not install numpy, safetensors and xxhash with pip; the checkpoint interop test may be skipped"
}

# The cuDNN frontend (header-only C++ for cuDNN's graph API: fused attention on a GPU)
# ships as a PyPI wheel whose include/ CMake finds beside python3's packages. Only
# where the CUDA toolkit is; failure is not fatal (fused attention is then not built).
cudnn_frontend() {
  [[ -x /usr/local/cuda/bin/nvcc ]] || command -v nvcc > /dev/null || return 0
  python3 -c "import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['platlib'], 'include', 'cudnn_frontend.h')))" 2>/dev/null && return 0
  local pip=(timeout 180 python3 -m pip install --quiet --retries 1 --timeout 20)
  "${pip[@]}" nvidia-cudnn-frontend 2>/dev/null ||
    "${pip[@]}" --break-system-packages nvidia-cudnn-frontend 2>/dev/null ||
    echo "setup: could not install nvidia-cudnn-frontend with pip; fused attention on a GPU will not be built"
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all dependencies are installed"
  python_interop
  cudnn_frontend
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
python_interop
cudnn_frontend
