#pragma once
// DTENSOR_HOST_DEVICE marks a function that nvcc compiles for both the host and the
// device (the elementwise table, the counter generator), and that plain C++ compilers
// see as an ordinary function.
#if defined(__CUDACC__)
#define DTENSOR_HOST_DEVICE __host__ __device__
#else
#define DTENSOR_HOST_DEVICE
#endif
