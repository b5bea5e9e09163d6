// Checking, before a run starts, that the files it is to write can be
// created, so that a mistyped folder fails at once instead of after hours of
// training whose result then has nowhere to go.
#pragma once

#include <string>

#include "tessera/run_config.hpp"

namespace tessera {

// Checks that a file can be created at `path`: `path` is not a folder, its
// folder exists, and a probe file created next to it (".NAME.probe.<pid>",
// removed at once) can be created there. `subject` names where the path was
// given: a JSON path such as "/output/checkpoint" or a flag such as
// "--json-summary". An empty path is not written and passes. Throws
// IoError(OutputUnwritable) with `subject`, the path, the system's reason and
// what to do.
void checkOutputPath(const std::string& path, const std::string& subject);

// checkOutputPath for every path of `output`: checkpoint, profile and trace.
void checkOutputs(const OutputConfig& output);

}  // namespace tessera
