// Trains the language model of train_gpt, four transformer blocks deep, cut into four
// pipeline stages, and beside it the same layers on one rank, and compares the losses
// step by step.
//
//   stages  0: token embedding + positions + block   1: block   2: block
//           3: block + final LayerNorm + vocabulary-parallel head
//   model   hidden 64, 4 heads, causal, RoPE, GELU MLP of 256; float32
//   data    train_gpt's (gpt_tokens.hpp); batch 8 x 32 tokens in 4 micro-batches
//   loss    cross-entropy on the last stage, AdamW lr 3e-3, 30 steps
//
// Three meshes (nn::Pipeline, nn/pipeline.hpp):
//   PP            4 ranks, a 1-D mesh: one stage per rank, 1F1B, then zero-bubble H1
//                 (each backward as an input-gradient step, the weight gradients later)
//   PP x TP       2x2: 2 pipeline ranks with 2 stages each (interleaved 1F1B: stages
//                 0 and 2 on the first, 1 and 3 on the second), each stage's heads,
//                 MLP features and vocabulary over the other mesh dim
//   PP x DP x TP  2x2x2: the same, the batch also over a data-parallel dim
// The schedule is a table the compiler checks (every send has its receive, nothing
// deadlocks) and prints (explain: ranks x time units and the bubble); each step counts
// the activations and gradients a rank sends against it, and its collectives against the
// stages' plans (Pipeline::step_collectives). Each run prints the memory plan's
// bound per pipeline rank (Pipeline::memory_plan, nn/pipeline_memory.hpp).
//
// Usage:
//   build/examples/train_gpt_pipeline                      PP (1F1B, ZB-H1) and PP x TP on 4 threads, then PP x DP x TP on 8
//   mpirun -np 4 build/examples/train_gpt_pipeline_mpi     PP (1F1B, ZB-H1) and PP x TP
//   mpirun -np 8 build/examples/train_gpt_pipeline_mpi     PP x DP x TP
// Exits 1 if a loss differs from the single-rank run's by more than 1e-5 relative, or
// if a rank's messages or collectives differ from the plan's.
#include <dtensor/nn.hpp>
#include <dtensor/nn/pipeline.hpp>
#ifdef DTENSOR_WITH_MPI
#include <dtensor/mpi.hpp>
#endif

#include <atomic>
#include <cstdio>

#include "gpt_pipeline.hpp"

using namespace dtensor;
using namespace gpt_pipeline;

// PP on a 1-D mesh, 1F1B and zero-bubble H1 (train_gpt_pipeline_1d.cpp), and PP x DP x
// TP on eight ranks (train_gpt_pipeline_3d.cpp): each pipeline's instantiation is a
// compile of its own.
bool one_dimensional(Comm& comm);
bool eight_ranks(Comm& comm);

namespace {

bool four_ranks(Comm& comm) {
  const bool pp = one_dimensional(comm);
  using PpTp = nn::PipelineConfig<2, 0, pipeline::Interleaved1F1B<2>, kMicrobatches>;
  const bool pp_tp = compare<Tp, PpTp, std::array<int, 2>{2, 2}>(
      comm, "PP x TP: two stages per pipeline rank (interleaved 1F1B), TP over mesh dim 1");
  return pp && pp_tp;
}

}  // namespace

int main(int argc, char** argv) {
  std::atomic<int> failed = 0;  // written by every rank's thread in-process
  auto check = [&](bool ok) {
    if (!ok) failed = 1;
  };
#ifdef DTENSOR_WITH_MPI
  if (launched_by_mpi()) {
    run_mpi(argc, argv, [&](Comm& world) {
      if (world.size() == 4) check(four_ranks(world));
      else if (world.size() == 8) check(eight_ranks(world));
      else {
        if (world.rank() == 0) std::printf("train_gpt_pipeline: run with 4 or 8 processes\n");
        check(false);
      }
    });
    return failed;
  }
#endif
  run_threads(4, [&](Comm& comm) { check(four_ranks(comm)); });
  run_threads(8, [&](Comm& comm) { check(eight_ranks(comm)); });
  return failed;
}
