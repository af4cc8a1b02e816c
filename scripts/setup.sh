#!/usr/bin/env bash
# Installs dtensor's build and test dependencies from Debian packages. Idempotent:
# packages already present are left alone, and nothing is fetched when all are.
#   scripts/setup.sh            build, test, MPI and benchmark libraries
#   scripts/setup.sh --bench    also valgrind and matplotlib, for bench/callgrind.sh and bench/plot.py,
#                               and PETSc with pkg-config, for bench_poisson (bench/poisson.sh)
set -euo pipefail

packages=(
  cmake g++ make            # build
  libeigen3-dev             # CPU compute
  doctest-dev               # tests
  libopenmpi-dev openmpi-bin  # the MPI runtime (optional at configure time)
  libbenchmark-dev          # bench/ (optional)
)
if [[ "${1:-}" == "--bench" ]]; then packages+=(valgrind python3-matplotlib petsc-dev pkg-config); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all dependencies are installed"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
