// The compiled MPI runtime (dtensor::runtime_mpi): as src/compiled_runtime.cpp, for the
// classes of the MPI runtime. Built with DTENSOR_COMPILED_RUNTIME, as every TU linked
// with it.
#ifndef DTENSOR_COMPILED_RUNTIME
#error "build the compiled MPI runtime, and every TU linked with it, with -DDTENSOR_COMPILED_RUNTIME"
#endif

// The launchers of dtensor/comm/mpi/run_mpi.hpp become definitions here.
#define DTENSOR_COMPILED_RUNTIME_MPI_SOURCE

#include "dtensor/comm/mpi/mpi_all_reduce.hpp"
#include "dtensor/comm/mpi/mpi_all_reduce_exchange.hpp"
#include "dtensor/comm/mpi/mpi_comm.hpp"
#include "dtensor/comm/mpi/mpi_exchange.hpp"
#include "dtensor/comm/mpi/run_mpi.hpp"

namespace dtensor {
void MpiComm::compiled_runtime_key_MpiComm() const {}
namespace detail {
void MpiExchange::compiled_runtime_key_MpiExchange() const {}
void MpiAllReduce::compiled_runtime_key_MpiAllReduce() const {}
void MpiAllReduceByExchange::compiled_runtime_key_MpiAllReduceByExchange() const {}
}  // namespace detail
}  // namespace dtensor
