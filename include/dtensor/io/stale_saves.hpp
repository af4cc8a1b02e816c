#pragma once
// What a killed save leaves behind, and who may clean it up.
//
// A save writes into `<dir>.tmp-<pid>-<hex>-<hex>` beside its checkpoint and renames
// it into place at the end (io/file.hpp); a save killed before the rename leaves
// that directory, which nothing would remove (1.5 GB after 20 kills of one run).
// So each save, before it makes its own, removes its path's leftovers, but only
// where no other save can be writing them:
//
//   every save holds a shared flock() on the parent directory from before it makes
//   its temporary directory until that is renamed or removed; a save that obtains
//   the lock exclusively (without waiting) knows that no other save in the parent
//   is running, so every `<dir>.tmp-*` of the right form is a leftover: it removes
//   them, then keeps the lock shared for its own save.
//
// The kernel drops a killed process's locks, so a leftover never stays locked. A
// save that finds the lock held (another save is running) leaves the cleanup to a
// later save. Where the file system has no flock (some network file systems), no
// save cleans up: never remove what may be another save's. `<dir>.old-*` (left by
// a save killed between the two renames of a file system without RENAME_EXCHANGE,
// and complete) goes too, but only while `<dir>` holds a checkpoint.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "dtensor/io/file.hpp"
#include "dtensor/io/index.hpp"

namespace dtensor::io {

namespace detail {

// Whether `s` is what detail::unique_suffix() makes: digits, '-', hex digits, '-', hex digits.
inline bool is_unique_suffix(std::string_view s) {
  int field = 0;
  std::size_t len = 0;
  for (char c : s) {
    if (c == '-') {
      if (len == 0 || ++field > 2) return false;
      len = 0;
      continue;
    }
    const bool ok = field == 0 ? std::isdigit(static_cast<unsigned char>(c)) != 0
                               : std::isxdigit(static_cast<unsigned char>(c)) != 0;
    if (!ok) return false;
    ++len;
  }
  return field == 2 && len > 0;
}

}  // namespace detail

// Held by rank 0 for the whole of a save into `dir` (see the top of this file).
class SaveLock {
 public:
  explicit SaveLock(const fs::path& dir) {
    const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
    fd_ = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ < 0) return;  // cannot lock: no cleanup; the save itself reports what fails
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      removed_ = remove_leftovers(parent, dir.filename().string());
      // Not atomic (flock converts by unlocking first), and need not be: another
      // save that takes the lock exclusively in between finds no directory of ours.
      (void)::flock(fd_, LOCK_SH);
    } else if (errno == EWOULDBLOCK) {
      // Another save holds it shared (running) or exclusively (cleaning, briefly).
      while (::flock(fd_, LOCK_SH) != 0 && errno == EINTR) {
      }
    }
  }
  SaveLock(const SaveLock&) = delete;
  SaveLock& operator=(const SaveLock&) = delete;
  ~SaveLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  // How many leftover directories this save removed.
  int removed() const { return removed_; }

 private:
  static int remove_leftovers(const fs::path& parent, const std::string& name) {
    std::error_code ec;
    const bool complete = fs::is_regular_file(parent / name / kIndexFile, ec);
    std::vector<fs::path> leftovers;  // first listed, then removed: not while iterating
    for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string entry = it->path().filename().string();
      std::string_view rest = entry;
      if (rest.substr(0, name.size()) != name) continue;
      rest.remove_prefix(name.size());
      const bool tmp = rest.substr(0, 5) == ".tmp-", old = rest.substr(0, 5) == ".old-";
      if (!(tmp || (old && complete)) || !detail::is_unique_suffix(rest.substr(5))) continue;
      std::error_code e2;
      if (!fs::is_directory(fs::symlink_status(it->path(), e2))) continue;  // never through a link
      leftovers.push_back(it->path());
    }
    for (const auto& p : leftovers) remove_tree_quietly(p);
    return static_cast<int>(leftovers.size());
  }

  int fd_ = -1;
  int removed_ = 0;
};

}  // namespace dtensor::io
