// tessera groups --replicas R [--stride S] [--group-size G] [--json]
#include <memory>
#include <optional>

#include <fmt/core.h>

#include "cli.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/replica_grouping.hpp"
#include "tessera/lib/tensor_location.hpp"

namespace tessera::cli {
namespace {

struct GroupsArgs {
  int64_t replicas = 0;
  int64_t stride = 1;
  std::optional<int64_t> groupSize;
  bool json = false;
};

// Without --group-size the groups tile the replicas: G = R / S. Values the
// library rejects anyway (non-positive ones) are passed through so that its
// error names them.
int64_t effectiveGroupSize(const GroupsArgs& args) {
  if (args.groupSize) return *args.groupSize;
  if (args.replicas <= 0 || args.stride <= 0) return args.replicas;
  if (args.replicas % args.stride != 0) {
    throw ConfigError(ErrorCode::ReplicaGroupingNotDivisible, "--stride",
                      fmt::format("{} replicas are not a multiple of stride {}; choose a stride that divides "
                                  "--replicas or give --group-size",
                                  args.replicas, args.stride));
  }
  return args.replicas / args.stride;
}

std::string commGroupName(const ReplicaGrouping& grouping) {
  try {
    return CommGroup::fromReplicaGrouping(grouping).str();
  } catch (const ConfigError& e) {
    if (e.code() != ErrorCode::NotACommGroup) throw;
    return "none (no CommGroup has these groups)";
  }
}

}  // namespace

Action attachGroups(CLI::App& command) {
  auto args = std::make_shared<GroupsArgs>();
  command.add_option("--replicas", args->replicas, "Number of replicas R")
      ->required()
      ->check(listableCount());
  command.add_option("--stride", args->stride, "Distance between the members of a group")
      ->capture_default_str();
  command.add_option("--group-size", args->groupSize, "Replicas per group (default: R / stride)");
  command.add_flag("--json", args->json, "Print JSON instead of tables");
  return [args] {
    const ReplicaGrouping grouping(args->replicas, args->stride, effectiveGroupSize(*args));
    if (args->json) {
      printJson(groupingJson(grouping));
      return kExitOk;
    }
    fmt::print("{}: {} groups of {}\n", grouping.str(), grouping.numGroups(), grouping.groupSize());
    fmt::print("CommGroup: {}\n\n", commGroupName(grouping));
    fmt::print("{}", groupingTables(grouping, "index"));
    return kExitOk;
  };
}

}  // namespace tessera::cli
