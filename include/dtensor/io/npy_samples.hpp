#pragma once
// A data set of samples in one .npy file ([N, sample dims...], numpy.save's output), as
// a data loader's source (io/loader.hpp): the file checked once by rank 0 for every
// rank, then each rank reading boxes of single samples (io/npy.hpp) from any thread.
//
//   io::Loader<Batch, io::NpySamples> loader(mesh, io::NpySamples("train_x.npy"), {.batch_size = 8});
//
// A source has three members, which the loader calls:
//   open<T>(comm)                  collective: the data set's extents [N, ...], after
//                                  checking that it holds T; raises alike on every rank
//   read<T>(n, offset, sizes, dst) this rank's box of sample n (offset and sizes over
//                                  the sample's dims), row-major into dst; one call at a
//                                  time, from the loader's thread or the caller's
//   name()                         for messages
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dtensor/comm/comm.hpp"
#include "dtensor/io/agreement.hpp"
#include "dtensor/io/npy.hpp"

namespace dtensor::io {

class NpySamples {
 public:
  explicit NpySamples(std::filesystem::path file) : path_(std::move(file)) {}

  std::string name() const { return path_.string(); }

  template <class T>
  std::vector<int64_t> open(Comm& comm) {
    // Rank 0's look decides for every rank (the same message everywhere); then each
    // rank opens its own descriptor (a rank on a node where the file is missing fails
    // too, and the ranks agree on it).
    std::string text;
    if (comm.rank() == 0) {
      try {
        NpyFile f(path_);
        const std::string t = f.template type_mismatch<T>();
        if (!t.empty()) throw NpyError("dtensor: npy: " + t);
        std::ostringstream s;
        s << '+' << f.header().shape.size();
        for (int64_t d : f.header().shape) s << ' ' << d;
        text = s.str();
      } catch (const std::exception& e) {
        text = std::string("-") + e.what();
      }
    }
    text = detail::broadcast_string(comm, text, 0);
    if (text.empty() || text[0] == '-') throw NpyError(text.empty() ? "dtensor: npy: no answer" : text.substr(1));
    std::istringstream s(text.substr(1));
    std::size_t r = 0;
    s >> r;
    std::vector<int64_t> shape(r);
    for (auto& d : shape) s >> d;
    std::string error;
    try {
      file_.emplace(path_);
      if (file_->header().shape != shape) throw NpyError("dtensor: npy: " + path_.string() + " differs from rank 0's");
    } catch (const std::exception& e) {
      error = e.what();
    }
    const std::string failed = detail::agree_on_error(comm, error);
    if (!failed.empty()) throw NpyError("dtensor: npy: " + detail::strip_prefix(failed));
    return shape;
  }

  template <class T>
  void read(int64_t sample, const std::vector<int64_t>& offset, const std::vector<int64_t>& sizes, T* dst) const {
    DTENSOR_CHECK(file_.has_value(), InvalidArgument, "dtensor::io::NpySamples: read before open");
    std::vector<int64_t> o{sample}, s{1};
    o.insert(o.end(), offset.begin(), offset.end());
    s.insert(s.end(), sizes.begin(), sizes.end());
    file_->read_box(o, s, dst);
  }

 private:
  std::filesystem::path path_;
  std::optional<NpyFile> file_;
};

}  // namespace dtensor::io
