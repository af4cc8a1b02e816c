#pragma once
// POSIX files for checkpoints: whole reads and writes at an offset (retried on
// EINTR and short transfers), fsync of files and directories, and the atomic
// replacement of a directory. Every failure throws CheckpointError naming the path
// and the system's reason.
//
// Atomic replacement: a checkpoint is written under a temporary name beside its
// final one, synced, and swapped in with one rename. Where the final directory
// already exists, Linux's renameat2(RENAME_EXCHANGE) swaps the two directories in
// one step, so the final name always holds a complete checkpoint, old or new; where
// the file system cannot exchange, the old one is first renamed aside (a crash
// between the two renames leaves it under `<dir>.old-*`, complete).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>
#include <utility>

#include "dtensor/util/error.hpp"

namespace dtensor::io {

// A checkpoint could not be written or read: a system error, a corrupt, incomplete
// or missing checkpoint, or one that does not hold what the program asks for.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

namespace fs = std::filesystem;

namespace detail {

[[noreturn]] inline void throw_os(const std::string& what, const fs::path& path, int err) {
  throw CheckpointError(
      dtensor::detail::cat("dtensor: checkpoint: ", what, " ", path.string(), ": ", std::strerror(err)));
}

// Names that no other save, in this process or another, picks at the same time.
inline std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const auto now = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[64];
  std::snprintf(buf, sizeof buf, "%ld-%llx-%x", static_cast<long>(::getpid()),
                static_cast<unsigned long long>(now ^ (counter.fetch_add(1) << 48)), rd());
  return buf;
}

}  // namespace detail

// An open file; closed by the destructor (errors at that point are ignored: call
// close() to see them).
class File {
 public:
  File() = default;
  // A new file (it must not exist) for writing.
  static File create(const fs::path& path) {
    return File(path, ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644), "cannot create");
  }
  static File open_read(const fs::path& path) {
    return File(path, ::open(path.c_str(), O_RDONLY | O_CLOEXEC), "cannot open");
  }
  // The regular file `name` in the directory open as `dirfd` (`shown`: its path, for
  // messages), for reading. A symbolic link is not followed, and a FIFO, device,
  // socket or directory is refused without blocking: the checkpoint's files are
  // regular files inside its directory, and nothing a file names reaches outside it.
  static File open_regular_at(int dirfd, const std::string& name, const fs::path& shown) {
    // O_NONBLOCK: opening a FIFO for reading would wait for a writer.
    const int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    if (fd < 0 && errno == ELOOP)
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: ", shown.string(),
                                                 " is a symbolic link; a checkpoint's files must be regular files "
                                                 "inside its directory, and links are not followed"));
    File f(shown, fd, "cannot open");
    struct stat st {};
    if (::fstat(f.fd_, &st) != 0) detail::throw_os("cannot stat", shown, errno);
    if (!S_ISREG(st.st_mode))
      throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: ", shown.string(), " is ",
                                                 S_ISDIR(st.st_mode)    ? "a directory"
                                                 : S_ISFIFO(st.st_mode) ? "a FIFO"
                                                 : S_ISSOCK(st.st_mode) ? "a socket"
                                                                        : "a device",
                                                 ", not a regular file; a checkpoint's files must be regular files"));
    const int flags = ::fcntl(f.fd_, F_GETFL);
    if (flags >= 0) (void)::fcntl(f.fd_, F_SETFL, flags & ~O_NONBLOCK);
    return f;
  }
  // Identifies the file: equal for two opens of the same file.
  std::pair<uint64_t, uint64_t> identity() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) detail::throw_os("cannot stat", path_, errno);
    return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  }
  File(File&& o) noexcept : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)) {}
  File& operator=(File&& o) noexcept {
    if (this != &o) {
      reset();
      path_ = std::move(o.path_);
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() { reset(); }

  const fs::path& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }

  uint64_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) detail::throw_os("cannot stat", path_, errno);
    return static_cast<uint64_t>(st.st_size);
  }

  // All n bytes at `offset`.
  void write_at(const void* data, std::size_t n, uint64_t offset) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, p, std::min<std::size_t>(n, kMaxTransfer), static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        detail::throw_os("cannot write", path_, errno);
      }
      p += w, n -= static_cast<std::size_t>(w), offset += static_cast<uint64_t>(w);
    }
  }

  // All n bytes at `offset`; returns false where the file ends first.
  bool read_at(void* data, std::size_t n, uint64_t offset) const {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, std::min<std::size_t>(n, kMaxTransfer), static_cast<off_t>(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        detail::throw_os("cannot read", path_, errno);
      }
      if (r == 0) return false;
      p += r, n -= static_cast<std::size_t>(r), offset += static_cast<uint64_t>(r);
    }
    return true;
  }

  // Data and size on stable storage.
  void sync() {
    if (::fsync(fd_) != 0) detail::throw_os("cannot sync", path_, errno);
  }

  void close() {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0) detail::throw_os("cannot close", path_, errno);
  }

 private:
  // Linux transfers at most 0x7ffff000 bytes per call; ask for at most 1 GiB.
  static constexpr std::size_t kMaxTransfer = std::size_t{1} << 30;

  File(fs::path path, int fd, const char* what) : path_(std::move(path)), fd_(fd) {
    if (fd_ < 0) detail::throw_os(what, path_, errno);
  }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  fs::path path_;
  int fd_ = -1;
};

