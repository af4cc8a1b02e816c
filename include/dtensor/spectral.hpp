#pragma once
// Spectral operators on sharded grids (needs FFTW: libfftw3-dev, the CMake target
// dtensor::fftw): distributed fft, ifft, rfft, irfft with their backward passes
// (spectral/fft.hpp), planned at compile time (spectral/fft_plan.hpp); the periodic
// Poisson solver (solvers/spectral_poisson.hpp); the Fourier layer of a Fourier neural
// operator (nn/image/spectral_conv.hpp).
// Not included by dtensor.hpp: FFTW is optional.
#include "dtensor/dtensor.hpp"
#include "dtensor/nn/image/spectral_conv.hpp"
#include "dtensor/solvers/spectral_poisson.hpp"
#include "dtensor/spectral/fft.hpp"
