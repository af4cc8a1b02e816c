// Trains a small decoder-only language model on a 2x2 mesh and, beside it, the same
// model on one rank, and compares the losses step by step.
//
//   model   token embedding (vocabulary 97, sharded over TP) + learned positions,
//           2 pre-norm transformer blocks (hidden 64, 4 heads, causal, RoPE, GELU MLP
//           of 256), final LayerNorm, vocabulary-parallel output head; float32
//   data    sequences of 32 tokens counting modulo 97 from a random start with a
//           stride of 1, 2 or 3 drawn per sequence: the next token is the last one
//           plus the stride the context shows (the loss falls from ln 97 = 4.57)
//   loss    cross-entropy on the vocabulary-sharded logits (loss parallel), AdamW
//           lr 3e-3, 30 steps, batch 8
//
// Four placements of the same model on a 2x2 mesh:
//   DP x TP   batch over mesh dim 0, heads and MLP features over mesh dim 1
//             (PyTorch's transformer plan)
//   FSDP x TP DP x TP with each transformer block fully sharded over mesh dim 0 as
//             one unit (nn::FullyShard<TransformerBlock>): its TP shards sharded again
//             over DP, one all-gather before it runs and one reduce-scatter of its
//             gradients (FSDP2's fully_shard per block)
//   DP x SP   the same with sequence parallelism: norms, residuals and positions on
//             sequence shards, all-gather / reduce-scatter instead of all-reduce
//   TP x CP   heads over mesh dim 0, the sequence over mesh dim 1 (context parallel):
//             every layer on its tokens, attention as a ring of key/value blocks on
//             the load-balanced layout (q, k, v moved there and back by attention)
// The compiler checks each step's plan (the all-reduces or gathers and scatters per
// block, the rings, the gradient reductions), and each run counts its collectives and
// point-to-point shifts against it.
//
// With -recompute, the DP x TP model with each transformer block recomputed
// (nn::Recompute<TransformerBlock>: a block keeps only its input from its forward to
// its backward, which runs its forward again first). The memory plan, a constant
// expression, says before the program runs that the plain model does not fit a
// per-rank budget of 1600 KiB and the recomputed one does (static_assert in train_gpt_recompute.cpp;
// tests/compile_fail/memory_over_budget.cpp is the plain model's refusal); both are
// printed, and the recomputed run trains like the single-rank run.
//
// With -bf16, mixed precision instead (FSDP2's MixedPrecisionPolicy, torchtitan's
// default): FSDP x TP with every layer fully sharded under nn::Precision<float,
// bfloat16>: float shards, AdamW state and gradient reduce-scatters, the forward and
// backward in bfloat16 (the attention core, norms' statistics and the loss in float);
// 50 steps (examples::kBf16Steps), the float run it is compared with too.
//
// The example is four translation units, at most two model configurations in each (every
// configuration compiles its layers anew): train_gpt.hpp holds the model and the run
// against one rank, train_gpt_sp_cp.cpp, train_gpt_bf16.cpp and train_gpt_recompute.cpp
// the runs named there.
//
// Usage:
//   build/examples/train_gpt [-bf16|-recompute]                  4 in-process ranks (threads)
//   mpirun -np 4 build/examples/train_gpt_mpi [-bf16|-recompute] 4 processes
// Exits 1 if a loss differs from the single-rank run's by more than 1e-5 relative
// (-bf16: 1.6e-2, PyTorch's bfloat16 rtol, and 5e-2 from the float FSDP x TP run's),
// or if the collectives or shifts counted differ from the plan.
#include "train_gpt.hpp"

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

using namespace dtensor;
using namespace train_gpt;

// The plans, checked by the compiler: per block one all-reduce over TP after each
// branch forward and one before each branch's rowwise projection backward (the
// embedding's and the head's make 5 each way); FSDP adds per block an all-gather of
// its parameters each way and a reduce-scatter of their gradients. The loss adds its
// all-reduces (max and sums over TP, the mean over DP). DP x SP and TP x CP:
// train_gpt_sp_cp.cpp.
static_assert(Tp::plan.count(nn::Phase::Forward, StepKind::AllReduce, 1) == 5 + 2 &&
                  Tp::plan.count(nn::Phase::Backward, StepKind::AllReduce, 1) == 5,
              "DP x TP: 2 all-reduces per block each way, the embedding's and the head's, the loss's 2");
static_assert(Fs::plan.count(nn::Phase::Forward, StepKind::AllGather, 0) == 2 &&
                  Fs::plan.count(nn::Phase::Backward, StepKind::AllGather, 0) == 2 &&
                  Fs::plan.count(nn::Phase::Backward, StepKind::ReduceScatter, 0) == 2 &&
                  Fs::plan.count(nn::Phase::Forward, StepKind::AllReduce, 1) == 5 + 2,
              "FSDP x TP: DP x TP's collectives over TP, and per block one all-gather of its parameters over DP "
              "each way and one reduce-scatter of their gradients");

bool train_gpt::fsdp(Comm& comm, const char* what, std::vector<float>* losses) {
  return compare<Fs>(comm, what, 1e-5, losses);
}
bool train_gpt::dp_tp_and_fsdp(Comm& comm) {
  const bool tp = compare<Tp>(comm, "DP x TP: batch over mesh dim 0, heads and MLP features over mesh dim 1");
  const bool fs = fsdp(comm, "FSDP x TP: DP x TP, each transformer block fully sharded over mesh dim 0", nullptr);
  return tp && fs;
}

int main(int argc, char** argv) {
  std::atomic<int> failed = 0;  // written by every rank's thread in-process
  bool bf16 = false;
  bool recompute = false;
  for (int i = 1; i < argc; ++i) {
    bf16 = bf16 || std::string(argv[i]) == "-bf16";
    recompute = recompute || std::string(argv[i]) == "-recompute";
  }
  if (bf16) steps = examples::kBf16Steps;
  auto program = [&](Comm& comm) {
    if (bf16 || recompute) {
      if (!(bf16 ? mixed_precision(comm) : recomputed(comm))) failed = 1;
      return;
    }
    const bool tp_fs = dp_tp_and_fsdp(comm);
    const bool sp_cp = sp_and_cp(comm);
    if (comm.rank() == 0 && tp_fs && sp_cp) std::printf("OK: the four placements train like the single-rank run\n");
    if (!(tp_fs && sp_cp)) failed = 1;
  };
  examples::run_example(argc, argv, 4, program);
  return failed;
}
