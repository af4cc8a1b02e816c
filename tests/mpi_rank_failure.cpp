// Fault injection under mpirun -np 3; the mode is the first argument:
//   throw     rank 1 throws while ranks 0 and 2 wait in a collective
//   mismatch  rank 1 calls a barrier where the others call all_reduce
//   sizes     rank 2 contributes fewer elements to an all_gather
//   timeout   rank 1 arrives 5 s late; DTENSOR_TIMEOUT_S=1 for the others
//   early     rank 1 returns without calling the collective the others wait in
// and in the default mode (no DTENSOR_CHECK_COLLECTIVES), where the watchdogs and
// their side channel watch (comm/mpi/watchdog.hpp), under mpirun -np 4 and the default
// deadline (120 s): each must end within a few seconds, naming the rank
//   early_default        rank 1 returns early, as `early`
//   stop_default         rank 1 stops itself (SIGSTOP) before the collective
//   early_split_default  on communicators {0, 1} and {2, 3} (a split), rank 3 returns
//                        early while rank 2 waits for it (rank 1 of its communicator)
//   trust_sizes          rank 3 believes a Partial tensor has 5 elements where the
//                        others believe 4, and LayoutCheck::Trust skips the check:
//                        the all-reduce's truncated message names both ranks and counts
// and, under mpirun -np 3 with DTENSOR_TIMEOUT_S=2, what the deadline alone ends:
//   slow_default     rank 1 computes (sleeps) for 5 s: it answers its peers'
//                    questions, so they wait until the deadline
//   early_funneled   as early_default, in a program that initialised MPI itself
//                    with MPI_THREAD_FUNNELED: no side channel, said once
//   p2p       ranks 0 and 2 exchange messages with rank 1, which never posts its
//             side (it sleeps 5 s); DTENSOR_TIMEOUT_S=1 for the others
//   p2p_short rank 1 sends 3 elements where rank 0's irecv takes 4
//   p2p_long  rank 1 sends 5 elements where rank 0's irecv takes 4 (MPI truncation)
// and for non-blocking all-reduces (start_all_reduce):
//   nb_throw  rank 1 throws while ranks 0 and 2 wait on theirs
//   nb_sizes  rank 2 posts 3 elements where the others post 4
//   nb_stall  rank 1 posts, then stops itself (SIGSTOP), so its part makes no
//             progress (a rank that merely computes is progressed by its watchdog's
//             polls); the others' wait() times out (DTENSOR_TIMEOUT_S=1)
//   nb_drop   rank 1 posts and throws with its Request still in flight: its
//             destructor completes the all-reduce before the job is aborted
//   nb_bucket rank 2's bucket is cut differently though said the same
//             (SegmentCuts::Same) so that the posted counts differ: a count
//             mismatch on every rank (cuts that differ but post the same counts
//             give the right sums: each count covers the same global elements)
// Each must end the job with a message naming the failing rank and the collective
// (run_mpi's MPI_Abort), never hang; ctest checks the message.
#include <dtensor/mpi.hpp>

