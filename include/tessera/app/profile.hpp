// Profiles: the modelled memory and time of a program, as files.
//
// writeProfile() writes one JSON document:
//   {"steps": N,
//    "time": {"stepSeconds", "totalSeconds" (= stepSeconds x steps), "computeSeconds",
//             "collectiveSeconds", "streamingSeconds", "overlappedStreamingSeconds", "flops"},
//    "traffic": {"ComputeTiles" | "IOTiles" | "Link" | "Streaming": {"ops", "seconds", "bytes"}},
//    "ops": [{"name", "kind", "lane", "group", "interInstance", "startSeconds", "durationSeconds",
//             "flops", "bytes"}, ...],
//    "memory": {"capacity": {"computeTiles", "ioTiles", "streaming"}, "paddingBytes",
//               "perReplica": [{"replica", "computeTiles" | "ioTiles" | "streaming":
//                                 {"peakBytes", "op", "largest": [tensor, ...]},
//                               "variableBytes", "peakActivationBytes", "paddingBytes",
//                               "byCategory": {"Weight": {"computeTiles", "ioTiles", "streaming"}, ...},
//                               "resident": {"Weight": {"computeTiles", "ioTiles", "streaming"}, ...}}],
//               "tensors": [{"name", "category", "space", "bytes", "resident", "sharded", "shards",
//                            "paddingBytes", "firstUse", "lastUse"}, ...]}}
// Times are in seconds, sizes in bytes, enums by their names.
//
// writeChromeTrace() writes the modelled step in the Chrome trace-event
// format ({"traceEvents": [...]}, times in microseconds): one complete ("X")
// event per op on one thread per lane — compute tiles, IO tiles, streaming,
// one link per collective group, and the host link when the program has
// host streams — named by metadata events. Open it in
// https://ui.perfetto.dev or chrome://tracing.
//
// Both throw IoError(FileUnwritable) naming the path when it cannot be
// written.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "tessera/simdevice/device.hpp"
#include "tessera/simdevice/time_model.hpp"

namespace tessera {

class TrainingSession;
struct OutputConfig;

// The documents the two functions below write.
nlohmann::json profileJson(const MemoryReport& memory, const TimeReport& time, int64_t steps = 1);
nlohmann::json chromeTraceJson(const TimeReport& time);

void writeProfile(const std::string& path, const MemoryReport& memory, const TimeReport& time,
                  int64_t steps = 1);
void writeChromeTrace(const std::string& path, const TimeReport& time);

// What `tessera train` writes after training: output.profile and
// output.trace, when set, for the session's compiled training program
// (one step; the profile also records the `steps` run).
void writeTrainingProfiles(const OutputConfig& output, const TrainingSession& session, int64_t steps);

}  // namespace tessera
