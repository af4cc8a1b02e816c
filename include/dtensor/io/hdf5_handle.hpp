#pragma once
// The HDF5 C library as dtensor/io/hdf5.hpp calls it: Hdf5Error, the handles (hid_t)
// closed by their owners, HDF5's error stack turned into the exception's message, and
// the lock that every HDF5 call of the process runs under.
//
// Why a lock: Debian's parallel HDF5 (libhdf5-openmpi-dev, the one dtensor builds
// against) is not thread-safe (H5_HAVE_THREADSAFE is undefined: no call may overlap
// another, in any thread, even on another file), and the in-process runtime runs its
// ranks as threads of one process. So every sequence of HDF5 calls runs under
// an Hdf5Lock (one process-wide recursive mutex); the in-process ranks take turns.
// An MPI process is one rank, so there the lock is never contended. (Checked: with
// the lock made a no-op, test_io_hdf5's in-process cases crashed with SIGSEGV in 4
// runs of 5, 2026-11-29.) Debian's serial libhdf5 is built thread-safe but has no
// MPI-IO; built against it (H5_HAVE_PARALLEL undefined), every runtime would take the
// serialized path (not built here: only the parallel build is installed).
//
// Why the error stack is silenced: by default HDF5 prints its stack of errors to
// stderr from the failing call, on every rank. dtensor turns each failure into an
// Hdf5Error whose message names what dtensor was doing and carries HDF5's own
// descriptions (innermost first), and prints nothing.
#if !__has_include(<hdf5.h>)
// Without HDF5 the header refuses at once, saying what to install.
#error "dtensor/io/hdf5.hpp needs parallel HDF5: install libhdf5-openmpi-dev (scripts/setup.sh), \
and compile with `pkg-config --cflags --libs hdf5-openmpi` or link dtensor::hdf5 in CMake"
#endif
#include <hdf5.h>

#include <mutex>
#include <string>
#include <utility>

#include "dtensor/util/error.hpp"

namespace dtensor::io {

// An HDF5 file could not be written or read, or does not hold what the program asks
// for. Raised on every rank of the collective call, with the same message.
class Hdf5Error : public Error {
 public:
  using Error::Error;
};

namespace detail {

// The process's HDF5 lock (see the head of this file). Recursive: a helper that
// takes it may be called by one that holds it.
inline std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex m;
  return m;
}

// Holds the lock and keeps HDF5 from printing: HDF5's automatic error printing is
// turned off by the first lock of the process (H5Eset_auto is global in a build
// that is not thread-safe, so once is enough; under the lock, as every HDF5 call).
class Hdf5Lock {
 public:
  Hdf5Lock() : lock_(hdf5_mutex()) {
    static const bool silenced = [] {
      H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
      return true;
    }();
    (void)silenced;
  }

 private:
  std::unique_lock<std::recursive_mutex> lock_;
};

// HDF5's error stack, innermost call first ("" when empty), then cleared.
inline std::string hdf5_stack() {
  std::string out;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
        auto& s = *static_cast<std::string*>(data);
        if (n >= 4) return 0;  // the innermost few say why; the rest are the calls above them
        if (e->desc && *e->desc) s += std::string(s.empty() ? "" : "; ") + e->desc;
        return 0;
      },
      &out);
  H5Eclear2(H5E_DEFAULT);
  return out;
}

// "dtensor: hdf5: <what> (HDF5: <its stack>)".
[[noreturn]] inline void throw_hdf5(const std::string& what) {
  const std::string stack = hdf5_stack();
  throw Hdf5Error(dtensor::detail::cat("dtensor: hdf5: ", what, stack.empty() ? "" : " (HDF5: " + stack + ")"));
}

inline void check_hdf5(herr_t rc, const std::string& what) {
  if (rc < 0) throw_hdf5(what);
}

// A handle (file, dataset, dataspace, type, property list, attribute, group) that
// its owner closes. Close errors are ignored: they follow a failure already raised,
// or the data is written by then (a file's close is checked by close()).
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now and raises where closing fails (a file's last writes happen here).
  void close(const std::string& what) {
    const hid_t id = std::exchange(id_, H5I_INVALID_HID);
    if (id >= 0) check_hdf5(close_(id), what);
  }

 private:
  void reset() {
    if (id_ >= 0) close_(std::exchange(id_, H5I_INVALID_HID));
  }
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

// The handle `id` returned by an H5*create/open call, or an Hdf5Error saying `what`.
inline Handle checked(hid_t id, Handle::Closer close, const std::string& what) {
  if (id < 0) throw_hdf5(what);
  return Handle(id, close);
}

}  // namespace detail
}  // namespace dtensor::io
