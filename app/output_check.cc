#include "tessera/app/output_check.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "atomic_file.hpp"
#include "input_file.hpp"
#include "tessera/lib/error.hpp"

namespace tessera {
namespace {

std::string reason(int error) { return std::generic_category().message(error); }

[[noreturn]] void refuse(const std::string& subject, const std::string& path, const std::string& why) {
  throw IoError(ErrorCode::OutputUnwritable, subject,
                fmt::format("\"{}\" cannot be written: {}; nothing was run", path, why));
}

}  // namespace

void checkOutputPath(const std::string& path, const std::string& subject) {
  if (path.empty()) return;
  if (const std::size_t nul = path.find('\0'); nul != std::string::npos) {
    refuse(subject, path.substr(0, nul),
           fmt::format("the path has a NUL character after its first {} bytes; a file name cannot hold one, "
                       "so remove it from {}",
                       nul, subject));
  }
  // Symbolic links are followed: the file written is the one they name.
  const std::filesystem::path target(detail::resolvedOutputPath(path));
  const std::string folder = target.parent_path().empty() ? "." : target.parent_path().string();
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    refuse(subject, path,
           fmt::format("it is a folder; set {} to a file in it, such as \"{}\"", subject,
                       (std::filesystem::path(path) / "output").string()));
  }
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    refuse(subject, path,
           fmt::format(
               "it is {}{}, not a regular file, and tessera never replaces one; set {} to the path of a "
               "regular file",
               detail::fileTypeName(info.st_mode),
               target.string() == path ? std::string() : fmt::format(" (\"{}\")", target.string()), subject));
  }
  const std::string probe =
      (std::filesystem::path(folder) / fmt::format(".{}.probe.{}", target.filename().string(), ::getpid()))
          .string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int error = errno;
    switch (error) {
      case ENOENT:
        refuse(
            subject, path,
            fmt::format("the folder \"{}\" does not exist; create it (mkdir -p '{}') or set {} to a path in "
                        "an existing folder",
                        folder, folder, subject));
      case ENOTDIR:
        refuse(
            subject, path,
            fmt::format("a part of the folder \"{}\" is a file, not a folder; set {} to a path in a folder",
                        folder, subject));
      case EACCES:
      case EPERM:
      case EROFS:
        refuse(subject, path,
               fmt::format("no file can be created in the folder \"{}\" ({}); set {} to a path in a writable "
                           "folder",
                           folder, reason(error), subject));
      default:
        refuse(subject, path,
               fmt::format("no file can be created in the folder \"{}\" ({}); set {} to a path in another "
                           "folder",
                           folder, reason(error), subject));
    }
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

void writeOutputFile(const std::string& path, std::string_view text) {
  detail::writeFileAtomically(
      path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

void checkOutputs(const OutputConfig& output) {
  checkOutputPath(output.checkpoint, "/output/checkpoint");
  checkOutputPath(output.profile, "/output/profile");
  checkOutputPath(output.trace, "/output/trace");
  checkOutputPath(output.onnx, "/output/onnx");
}

}  // namespace tessera