// A checkpoint directory, open: its files are opened relative to it (File::
// open_regular_at), so a load reads one directory even if a save puts another in
// its place meanwhile, and changed() tells whether one did.
class Directory {
 public:
  Directory() = default;
  explicit Directory(fs::path path) : path_(std::move(path)) {
    // The user's own path: a symbolic link to the directory is followed.
    fd_ = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) {
      const int err = errno;
      if (err == ENOENT)
        throw CheckpointError(dtensor::detail::cat("dtensor: checkpoint: no checkpoint at ", path_.string(),
                                                   " (no such directory)"));
      detail::throw_os(err == ENOTDIR ? "not a directory:" : "cannot open directory", path_, err);
    }
  }
  Directory(Directory&& o) noexcept : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)) {}
  Directory& operator=(Directory&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      path_ = std::move(o.path_);
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;
  ~Directory() {
    if (fd_ >= 0) ::close(fd_);
  }

  const fs::path& path() const { return path_; }
  int fd() const { return fd_; }
  File open(const std::string& name) const { return File::open_regular_at(fd_, name, path_ / name); }
  // Whether the entry `name` exists (not following a link).
  bool has(const std::string& name) const {
    struct stat st {};
    return ::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
  }
  // Whether this directory was removed, or another one now stands at its path (a
  // save replaced the checkpoint since it was opened).
  bool changed() const {
    struct stat mine {}, now {};
    if (::fstat(fd_, &mine) != 0 || mine.st_nlink == 0) return true;
    if (::stat(path_.c_str(), &now) != 0) return true;
    return mine.st_dev != now.st_dev || mine.st_ino != now.st_ino;
  }

 private:
  fs::path path_;
  int fd_ = -1;
};

// A directory's entries (new names, renames) on stable storage.
inline void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) detail::throw_os("cannot open directory", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems refuse fsync on directories (EINVAL); their renames are as
  // durable as they get.
  if (rc != 0 && err != EINVAL) detail::throw_os("cannot sync directory", dir, err);
}

// Writes `text` to a new file and syncs it.
inline void write_file_synced(const fs::path& path, const std::string& text) {
  File f = File::create(path);
  f.write_at(text.data(), text.size(), 0);
  f.sync();
  f.close();
}

// The whole file as a string.
inline std::string read_file(const fs::path& path) {
  File f = File::open_read(path);
  std::string s(static_cast<std::size_t>(f.size()), '\0');
  if (!f.read_at(s.data(), s.size(), 0)) detail::throw_os("file shrank while being read:", path, EIO);
  return s;
}

// Removes a directory tree, ignoring errors: for cleaning up after a failure,
// where the first error is the one to report.
inline void remove_tree_quietly(const fs::path& path) noexcept {
  std::error_code ec;
  fs::remove_all(path, ec);
}

// Puts the complete directory `tmp` in place of `dir` (which may exist), atomically
// where the file system allows (see the top of this file), and syncs the parent.
inline void replace_dir(const fs::path& tmp, const fs::path& dir) {
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  std::error_code ec;
  const bool exists = fs::exists(dir, ec);
  if (!exists) {
    if (::rename(tmp.c_str(), dir.c_str()) != 0) detail::throw_os("cannot rename " + tmp.string() + " to", dir, errno);
    sync_dir(parent);
    return;
  }
  DTENSOR_CHECK(fs::is_directory(dir, ec), InvalidArgument, "checkpoint: ", dir.string(),
                " exists and is not a directory; save to another path or remove it");
#if defined(RENAME_EXCHANGE)
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    sync_dir(parent);
    remove_tree_quietly(tmp);  // now the previous checkpoint
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    detail::throw_os("cannot exchange " + tmp.string() + " with", dir, errno);
#endif
  const fs::path old = fs::path(dir.string() + ".old-" + detail::unique_suffix());
  if (::rename(dir.c_str(), old.c_str()) != 0)
    detail::throw_os("cannot move the previous checkpoint aside:", dir, errno);
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    const int err = errno;
    (void)::rename(old.c_str(), dir.c_str());  // put the previous one back
    detail::throw_os("cannot rename " + tmp.string() + " to", dir, err);
  }
  sync_dir(parent);
  remove_tree_quietly(old);
}

}  // namespace dtensor::io