#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "throw";
  if (mode == "early_funneled") {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  }
  return dtensor::run_mpi(argc, argv, [&](dtensor::Comm& comm) {
    std::vector<double> v(4, 1.0);
    if (mode == "trust_sizes") {
      dtensor::DeviceMesh<1> mesh(comm);
      const int64_t n = comm.rank() == 3 ? 5 : 4;
      dtensor::Tensor<double, 1> local({n});
      auto x = dtensor::from_local<dtensor::Partial<>>(std::move(local), mesh, {n}, {}, dtensor::LayoutCheck::Trust);
      auto y = dtensor::redistribute<dtensor::Replicate>(x);  // an all-reduce of 4 or 5 elements
      if (comm.rank() != 3) std::printf("not reached\n");  // rank 3 may get through
      return;
    }
    if (mode == "early_split_default") {
      auto half = comm.split(comm.rank() / 2, comm.rank());
      if (comm.rank() == 3) return;
      dtensor::all_reduce<double>(*half, v);
      if (comm.rank() == 2) std::printf("not reached\n");
      return;
    }
    if (mode == "throw" && comm.rank() == 1) throw std::runtime_error("rank 1 gives up on purpose");
    if (mode.rfind("nb_", 0) == 0) {
      const int me = comm.rank();
      if (mode == "nb_throw" && me == 1) throw std::runtime_error("rank 1 gives up before its all-reduce");
      if (mode == "nb_bucket") {
        // Ranks 0 and 1 post 20000 and 10000 elements in place, then 2000 packed;
        // rank 2 posts 20000, then 12000: the second all-reduce's counts differ.
        std::vector<double> a(20000, 1.0), b(me == 2 ? 12000 : 10000, 1.0), c(me == 2 ? 0 : 2000, 1.0);
        const dtensor::Segment segs[] = {{a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}};
        comm.start_all_reduce(segs, dtensor::DType::Float64, dtensor::ReduceOp::Sum, dtensor::SegmentCuts::Same)
            .wait();
      } else {
        const std::size_t n = mode == "nb_sizes" && me == 2 ? 3 : 4;
        dtensor::Request r =
            comm.start_all_reduce(v.data(), v.data(), n, dtensor::DType::Float64, dtensor::ReduceOp::Sum);
        if (mode == "nb_stall" && me == 1) {
          std::raise(SIGSTOP);
          std::this_thread::sleep_for(std::chrono::seconds(30));  // as stop_default
          return;
        }
        if (mode == "nb_drop" && me == 1) throw std::runtime_error("rank 1 drops its all-reduce in flight");
        r.wait();
        comm.barrier();  // ranks 0 and 2 wait here for the job's end (nb_drop)
      }
      std::printf("not reached\n");
      return;
    }
    if ((mode == "early" || mode == "early_default" || mode == "early_funneled") && comm.rank() == 1) return;
    if (mode == "stop_default" && comm.rank() == 1) {
      std::raise(SIGSTOP);
      // mpirun may continue it while ending the job: it must not then complete the
      // all-reduce from what its dead peers had sent.
      std::this_thread::sleep_for(std::chrono::seconds(30));
      return;
    }
    if (mode == "p2p") {
      if (comm.rank() == 1) {
        std::this_thread::sleep_for(std::chrono::seconds(5));
        return;  // the job has been aborted by then
      }
      std::vector<double> in(4);
      const dtensor::SendSpec s[] = {{1, 7, v.data(), dtensor::Region::contiguous(0, 4)}};
      const dtensor::RecvSpec r[] = {{1, 7, in.data(), dtensor::Region::contiguous(0, 4)}};
      comm.start_exchange(s, r, dtensor::DType::Float64).wait();
    } else if (mode == "p2p_short" || mode == "p2p_long") {
      if (comm.rank() == 1) {
        std::vector<double> out(mode == "p2p_short" ? 3 : 5, 1.0);
        dtensor::send<double>(comm, out, 0, 3);
      } else if (comm.rank() == 0) {  // a non-blocking receive: the size is checked on arrival
        comm.irecv(v.data(), dtensor::Region::contiguous(0, 4), dtensor::DType::Float64, 1, 3).wait();
      }
      comm.barrier();
    } else if (mode == "mismatch" && comm.rank() == 1) {
      comm.barrier();
    } else if (mode == "sizes") {
      std::vector<double> in(2, 1.0), out(2 * comm.size());
      dtensor::detail::SmallVector<dtensor::StridedBlock, 16> blocks(comm.size());
      for (int k = 0; k < comm.size(); ++k) blocks[k] = dtensor::StridedBlock::contiguous(2 * k, 2);
      comm.all_gather(in.data(), dtensor::StridedBlock::contiguous(0, comm.rank() == 2 ? 1 : 2), out.data(), blocks,
                      dtensor::DType::Float64);
    } else {
      if ((mode == "timeout" || mode == "slow_default") && comm.rank() == 1)
        std::this_thread::sleep_for(std::chrono::seconds(5));
      dtensor::all_reduce<double>(comm, v);
    }
    std::printf("not reached\n");
  });
}
