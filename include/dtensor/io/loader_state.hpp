#pragma once
// A data loader's position in a checkpoint, so that a resumed run reads the same
// batches as one that never stopped:
//
//   io::add_loader(sd, loader);      // "loader.epoch", "loader.batch", "loader.seed",
//                                    // "loader.samples", "loader.batch_size"
//   io::save(sd, dir, comm);  ...  io::load(sd, dir, comm);   // the loader seeks there
//
// Saved: the position (the batch next() returns next, and the seed of the order) and,
// to be checked on load, the data set's sample count and the batch size: a position
// means other batches in a data set of another size or with another batch size, so
// loading into such a loader raises CheckpointError (on every rank: the scalars are
// the same everywhere) instead of resuming elsewhere. Save between steps: a batch that
// next() has returned counts as read.
#include <string>

#include "dtensor/io/loader.hpp"
#include "dtensor/io/state_dict.hpp"

namespace dtensor::io {

template <class DT, class Source>
void add_loader(StateDict& sd, Loader<DT, Source>& loader, const std::string& prefix = "loader.") {
  auto* l = &loader;
  auto position_entry = [&](const char* key, auto get, auto set) {
    sd.add_scalar(
        prefix + key, [l, get]() -> Scalar { return get(l->position()); },
        [l, set, name = prefix + key](const Scalar& s) {
          int64_t v = 0;
          detail::assign_scalar(name, s, v);
          LoaderPosition p = l->position();
          set(p, v);
          l->seek(p);
        });
  };
  position_entry("epoch", [](const LoaderPosition& p) { return p.epoch; }, [](LoaderPosition& p, int64_t v) { p.epoch = v; });
  position_entry("batch", [](const LoaderPosition& p) { return p.batch; }, [](LoaderPosition& p, int64_t v) { p.batch = v; });
  // The seed's 64 bits as an int64.
  position_entry("seed", [](const LoaderPosition& p) { return static_cast<int64_t>(p.seed); },
                 [](LoaderPosition& p, int64_t v) { p.seed = static_cast<uint64_t>(v); });
  auto fixed = [&](const char* key, int64_t have, const char* what) {
    sd.add_scalar(
        prefix + key, [have]() -> Scalar { return have; },
        [have, what, name = prefix + key](const Scalar& s) {
          int64_t v = 0;
          detail::assign_scalar(name, s, v);
          if (v != have)
            throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: ", name, ": the checkpoint's loader read ",
                                                       what, " ", v, " but this one reads ", have,
                                                       "; its position would name other batches"));
        });
  };
  fixed("samples", loader.order().size(), "a data set of samples");
  fixed("batch_size", loader.order().options().batch_size, "batches of");
}

}  // namespace dtensor::io
