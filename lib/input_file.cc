#include "input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "tessera/lib/error.hpp"

namespace tessera::detail {
namespace {

[[noreturn]] void unreadable(const std::string& path, std::string_view why) {
  throw IoError(ErrorCode::FileUnreadable, path, fmt::format("cannot read the file: {}", why));
}

std::string reason(int error) { return std::generic_category().message(error); }

}  // namespace

std::string_view fileTypeName(unsigned mode) noexcept {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a folder";
    case S_IFIFO: return "a FIFO (named pipe)";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    default: return "not a regular file";
  }
}

InputFile::InputFile(std::string path) : path_(std::move(path)) {
  if (path_.find('\0') != std::string::npos) unreadable(path_, "the path contains a NUL character");
  // O_NONBLOCK: opening a FIFO without a writer returns at once instead of
  // waiting; the FIFO is then refused below like any other special file.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd_ < 0) unreadable(path_, reason(errno));
  struct stat info {};
  if (::fstat(fd_, &info) != 0) {
    const int error = errno;
    ::close(fd_);
    unreadable(path_, reason(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd_);
    unreadable(path_, fmt::format("it is {}, not a regular file", fileTypeName(info.st_mode)));
  }
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  size_ = static_cast<uint64_t>(info.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

int InputFile::release() noexcept { return std::exchange(fd_, -1); }

void InputFile::readAt(uint64_t offset, std::span<char> out) const {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      unreadable(path_, reason(errno));
    }
    if (n == 0) {
      unreadable(path_,
                 fmt::format("the file ended after {} bytes; it changed while it was read", offset + done));
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace tessera::detail
