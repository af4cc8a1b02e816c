// train_gpt -recompute: the DP x TP model with each transformer block recomputed, in a
// memory budget the plain model exceeds (a translation unit of its own: train_gpt.hpp).
#include "train_gpt.hpp"

#include <cstdio>

using namespace dtensor;
using namespace train_gpt;

// What a rank holds over a training step, before the program runs (nn/memory_plan.hpp):
// with AdamW, batch 8 x 32 tokens on 2x2 (the largest rank). Without recompute a
// step's peak (1.7 MiB, the second block's forward) is over the budget; with it, the
// blocks' activations live one block at a time (1.5 MiB).
using namespace nn::literals;
constexpr int64_t kBudget = 1600_KiB;
static_assert(Rc::Model::memory_plan<Rc::Loss, nn::AdamW>({kBatch, kLen}, {2, 2}).peak_bytes() <= kBudget,
              "train_gpt: the recomputed model does not fit its per-rank budget");
static_assert(Tp::Model::memory_plan<Tp::Loss, nn::AdamW>({kBatch, kLen}, {2, 2}).peak_bytes() > kBudget,
              "train_gpt: the plain model fits the budget, so recompute is not needed to show it");

bool train_gpt::recomputed(Comm& comm) {
  if (comm.rank() == 0) {
    // Constants: a plan computed at run time would compile the whole planner into the
    // program (about a tenth of train_gpt's compile when it was one TU).
    static constexpr auto plain = Tp::Model::memory_plan<Tp::Loss, nn::AdamW>({kBatch, kLen}, {2, 2});
    static constexpr auto rc = Rc::Model::memory_plan<Rc::Loss, nn::AdamW>({kBatch, kLen}, {2, 2});
    std::printf("== the memory plan of one step, budget %lld bytes per rank\nwithout recompute:\n%s\nwith each block "
                "recomputed:\n%s\n",
                static_cast<long long>(kBudget), Tp::Model::explain(plain).c_str(), Rc::Model::explain(rc).c_str());
  }
  return compare<Rc>(comm, "DP x TP, each transformer block recomputed (nn::Recompute)");
}
