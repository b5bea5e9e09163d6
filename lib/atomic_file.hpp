// Writing a file so that readers see either the previous file or the whole
// new one, whatever happens during the write (an error, a full disk, the
// process killed, the machine losing power after the call returned).
//
// A test seam, setWriteFault(), makes a chosen point of the write fail (or run
// a test's action there, e.g. block until the test kills the process), so
// tests can show that an interruption at any byte leaves the previous file.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

namespace tessera::detail {

// The steps of an atomic write, in order.
enum class WriteStage { Create, Data, Sync, Rename, SyncFolder };

struct WriteFault {
  WriteStage stage = WriteStage::Data;
  // For Data: the fault comes once this many bytes of the file are written
  // (0: before the first byte; the file's size: after the last).
  uint64_t afterBytes = 0;
  // Runs at the fault, after which the write goes on; when empty, the stage
  // fails as a system call failing with EIO would.
  std::function<void()> action;
};

// Arms `fault` for every later write of this process; nullopt disarms.
// Tests only: the library never calls it.
void setWriteFault(std::optional<WriteFault> fault);

// Whether writes may use an unnamed temporary file (O_TMPFILE); true unless a
// test turns it off to exercise the named temporary file of filesystems
// without O_TMPFILE. Tests only.
void setUnnamedTemporaryFiles(bool allowed);

// Writes `bytes` to a temporary file in the folder of `path`, syncs it,
// renames it over `path` and syncs the folder. The temporary file has no name
// while it is written (O_TMPFILE) where the filesystem supports it, so a
// process killed then leaves nothing behind; it is linked as "PATH.tmp.<pid>"
// just before the rename. Elsewhere it is "PATH.tmp.<pid>" from the start.
// Before writing, "PATH.tmp.<pid>" files of processes that no longer exist
// (left by a kill) are removed. On failure the temporary file is removed, a
// previous file at `path` is left as it was, and IoError(FileUnwritable)
// names `path` and the system's reason. Symbolic links are resolved first
// (resolvedOutputPath): the link stays and the file it names is replaced. A
// path with a NUL character, or naming an existing file that is not a regular
// one (a device, a FIFO, a socket, a folder), is refused the same way before
// anything is created. (A failure to sync the folder after
// the rename is reported too, although the new file is then in place.)
void writeFileAtomically(const std::string& path, std::span<const uint8_t> bytes);

// The file a write to `path` replaces: `path` with its symbolic links
// resolved (also a dangling link's target), or `path` itself where it cannot
// be resolved (a missing folder, a loop).
std::string resolvedOutputPath(const std::string& path);

// Removes the "PATH.tmp.<pid>" files of `path`'s folder whose process no
// longer runs; returns how many. Errors are ignored: the files are litter.
int removeStaleTemporaryFiles(const std::string& path);

}  // namespace tessera::detail
