#pragma once
// A data loader's position in a checkpoint, so that a resumed run reads the same
// batches as one that never stopped:
//
//   io::add_loader(sd, loader);      // "loader.samples", "loader.batch_size",
//                                    // "loader.shuffle", "loader.drop_last",
//                                    // "loader.epoch", "loader.batch", "loader.seed"
//   io::save(sd, dir, comm);  ...  io::load(sd, dir, comm);   // the loader seeks there
//
// Saved: the position (the batch next() returns next, and the seed of the order) and,
// to be checked on load, what makes a position name those batches: the data set's
// sample count, the batch size, whether the order is shuffled and whether a short last
// batch is dropped. A loader that differs in any of them would resume on other batches,
// so loading into it raises CheckpointError (on every rank: the scalars are the same
// everywhere), checked before the position is touched; the position is then applied in
// one seek. (Checkpoints written before shuffle and drop_last were saved load without
// those two checks.) Save between steps: a batch that next() has returned counts as read.
#include <memory>
#include <string>

#include "dtensor/io/loader.hpp"
#include "dtensor/io/state_dict.hpp"

namespace dtensor::io {

template <class DT, class Source>
void add_loader(StateDict& sd, Loader<DT, Source>& loader, const std::string& prefix = "loader.") {
  auto* l = &loader;
  // What the position means, checked first (entries load in the order they are added).
  auto fixed = [&](const char* key, int64_t have, const char* what, bool optional) {
    sd.add_scalar(
        prefix + key, [have]() -> Scalar { return have; },
        [have, what, name = prefix + key](const Scalar& s) {
          int64_t v = 0;
          detail::assign_scalar(name, s, v);
          if (v != have)
            throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: ", name, ": the checkpoint's loader read ",
                                                       what, " ", v, " but this one reads ", have,
                                                       "; its position would name other batches"));
        },
        optional);
  };
  const BatchOptions& o = loader.order().options();
  fixed("samples", loader.order().size(), "a data set of samples", false);
  fixed("batch_size", o.batch_size, "batches of", false);
  fixed("shuffle", o.shuffle ? 1 : 0, "with shuffle (1: shuffled)", true);
  fixed("drop_last", o.drop_last ? 1 : 0, "with drop_last (1: a short last batch dropped)", true);
  // The position: epoch and batch gathered, then one seek when the seed (the last)
  // arrives, so a refused position leaves the loader where it was.
  auto pending = std::make_shared<LoaderPosition>();
  sd.add_scalar(
      prefix + "epoch", [l]() -> Scalar { return l->position().epoch; },
      [pending, name = prefix + "epoch"](const Scalar& s) { detail::assign_scalar(name, s, pending->epoch); });
  sd.add_scalar(
      prefix + "batch", [l]() -> Scalar { return l->position().batch; },
      [pending, name = prefix + "batch"](const Scalar& s) { detail::assign_scalar(name, s, pending->batch); });
  // The seed's 64 bits as an int64.
  sd.add_scalar(
      prefix + "seed", [l]() -> Scalar { return static_cast<int64_t>(l->position().seed); },
      [l, pending, name = prefix + "seed"](const Scalar& s) {
        int64_t v = 0;
        detail::assign_scalar(name, s, v);
        pending->seed = static_cast<uint64_t>(v);
        try {
          l->seek(*pending);
        } catch (const InvalidArgument& e) {  // a position outside this loader's epochs
          throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: the checkpoint's loader position (epoch ",
                                                     pending->epoch, ", batch ", pending->batch,
                                                     ") is not one of this loader's: ", e.what()));
        }
      });
}

}  // namespace dtensor::io
