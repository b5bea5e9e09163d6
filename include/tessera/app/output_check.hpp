// Checking, before a run starts, that the files it is to write can be
// created, so that a mistyped folder fails at once instead of after hours of
// training whose result then has nowhere to go.
#pragma once

#include <string>
#include <string_view>

#include "tessera/app/run_config.hpp"

namespace tessera {

// Checks that a file can be created at `path`: `path` has no NUL character,
// is not a folder nor any other file but a regular one (a device, a FIFO, a
// socket: tessera never replaces one; symbolic links are followed first), its
// folder exists, and a probe file created next to it (".NAME.probe.<pid>",
// removed at once) can be created there. `subject` names where the path was
// given: a JSON path such as "/output/checkpoint" or a flag such as
// "--json-summary". An empty path is not written and passes. Throws
// IoError(OutputUnwritable) with `subject`, the path, the system's reason and
// what to do.
void checkOutputPath(const std::string& path, const std::string& subject);

// Writes `text` to `path` atomically: readers see the previous file or the
// whole new one, and the temporary file's name is unique to the process. A
// symbolic link is followed (the file it names is replaced, the link stays);
// a path that names anything but a regular file, or has a NUL character, is
// IoError(FileUnwritable) and nothing is written.
void writeOutputFile(const std::string& path, std::string_view text);

// checkOutputPath for every path of `output`: checkpoint, profile and trace.
void checkOutputs(const OutputConfig& output);

}  // namespace tessera
