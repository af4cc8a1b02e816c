// rfft takes a real tensor: a complex one is refused with one message (fft takes it).
#include <dtensor/spectral.hpp>
using namespace dtensor;
using spectral::Dims;
#ifndef DTENSOR_COMPILE_OK
void f(const DTensor<std::complex<double>, 2, Shard<0>>& x) { (void)spectral::rfft<Dims<1>>(x); }
#else
void f(const DTensor<std::complex<double>, 2, Shard<0>>& x) { (void)spectral::fft<Dims<1>>(x); }
#endif
