// Front-end cost of the contraction rule: matmul instantiated for several placement
// combinations on a mesh of DTENSOR_CT_MESH_DIMS dims (0: the includes and the local
// product alone, the baseline to subtract). Compiled with -fsyntax-only by
// bench/compile_time/run.sh; DTENSOR_CT_ONE keeps only the first combination.
#include <dtensor/dtensor.hpp>

#ifndef DTENSOR_CT_MESH_DIMS
#define DTENSOR_CT_MESH_DIMS 2
#endif

using namespace dtensor;

namespace {

// One matmul of operands placed X and Y: its rule, the operands' redistributions, its body.
template <class X, class Y>
void use(const X& x, const Y& y) {
  (void)matmul(x, y);
}

using R = Replicate;
using S0 = Shard<0>;
using S1 = Shard<1>;
using P = Partial<Sum>;

}  // namespace

// The local product (Eigen) is instantiated once whatever the mesh: in the baseline too.
#if __has_include(<dtensor/compute/gemm.hpp>)
template void dtensor::compute::gemm_ex<double>(Device, const GemmDims&, double, const double*, const double*, double,
                                                double*);
#else  // before compute/gemm.hpp
template void dtensor::compute::gemm<double>(Device, const double*, const double*, double*,
                                             const std::array<int64_t, 4>&);
#endif

#if DTENSOR_CT_MESH_DIMS == 1
template void use(const DTensor<double, 2, S0>&, const DTensor<double, 2, R>&);
#ifndef DTENSOR_CT_ONE
template void use(const DTensor<double, 2, R>&, const DTensor<double, 2, S1>&);
template void use(const DTensor<double, 2, S1>&, const DTensor<double, 2, S0>&);
template void use(const DTensor<double, 2, P>&, const DTensor<double, 2, R>&);
template void use(const DTensor<double, 2, S1>&, const DTensor<double, 2, S1>&);
template void use(const DTensor<double, 2, S0>&, const DTensor<double, 2, S0>&);
#endif
#elif DTENSOR_CT_MESH_DIMS == 2
template void use(const DTensor<double, 2, S0, R>&, const DTensor<double, 2, R, S1>&);
#ifndef DTENSOR_CT_ONE
template void use(const DTensor<double, 2, S1, S0>&, const DTensor<double, 2, S0, S1>&);
template void use(const DTensor<double, 2, S0, S1>&, const DTensor<double, 2, R, S0>&);
template void use(const DTensor<double, 2, P, S0>&, const DTensor<double, 2, R, R>&);
template void use(const DTensor<double, 2, S0, S0>&, const DTensor<double, 2, S1, P>&);
template void use(const DTensor<double, 2, S1, R>&, const DTensor<double, 2, S0, S1>&);
#endif
#elif DTENSOR_CT_MESH_DIMS == 3
template void use(const DTensor<double, 2, S0, R, R>&, const DTensor<double, 2, R, S1, R>&);
#ifndef DTENSOR_CT_ONE
template void use(const DTensor<double, 2, S1, S0, R>&, const DTensor<double, 2, S0, S1, S0>&);
template void use(const DTensor<double, 2, S0, S1, P>&, const DTensor<double, 2, R, S0, R>&);
template void use(const DTensor<double, 2, P, S0, S1>&, const DTensor<double, 2, R, R, S0>&);
template void use(const DTensor<double, 2, S0, S0, R>&, const DTensor<double, 2, S1, P, S1>&);
template void use(const DTensor<double, 2, S1, R, S0>&, const DTensor<double, 2, S0, S1, R>&);
#endif
#elif DTENSOR_CT_MESH_DIMS == 4
template void use(const DTensor<double, 2, S0, R, R, S1>&, const DTensor<double, 2, R, S1, R, S1>&);
#ifndef DTENSOR_CT_ONE
template void use(const DTensor<double, 2, S1, S0, R, R>&, const DTensor<double, 2, S0, S1, S0, R>&);
template void use(const DTensor<double, 2, S0, S1, P, R>&, const DTensor<double, 2, R, S0, R, S1>&);
template void use(const DTensor<double, 2, P, S0, S1, R>&, const DTensor<double, 2, R, R, S0, S0>&);
template void use(const DTensor<double, 2, S0, S0, R, S1>&, const DTensor<double, 2, S1, P, S1, R>&);
template void use(const DTensor<double, 2, S1, R, S0, S0>&, const DTensor<double, 2, S0, S1, R, R>&);
#endif
#endif
