#include "atomic_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "input_file.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::detail {
namespace {

std::optional<WriteFault>& armedFault() {
  static std::optional<WriteFault> fault;
  return fault;
}

bool& unnamedAllowed() {
  static bool allowed = true;
  return allowed;
}

std::string folderOf(const std::string& path) {
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  return folder.empty() ? "." : folder.string();
}

std::string reason(int error) { return std::generic_category().message(error); }

class AtomicWrite {
 public:
  AtomicWrite(const std::string& path, std::span<const uint8_t> bytes)
      : path_(path), target_(resolvedOutputPath(path)),
        temporary_(fmt::format("{}.tmp.{}", target_, ::getpid())), folder_(folderOf(target_)), bytes_(bytes) {
  }

  ~AtomicWrite() {
    if (fd_ >= 0) ::close(fd_);
    if (named_ && !renamed_) ::unlink(temporary_.c_str());
  }

  AtomicWrite(const AtomicWrite&) = delete;
  AtomicWrite& operator=(const AtomicWrite&) = delete;

  void run() {
    checkTarget();
    removeStaleTemporaryFiles(target_);
    at(WriteStage::Create, "create the temporary file");
    create();
    writeData();
    at(WriteStage::Sync, "sync the file");
    if (::fsync(fd_) != 0) fail(errno, "sync the file");
    at(WriteStage::Rename, "move the file into place");
    if (!named_) link();
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail(errno, "close the file");
    if (::rename(temporary_.c_str(), target_.c_str()) != 0) fail(errno, "move the file into place");
    renamed_ = true;
    at(WriteStage::SyncFolder, "sync the folder");
    syncFolder();
  }

 private:
  // rename() would replace whatever `path_` names: a device node, a FIFO, the
  // link /proc/self/fd/1. Only a regular file (or nothing) is replaced.
  void checkTarget() const {
    if (path_.find('\0') != std::string::npos) {
      throw IoError(ErrorCode::FileUnwritable, path_.substr(0, path_.find('\0')),
                    "the path has a NUL character; a file name cannot hold one");
    }
    struct stat info {};
    if (::stat(path_.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
      throw IoError(
          ErrorCode::FileUnwritable, path_,
          fmt::format("it is {}, not a regular file, and is never replaced; write to a regular file",
                      fileTypeName(info.st_mode)));
    }
  }

  void create() {
    if (unnamedAllowed()) {
      fd_ = ::open(folder_.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
      if (fd_ >= 0) return;
      // Filesystems without O_TMPFILE get a named file; any other reason
      // (no folder, no permission, no room) the named file meets as well.
    }
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(errno, "create the temporary file");
    named_ = true;
  }

  // Gives the unnamed file its temporary name, from which rename() moves it
  // over the target atomically (linkat cannot replace a file).
  void link() {
    // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; /proc/self/fd works for anyone.
    bool linked = ::linkat(fd_, "", AT_FDCWD, temporary_.c_str(), AT_EMPTY_PATH) == 0;
    if (!linked) {
      const std::string self = fmt::format("/proc/self/fd/{}", fd_);
      linked = ::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, temporary_.c_str(), AT_SYMLINK_FOLLOW) == 0;
    }
    if (!linked) fail(errno, "link the file into its folder");
    named_ = true;
  }

  void writeData() {
    uint64_t written = 0;
    const uint64_t size = bytes_.size();
    while (true) {
      if (faultPending(WriteStage::Data) && armedFault()->afterBytes == written) fire("write the file");
      if (written == size) break;
      uint64_t chunk = size - written;
      if (faultPending(WriteStage::Data) && armedFault()->afterBytes > written) {
        chunk = std::min(chunk, armedFault()->afterBytes - written);
      }
      const ssize_t n = ::write(fd_, bytes_.data() + written, static_cast<size_t>(chunk));
      if (n < 0) {
        if (errno == EINTR) continue;
        fail(errno, "write the file");
      }
      written += static_cast<uint64_t>(n);
    }
  }

  void syncFolder() {
    const int folder = ::open(folder_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const int error = folder < 0 || ::fsync(folder) != 0 ? errno : 0;
    if (folder >= 0) ::close(folder);
    if (error != 0) failAfterRename(error);
  }

  bool faultPending(WriteStage stage) const {
    return !fired_ && armedFault() && armedFault()->stage == stage;
  }

  void at(WriteStage stage, std::string_view what) {
    if (faultPending(stage)) fire(what);
  }

  void fire(std::string_view what) {
    fired_ = true;
    if (armedFault()->action) {
      armedFault()->action();
      return;
    }
    if (renamed_) failAfterRename(EIO);
    fail(EIO, what);
  }

  [[noreturn]] void fail(int error, std::string_view what) const {
    throw IoError(ErrorCode::FileUnwritable, path_,
                  fmt::format("cannot {} ({}): {}; the previous file, if any, is unchanged", what, temporary_,
                              reason(error)));
  }

  [[noreturn]] void failAfterRename(int error) const {
    throw IoError(
        ErrorCode::FileUnwritable, path_,
        fmt::format("the file is written but its folder {} cannot be synced: {}; it may not survive "
                    "a power failure",
                    folder_, reason(error)));
  }

  const std::string& path_;
  std::string target_;  // path_ with its symbolic links resolved
  std::string temporary_;
  std::string folder_;
  std::span<const uint8_t> bytes_;
  int fd_ = -1;
  bool named_ = false;  // the temporary file has its name in the folder
  bool renamed_ = false;
  bool fired_ = false;
};

}  // namespace

void setWriteFault(std::optional<WriteFault> fault) { armedFault() = std::move(fault); }

void setUnnamedTemporaryFiles(bool allowed) { unnamedAllowed() = allowed; }

std::string resolvedOutputPath(const std::string& path) {
  // Like the kernel's limit on links followed in one lookup.
  constexpr int kMaxLinks = 40;
  std::filesystem::path current(path);
  for (int hops = 0; hops < kMaxLinks; ++hops) {
    std::error_code error;
    if (!std::filesystem::is_symlink(current, error) || error) return current.string();
    const std::filesystem::path next = std::filesystem::read_symlink(current, error);
    if (error) return path;
    current = next.is_absolute() ? next : current.parent_path() / next;
  }
  return path;
}

int removeStaleTemporaryFiles(const std::string& path) {
  const std::string prefix = std::filesystem::path(path).filename().string() + ".tmp.";
  std::error_code error;
  std::filesystem::directory_iterator entries(folderOf(path), error);
  if (error) return 0;
  int removed = 0;
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix) || name.size() == prefix.size()) continue;
    const std::string_view digits = std::string_view(name).substr(prefix.size());
    pid_t pid = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    if (ec != std::errc{} || end != digits.data() + digits.size() || pid <= 0 || pid == ::getpid()) continue;
    // ESRCH: no such process. A live process (or one of another user, EPERM)
    // may still be writing its file.
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (::unlink(entry.path().c_str()) == 0) ++removed;
  }
  return removed;
}

void writeFileAtomically(const std::string& path, std::span<const uint8_t> bytes) {
  AtomicWrite(path, bytes).run();
}

}  // namespace tessera::detail
