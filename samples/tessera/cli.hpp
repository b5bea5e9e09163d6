// Pieces shared by the subcommands of the tessera command-line tool. Each
// subcommand lives in its own cmd_NAME.cc and is listed once, in main.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "tessera/simdevice/device.hpp"
#include "tessera/lib/replica_grouping.hpp"
#include "tessera/app/run_config.hpp"

namespace tessera::cli {

// Exit codes: success, invalid input (a tessera::Error), usage errors and
// unreadable files, and defects.
inline constexpr int kExitOk = 0;
inline constexpr int kExitInvalidInput = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInternal = 3;
// validate and explain: the config is valid but its program does not fit
// the device (tessera.device.401 on stderr).
inline constexpr int kExitDoesNotFit = 4;
// Stopped by a signal at a step boundary: 128 + the signal's number, as
// shells report a process the signal ended (130 for Ctrl-C, 143 for SIGTERM,
// 129 for SIGHUP); never below kExitSignalBase.
inline constexpr int kExitSignalBase = 128;
constexpr int exitCodeForSignal(int signal) { return kExitSignalBase + signal; }

// Runs a parsed subcommand and returns its exit code. tessera errors
// propagate to main, which reports them all in one place.
using Action = std::function<int()>;

// Declares a subcommand's arguments on `command` and returns the action that
// runs it; the arguments are parsed into state the action owns.
using Attach = Action (*)(CLI::App& command);

struct Subcommand {
  std::string_view name;
  std::string_view summary;
  Attach attach;
};

Action attachValidate(CLI::App& command);
Action attachExplain(CLI::App& command);
Action attachGroups(CLI::App& command);
Action attachCbr(CLI::App& command);
Action attachSchema(CLI::App& command);
Action attachTrain(CLI::App& command);
Action attachEvaluate(CLI::App& command);
Action attachLaunch(CLI::App& command);
Action attachCheckpoint(CLI::App& command);
Action attachOnnxTest(CLI::App& command);

// Set by `tessera launch` for its instances: the launch command line up to
// and including its "--" (shell-quoted), so that an instance can tell how to
// run a command the same way, e.g. in the hint that resumes a stopped run.
inline constexpr const char* kLaunchCommandVar = "TESSERA_LAUNCH_COMMAND";

// `text` as one word of a POSIX shell command line: unchanged when it holds
// only characters no shell treats specially, single-quoted otherwise.
std::string shellQuoted(std::string_view text);

// Replica and shard counts are listed one entry each; above this the output
// would be unreadable (and the lists would exhaust memory), so such counts
// are usage errors.
inline constexpr int64_t kMaxListedCount = int64_t{1} << 20;
// Rejects values above kMaxListedCount; lower bounds are the library's to
// check, so that its error ids reach the user.
const CLI::Validator& listableCount();

// The run config file and its --set overrides, shared by the commands that
// read one.
struct ConfigArgs {
  std::string path;
  std::vector<std::string> overrides;
};
void addConfigArgs(CLI::App& command, ConfigArgs& args);
// loadRunConfig followed by validate(RunConfig).
LoadedRunConfig loadValidated(const ConfigArgs& args);
// loadRunConfig followed by validateForPlanning(RunConfig): for the commands
// that plan and never make the tensors (validate, explain).
LoadedRunConfig loadForPlanning(const ConfigArgs& args);

// What the commands that run a config (train, evaluate) share: the config,
// --json-summary and --allow-non-finite.
struct RunArgs {
  ConfigArgs config;
  std::string summaryPath;
  bool allowNonFinite = false;
};
// Declares --json-summary, whose file holds `fields`.
void addSummaryOption(CLI::App& command, RunArgs& args, std::string_view fields);
// Declares --allow-non-finite: `use` a checkpoint that holds NaN or infinite values.
void addAllowNonFiniteFlag(CLI::App& command, RunArgs& args, std::string_view use);
// The start of a run: the config loaded and validated, and whether this
// process reports (instance 0 of a tessera launch run, or the only one); a
// reporting process checks its --json-summary path before anything runs.
struct StartedRun {
  LoadedRunConfig loaded;
  bool reports = true;
};
StartedRun startRun(const RunArgs& args);
// A run's notice and dataset lines, as train and evaluate print them first.
void printRunHeader(const std::string& notice, const std::string& dataset);

// Prints the out-of-memory error (tessera.device.401) of a program that does
// not fit on stderr, with `error: ` as every error, and returns
// kExitDoesNotFit.
int reportDoesNotFit(const MemoryShortfall& shortfall, const MemoryReport& memory);

// {"numReplicas", "stride", "groupSize", "numGroups", "assignment", "groups"}.
nlohmann::json groupingJson(const ReplicaGrouping& grouping);
// "group  replicas" then "replica  group  INDEX" tables; `indexLabel` names
// the position of a replica in its group ("index", or "shard" for a sharding
// domain).
std::string groupingTables(const ReplicaGrouping& grouping, std::string_view indexLabel);

// The host streams of a modelled step (TimeReport::streams), one row each:
// direction, tile set, strategy as set and as modelled, bytes per step, the
// host link's busy time and whether it overlaps compute; empty without
// streams. The JSON has the same fields by name.
std::string hostStreamsTable(const TimeReport& time);
nlohmann::json hostStreamsJson(const TimeReport& time);

// Left-aligned columns separated by two spaces.
std::string formatTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows);
// Space-separated values, e.g. "0 2 4 6".
std::string joinInts(const std::vector<int64_t>& values);

// Pretty JSON with a 2-space indent on stdout.
void printJson(const nlohmann::json& value);

}  // namespace tessera::cli
