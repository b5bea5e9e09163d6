#include "cli.hpp"

#include <algorithm>
#include <charconv>
#include <cstddef>

#include <fmt/format.h>

#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/app/output_check.hpp"
#include "tessera/app/run_config.hpp"

namespace tessera::cli {

std::string shellQuoted(std::string_view text) {
  const auto plain = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("_-./,:=+@%").find(c) != std::string_view::npos;
  };
  if (!text.empty() && std::all_of(text.begin(), text.end(), plain)) return std::string(text);
  std::string quoted = "'";
  for (const char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

const CLI::Validator& listableCount() {
  static const CLI::Validator validator(
      [](const std::string& text) -> std::string {
        int64_t value = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (ec == std::errc::result_out_of_range && end == text.data() + text.size()) {
          return fmt::format("{} is too large to list; at most {} are supported", boundedText(text),
                             kMaxListedCount);
        }
        // Text that is not a number is left to the option's own conversion,
        // which reports it.
        if (ec != std::errc{} || end != text.data() + text.size()) return {};
        if (value <= kMaxListedCount) return {};
        return fmt::format("{} is too large to list; at most {} are supported", value, kMaxListedCount);
      },
      fmt::format("<= {}", kMaxListedCount), "LISTABLE");
  return validator;
}

void addConfigArgs(CLI::App& command, ConfigArgs& args) {
  command.add_option("CONFIG", args.path, "Run config file (JSON)")->required();
  command
      .add_option("--set", args.overrides,
                  "Override one value of the config before it is read: PATH is a JSON pointer such as "
                  "/sessionOptions/replicatedGraphCount, VALUE is JSON (or else a plain string). Repeatable.")
      ->type_name("PATH=VALUE")
      ->allow_extra_args(false);
}

LoadedRunConfig loadValidated(const ConfigArgs& args) {
  LoadedRunConfig loaded = loadRunConfig(args.path, args.overrides);
  validate(loaded.config);
  return loaded;
}

void addSummaryOption(CLI::App& command, RunArgs& args, std::string_view fields) {
  command.add_option("--json-summary", args.summaryPath, fmt::format("Write {} to this file", fields))
      ->type_name("FILE");
}

void addAllowNonFiniteFlag(CLI::App& command, RunArgs& args, std::string_view use) {
  command.add_flag("--allow-non-finite", args.allowNonFinite,
                   fmt::format("{} a checkpoint that holds NaN or infinite values (refused otherwise)", use));
}

StartedRun startRun(const RunArgs& args) {
  StartedRun run{loadValidated(args.config), dist::instanceIndex() == 0};
  if (run.reports) checkOutputPath(args.summaryPath, "--json-summary");
  return run;
}

void printRunHeader(const std::string& notice, const std::string& dataset) {
  if (!notice.empty()) fmt::print(stderr, "note: {}\n", notice);
  fmt::print("dataset: {}\n", dataset);
}

LoadedRunConfig loadForPlanning(const ConfigArgs& args) {
  LoadedRunConfig loaded = loadRunConfig(args.path, args.overrides);
  validateForPlanning(loaded.config);
  return loaded;
}

int reportDoesNotFit(const MemoryShortfall& shortfall, const MemoryReport& memory) {
  std::string_view space = "streaming memory";
  if (shortfall.space == MemorySpace::ComputeTiles) space = "compute tiles";
  if (shortfall.space == MemorySpace::IOTiles) space = "IO tiles";
  int64_t shortReplicas = 0;
  for (const ReplicaMemory& m : memory.perReplica) {
    const int64_t peak = shortfall.space == MemorySpace::ComputeTiles ? m.computeTilesBytes
                         : shortfall.space == MemorySpace::IOTiles    ? m.ioTilesBytes
                                                                      : m.streamingBytes;
    if (peak > shortfall.availableBytes) ++shortReplicas;
  }
  // With several IPUs per replica each entry is one IPU of a replica.
  const bool ipus = memory.ipusPerReplica > 1;
  const DeviceError error(
      ErrorCode::OutOfMemory,
      ipus ? fmt::format("replica {}, IPU {}, {}", shortfall.replica, shortfall.ipu, space)
           : fmt::format("replica {}, {}", shortfall.replica, space),
      fmt::format("needs {} bytes but has {} bytes ({} of {} {} short); the program does not fit the "
                  "device, so train would refuse it: `tessera explain` lists the settings that lower the peak",
                  shortfall.neededBytes, shortfall.availableBytes, shortReplicas, memory.perReplica.size(),
                  ipus ? "IPUs" : "replicas"));
  fmt::print(stderr, "error: {}\n", error.what());
  return kExitDoesNotFit;
}

nlohmann::json groupingJson(const ReplicaGrouping& grouping) {
  nlohmann::json groups = nlohmann::json::array();
  for (int64_t g = 0; g < grouping.numGroups(); ++g) groups.push_back(grouping.replicasAt(g));
  return {
      {"numReplicas", grouping.numReplicas()}, {"stride", grouping.stride()},
      {"groupSize", grouping.groupSize()},     {"numGroups", grouping.numGroups()},
      {"assignment", grouping.assignment()},   {"groups", std::move(groups)},
  };
}

std::string groupingTables(const ReplicaGrouping& grouping, std::string_view indexLabel) {
  std::vector<std::vector<std::string>> groupRows;
  for (int64_t g = 0; g < grouping.numGroups(); ++g) {
    groupRows.push_back({std::to_string(g), joinInts(grouping.replicasAt(g))});
  }
  std::vector<std::vector<std::string>> replicaRows;
  for (int64_t r = 0; r < grouping.numReplicas(); ++r) {
    replicaRows.push_back(
        {std::to_string(r), std::to_string(grouping.groupAt(r)), std::to_string(grouping.indexInGroupAt(r))});
  }
  return formatTable({"group", "replicas"}, groupRows) + "\n" +
         formatTable({"replica", "group", std::string(indexLabel)}, replicaRows);
}

std::string hostStreamsTable(const TimeReport& time) {
  if (time.streams.empty()) return {};
  // Several IPUs per replica: the IPU whose host link carries each stream.
  const bool severalIpus =
      std::any_of(time.ops.begin(), time.ops.end(), [](const OpTime& op) { return op.ipu > 0; });
  std::vector<std::vector<std::string>> rows;
  for (const StreamTime& s : time.streams) {
    rows.push_back({s.name, s.input ? "in" : "out", std::string(toString(s.tileSet)),
                    std::string(toString(s.requested)), std::string(toString(s.applied)),
                    fmt::format("{:.0f}", s.bytesPerStep), fmt::format("{:.3f} ms", s.seconds * 1e3),
                    s.overlapped ? "yes" : "no"});
    if (severalIpus) rows.back().insert(rows.back().begin() + 1, std::to_string(s.ipu));
  }
  std::vector<std::string> header = {"stream",         "direction", "tile set", "strategy", "modelled as",
                                     "bytes per step", "host link", "overlaps"};
  if (severalIpus) header.insert(header.begin() + 1, "IPU");
  return fmt::format("Host streams (one replica, a step of {} batch{}):\n", time.batchesPerStep,
                     time.batchesPerStep == 1 ? "" : "es") +
         formatTable(header, rows) +
         fmt::format("step of {} batch{}: {:.3f} ms (device {:.3f} ms per batch, host link busy {:.3f} ms)\n",
                     time.batchesPerStep, time.batchesPerStep == 1 ? "" : "es", time.runSeconds * 1e3,
                     time.deviceSeconds * 1e3, time.hostSeconds * 1e3);
}

nlohmann::json hostStreamsJson(const TimeReport& time) {
  nlohmann::json out = nlohmann::json::array();
  for (const StreamTime& s : time.streams) {
    out.push_back({{"name", s.name},
                   {"direction", s.input ? "in" : "out"},
                   {"tileSet", std::string(toString(s.tileSet))},
                   {"exchangeStrategy", std::string(toString(s.requested))},
                   {"modelledAs", std::string(toString(s.applied))},
                   {"bytesPerStep", s.bytesPerStep},
                   {"seconds", s.seconds},
                   {"overlaps", s.overlapped},
                   {"ipu", s.ipu}});
  }
  return out;
}

std::string formatTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) widths[c] = header[c].size();
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < row.size() && c < widths.size(); ++c)
      widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  const auto appendRow = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      // The last column is not padded, so lines carry no trailing blanks.
      line += c + 1 < cells.size() ? fmt::format("{:<{}}  ", cells[c], widths[c]) : cells[c];
    }
    out += line + "\n";
  };
  appendRow(header);
  for (const auto& row : rows) appendRow(row);
  return out;
}

std::string joinInts(const std::vector<int64_t>& values) { return fmt::format("{}", fmt::join(values, " ")); }

void printJson(const nlohmann::json& value) {
  // Replacing invalid UTF-8 keeps a stray byte in a config string from
  // turning a report into an exception.
  fmt::print("{}\n", value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
}


}  // namespace tessera::cli
