// Reading files that a user names: a config, a checkpoint, a dataset, a
// model.
//
// Such a path may name anything: a FIFO that nobody writes (open() would
// wait forever), /dev/zero or /dev/urandom (endless), a folder, or a huge or
// sparse file. InputFile opens without blocking, refuses everything but a
// regular file before reading a byte, and reports the file's size, so that a
// reader checks the size against its bound (and against what the file's own
// header claims) before it allocates anything.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace tessera::detail {

class InputFile {
 public:
  // Opens `path` for reading. IoError(FileUnreadable) names `path` when it
  // cannot be opened or is not a regular file (the message says what it is:
  // a folder, a FIFO, a character device, ...).
  explicit InputFile(std::string path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const noexcept { return path_; }
  // The size when it was opened.
  uint64_t size() const noexcept { return size_; }
  // The file descriptor (blocking again, close-on-exec); owned by this.
  int fd() const noexcept { return fd_; }
  // Gives up ownership of the descriptor (e.g. to fdopen it).
  int release() noexcept;

  // Fills `out` with the bytes at `offset`; IoError(FileUnreadable) when the
  // file ends before (it shrank since it was opened) or reading fails.
  void readAt(uint64_t offset, std::span<char> out) const;

  // The whole file. When it is larger than `maxBytes`, calls `tooLarge` with
  // its size before reading anything; `tooLarge` must throw.
  template <class Bytes, class TooLarge>
  Bytes readAll(uint64_t maxBytes, TooLarge&& tooLarge) const {
    if (size_ > maxBytes) tooLarge(size_);
    Bytes bytes(static_cast<std::size_t>(size_), typename Bytes::value_type{});
    readAt(0, std::span<char>(reinterpret_cast<char*>(bytes.data()), bytes.size()));
    return bytes;
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// What a file's mode says it is ("a folder", "a FIFO", ...).
std::string_view fileTypeName(unsigned mode) noexcept;

}  // namespace tessera::detail
