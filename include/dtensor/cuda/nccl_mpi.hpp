#pragma once
// nccl_from_mpi: an NcclComm over the ranks of an MPI communicator, for programs
// launched with mpirun that keep their tensors on GPUs. Rank 0 makes NCCL's unique
// id and MPI broadcasts it; the NCCL ranks are the MPI ranks. Needs MPI (this
// header includes <mpi.h>); link MPI, cudart and NCCL.
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "dtensor/comm/mpi/mpi_comm.hpp"
#include "dtensor/cuda/nccl_comm.hpp"

namespace dtensor {

// Collective over `comm`: every rank calls it. `device` -1 picks the rank's index
// among the ranks on its node (MPI_Comm_split_type SHARED) modulo the number of
// GPUs it sees, the usual one GPU per rank. A rank that cannot take part (no GPU,
// a device that does not exist, ncclGetUniqueId failing on rank 0) makes every rank
// throw, instead of leaving the others waiting in NCCL's initialisation.
inline std::unique_ptr<NcclComm> nccl_from_mpi(MPI_Comm comm, int device = -1, NcclOptions options = {}) {
  int rank = 0, size = 0;
  detail::check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  detail::check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");

  std::string problem;
  const int devices = cuda::device_count();
  if (device < 0) {
    MPI_Comm node;
    detail::check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
                      "MPI_Comm_split_type");
    int local_rank = 0;
    const int rc = MPI_Comm_rank(node, &local_rank);
    MPI_Comm_free(&node);
    detail::check_mpi(rc, "MPI_Comm_rank");
    if (devices == 0) problem = "sees no CUDA device";
    else device = local_rank % devices;
  } else if (device >= devices) {
    problem = detail::cat("was given CUDA device ", device, " but sees ", devices, " CUDA device",
                          devices == 1 ? "" : "s");
  }
  std::vector<int> ok(static_cast<std::size_t>(size));
  int mine = problem.empty() ? 1 : 0;
  detail::check_mpi(MPI_Allgather(&mine, 1, MPI_INT, ok.data(), 1, MPI_INT, comm), "MPI_Allgather");
  for (int k = 0; k < size; ++k)
    if (!ok[k])
      throw CudaError(k == rank ? detail::cat("dtensor: nccl_from_mpi: rank ", rank, " ", problem)
                                : detail::cat("dtensor: nccl_from_mpi: rank ", k,
                                              " has no usable CUDA device, so no rank can join the NCCL "
                                              "communicator (rank ", k, " reports why)"));

  struct {
    int ok;
    ncclUniqueId id;
  } msg{};
  std::string why;
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&msg.id);
    msg.ok = r == ncclSuccess ? 1 : 0;
    if (!msg.ok) why = cuda::detail::nccl_error_text(r, nullptr);
  }
  detail::check_mpi(MPI_Bcast(&msg, static_cast<int>(sizeof msg), MPI_BYTE, 0, comm), "MPI_Bcast");
  if (!msg.ok)
    throw CommError(rank == 0 ? detail::cat("dtensor: nccl_from_mpi: ncclGetUniqueId failed: ", why)
                              : std::string("dtensor: nccl_from_mpi: ncclGetUniqueId failed on rank 0"));
  return NcclComm::from_unique_id(msg.id, rank, size, device, options);
}

// The same over an MpiComm's ranks (e.g. the one run_mpi passes to the program).
inline std::unique_ptr<NcclComm> nccl_from_mpi(const MpiComm& comm, int device = -1, NcclOptions options = {}) {
  return nccl_from_mpi(comm.native(), device, options);
}

}  // namespace dtensor
