// tessera explain CONFIG [--set PATH=VALUE]... [--json]: the resolved run
// config, where each value came from, and the replica groups of every
// sharding domain in use.
#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "tessera/json.hpp"
#include "tessera/replica_grouping.hpp"
#include "tessera/run_config.hpp"
#include "tessera/session_options.hpp"
#include "tessera/tensor_location.hpp"

namespace tessera::cli {
namespace {

struct ExplainArgs {
  ConfigArgs config;
  bool json = false;
};

using ProvenanceMap = std::map<std::string, Provenance>;

struct ValueLine {
  std::string path;
  std::string value;
  Provenance provenance;
};

bool hasEntryBelow(const ProvenanceMap& provenance, const std::string& pointer) {
  const std::string prefix = pointer + "/";
  const auto it = provenance.lower_bound(prefix);
  return it != provenance.end() && it->first.starts_with(prefix);
}

// One line per value the provenance map names. A container is split into its
// members when they have entries of their own (objects always, so that a
// value is never hidden inside a bigger one); otherwise it is shown whole,
// e.g. /model/layers = [784,256,128,10]. A value without an entry inherits
// the provenance of the closest enclosing one.
void collectValues(const nlohmann::json& node, const std::string& pointer, const ProvenanceMap& provenance,
                   Provenance inherited, std::vector<ValueLine>& out) {
  const auto entry = provenance.find(pointer);
  const Provenance here = entry != provenance.end() ? entry->second : inherited;
  const bool split =
      !node.empty() && (node.is_object() || (node.is_array() && hasEntryBelow(provenance, pointer)));
  if (!split) {
    out.push_back({pointer, node.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), here});
    return;
  }
  if (node.is_object()) {
    for (const auto& [key, value] : node.items()) {
      collectValues(value, pointer + "/" + jsonPointerToken(key), provenance, here, out);
    }
  } else {
    for (std::size_t i = 0; i < node.size(); ++i) {
      collectValues(node[i], pointer + "/" + std::to_string(i), provenance, here, out);
    }
  }
}

// A setting whose sharding domain matters: RTS is requested, or the domain
// differs from the default (all replicas).
struct DomainUse {
  std::string setting;  // JSON path of the shardingDomain
  TensorLocation location;
};

std::vector<DomainUse> domainsInUse(const SessionOptions& options) {
  const auto inUse = [](const TensorLocation& location) {
    return location.replicatedTensorSharding == ReplicatedTensorSharding::On ||
           location.shardingDomain != CommGroup{};
  };
  std::vector<DomainUse> uses;
  for (const auto& [category, name] : EnumNames<TensorCategory>::kNames) {
    const TensorLocation& location = options.locationSettings(category).location;
    if (!inUse(location)) continue;
    uses.push_back({fmt::format("{}/{}/location/shardingDomain", kSessionOptionsPath,
                                SessionOptions::locationSettingsKey(category)),
                    location});
  }
  for (const auto& [tensor, location] : options.tensorLocationSettingsOverride) {
    if (!inUse(location)) continue;
    uses.push_back({fmt::format("{}/tensorLocationSettingsOverride/{}/shardingDomain", kSessionOptionsPath,
                                jsonPointerToken(tensor)),
                    location});
  }
  return uses;
}

nlohmann::json replicationJson(const SessionOptions& options) {
  return {
      {"local", options.getLocalReplicationFactor()},
      {"global", options.getGlobalReplicationFactor()},
      {"offset", options.getGlobalReplicaOffset()},
      {"accumulationFactor", options.getAccumulationFactor()},
  };
}

nlohmann::json explainJson(const LoadedRunConfig& loaded) {
  const SessionOptions& options = loaded.config.sessionOptions;
  nlohmann::json provenance = nlohmann::json::object();
  for (const auto& [path, source] : loaded.provenance) provenance[path] = toString(source);
  nlohmann::json domains = nlohmann::json::array();
  for (const DomainUse& use : domainsInUse(options)) {
    const ReplicaGrouping grouping =
        use.location.shardingDomain.toReplicaGrouping(options.getGlobalReplicationFactor());
    nlohmann::json entry = groupingJson(grouping);
    entry["setting"] = use.setting;
    entry["commGroup"] = use.location.shardingDomain;
    domains.push_back(std::move(entry));
  }
  return {
      {"config", loaded.config},
      {"provenance", std::move(provenance)},
      {"shardingDomains", std::move(domains)},
      {"replication", replicationJson(options)},
  };
}

std::string indent(const std::string& text, std::string_view prefix) {
  std::string out;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    const std::size_t stop = end == std::string::npos ? text.size() : end + 1;
    if (text[start] != '\n') out += prefix;  // blank lines stay blank
    out.append(text, start, stop - start);
    start = stop;
  }
  return out;
}

void printText(const std::string& source, const LoadedRunConfig& loaded) {
  const SessionOptions& options = loaded.config.sessionOptions;
  fmt::print("{}: valid\n\n", source);

  std::vector<ValueLine> lines;
  collectValues(nlohmann::json(loaded.config), "", loaded.provenance, Provenance::Default, lines);
  std::size_t pathWidth = 0;
  std::size_t valueWidth = 0;
  for (const ValueLine& line : lines) {
    pathWidth = std::max(pathWidth, line.path.size());
    valueWidth = std::max(valueWidth, line.value.size());
  }
  fmt::print("Values (default, from the file, or from --set):\n");
  for (const ValueLine& line : lines) {
    fmt::print("{:<{}} = {:<{}}   ({})\n", line.path, pathWidth, line.value, valueWidth,
               toString(line.provenance));
  }

  fmt::print("\nReplication:\n");
  fmt::print("{}", formatTable({"local", "global", "offset", "accumulationFactor"},
                               {{std::to_string(options.getLocalReplicationFactor()),
                                 std::to_string(options.getGlobalReplicationFactor()),
                                 std::to_string(options.getGlobalReplicaOffset()),
                                 std::to_string(options.getAccumulationFactor())}}));

  const int64_t replicas = options.getGlobalReplicationFactor();
  const std::vector<DomainUse> uses = domainsInUse(options);
  if (uses.empty()) {
    fmt::print(
        "\nSharding domains: none (no setting has replicatedTensorSharding On or a shardingDomain "
        "other than the default)\n");
    return;
  }
  fmt::print(
      "\nSharding domains over {} replicas (a replica holds the shard numbered by its index in its "
      "group):\n",
      replicas);
  for (const DomainUse& use : uses) {
    const ReplicaGrouping grouping = use.location.shardingDomain.toReplicaGrouping(replicas);
    fmt::print("\n{}\n", use.setting);
    fmt::print("  {} -> {}, replicatedTensorSharding {}\n", use.location.shardingDomain.str(), grouping.str(),
               use.location.replicatedTensorSharding);
    fmt::print("{}", indent(groupingTables(grouping, "shard"), "  "));
  }
}

}  // namespace

Action attachExplain(CLI::App& command) {
  auto args = std::make_shared<ExplainArgs>();
  addConfigArgs(command, args->config);
  command.add_flag("--json", args->json, "Print JSON instead of text");
  return [args] {
    const LoadedRunConfig loaded = loadValidated(args->config);
    if (args->json) {
      printJson(explainJson(loaded));
    } else {
      printText(args->config.path, loaded);
    }
    return kExitOk;
  };
}

}  // namespace tessera::cli
