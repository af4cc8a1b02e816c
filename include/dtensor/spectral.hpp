#pragma once
// Spectral operators on sharded grids (needs FFTW: libfftw3-dev, the CMake target
// dtensor::fftw): distributed fft, ifft, rfft, irfft with their backward passes
// (spectral/fft.hpp), planned at compile time (spectral/fft_plan.hpp); the periodic
// Poisson solver (solvers/spectral_poisson.hpp).
// Not included by dtensor.hpp: FFTW is optional.
#include "dtensor/dtensor.hpp"
#include "dtensor/solvers/spectral_poisson.hpp"
#include "dtensor/spectral/fft.hpp"
