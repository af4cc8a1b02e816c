#pragma once
// dtensor with the MPI runtime: everything in dtensor.hpp, plus MpiComm, run_mpi and
// run(argc, argv, n, fn). Link MPI (the CMake target dtensor::mpi does).
#include "dtensor/comm/mpi/mpi_comm.hpp"
#include "dtensor/comm/mpi/run_mpi.hpp"
#include "dtensor/dtensor.hpp"
