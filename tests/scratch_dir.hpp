#pragma once
// A scratch directory for the I/O tests (checkpoints, HDF5, the loader), the same on
// every rank. Only the two io/ headers it uses: the HDF5 tests build without the
// checkpoints' dependencies.
#include <unistd.h>

#include <atomic>
#include <dtensor/io/agreement.hpp>
#include <dtensor/io/file.hpp>
#include <filesystem>
#include <string>

namespace dtensor::test {

// A fresh directory under the system's temporary directory, the same on every rank
// (rank 0 names it: MPI ranks have different process ids); removed by the destructor
// on rank 0 after a barrier.
class ScratchDir {
 public:
  explicit ScratchDir(Comm& comm) : comm_(comm) {
    static std::atomic<int> counter{0};
    std::string name = "dtensor-ckpt-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    name = io::detail::broadcast_string(comm, name, 0);
    path_ = std::filesystem::temp_directory_path() / name;
    if (comm.rank() == 0) std::filesystem::create_directories(path_);
    comm.barrier();
  }
  ~ScratchDir() {
    try {
      comm_.barrier();
    } catch (...) {
    }
    if (comm_.rank() == 0) io::remove_tree_quietly(path_);
  }
  std::filesystem::path operator/(const std::string& s) const { return path_ / s; }
  const std::filesystem::path& path() const { return path_; }

 private:
  Comm& comm_;
  std::filesystem::path path_;
};

}  // namespace dtensor::test
