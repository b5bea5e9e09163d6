// tessera explain CONFIG [--set PATH=VALUE]... [--what-if PATH=VALUE]... [--json]:
// the resolved run config, where each value came from, the replica groups of
// every sharding domain in use, where every tensor of the compiled training
// program lives, its memory per replica and its modelled step time; with
// --what-if, the same for the config with those settings changed, beside it.
#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "tessera/json.hpp"
#include "tessera/placement.hpp"
#include "tessera/replica_grouping.hpp"
#include "tessera/run_config.hpp"
#include "tessera/session_options.hpp"
#include "tessera/tensor_location.hpp"

namespace tessera::cli {
namespace {

struct ExplainArgs {
  ConfigArgs config;
  std::vector<std::string> whatIf;
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

nlohmann::json tensorJson(const TensorPlacement& t) {
  return {
      {"name", t.name},
      {"category", toString(t.category)},
      {"elements", t.elements},
      {"storage", toString(t.storage)},
      {"loadTileSet", toString(t.loadTileSet)},
      {"storageTileSet", toString(t.storageTileSet)},
      {"replicatedTensorSharding", toString(t.replicatedTensorSharding)},
      {"shardingDomain", t.shardingDomain ? groupingJson(*t.shardingDomain) : nlohmann::json(nullptr)},
      {"shardElements", t.shardElements},
      {"bytesPerReplica", t.shardElements * 4},
      {"padding", t.padding},
      {"reason", t.reason},
  };
}

nlohmann::json memoryJson(const MemoryReport& memory) {
  nlohmann::json perReplica = nlohmann::json::array();
  for (const ReplicaMemory& m : memory.perReplica) {
    perReplica.push_back({{"replica", m.replica},
                          {"computeTilesBytes", m.computeTilesBytes},
                          {"ioTilesBytes", m.ioTilesBytes},
                          {"streamingBytes", m.streamingBytes},
                          {"paddingBytes", m.paddingBytes}});
  }
  return {{"perReplica", std::move(perReplica)},
          {"computeTilesCapacity", memory.computeTilesCapacity},
          {"ioTilesCapacity", memory.ioTilesCapacity},
          {"streamingCapacity", memory.streamingCapacity}};
}

// The compiled program of the config: tensors, memory, what was not applied
// and the modelled step time.
nlohmann::json planJson(const RunPlan& plan) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorPlacement& t : plan.tensors) tensors.push_back(tensorJson(t));
  nlohmann::json notApplied = nlohmann::json::array();
  for (const NotApplied& n : plan.notApplied) {
    notApplied.push_back({{"tensor", n.tensor},
                          {"setting", n.downgrade.setting},
                          {"requested", n.downgrade.requested},
                          {"applied", n.downgrade.applied},
                          {"why", n.downgrade.why}});
  }
  const TimeReport& time = plan.time;
  return {{"tensors", std::move(tensors)},
          {"memory", memoryJson(plan.memory)},
          {"notApplied", std::move(notApplied)},
          {"modelledStepTime",
           {{"seconds", time.stepSeconds},
            {"computeSeconds", time.computeSeconds},
            {"collectiveSeconds", time.collectiveSeconds},
            {"streamingSeconds", time.streamingSeconds},
            {"overlappedStreamingSeconds", time.overlappedStreamingSeconds}}}};
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
  nlohmann::json out = {
      {"config", loaded.config},
      {"provenance", std::move(provenance)},
      {"shardingDomains", std::move(domains)},
      {"replication", replicationJson(options)},
  };
  out.update(planJson(planRun(loaded.config)));
  return out;
}

std::string bytes(int64_t n) {
  if (n >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(n) / (1 << 20));
  if (n >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(n) / (1 << 10));
  return fmt::format("{} B", n);
}

std::string seconds(double s) { return fmt::format("{:.3f} ms", s * 1e3); }

void printPlan(const RunPlan& plan) {
  std::vector<std::vector<std::string>> rows;
  for (const TensorPlacement& t : plan.tensors) {
    if (t.category == TensorCategory::Activation) continue;
    rows.push_back({t.name, std::string(toString(t.category)), std::to_string(t.elements),
                    std::string(toString(t.storage)), std::string(toString(t.storageTileSet)),
                    t.shardingDomain ? fmt::format("{} over {}", toString(t.replicatedTensorSharding),
                                                   t.shardingDomain->groupSize())
                                     : std::string(toString(t.replicatedTensorSharding)),
                    std::to_string(t.shardElements), std::to_string(t.padding)});
  }
  fmt::print("\nVariables of the training program (activations: --json):\n");
  fmt::print("{}", formatTable({"name", "category", "elements", "storage", "tiles", "RTS", "per replica", "padding"},
                               rows));
  rows.clear();
  for (const ReplicaMemory& m : plan.memory.perReplica) {
    rows.push_back({std::to_string(m.replica), bytes(m.computeTilesBytes), bytes(m.ioTilesBytes),
                    bytes(m.streamingBytes)});
  }
  fmt::print("\nMemory per replica (peak; capacity: compute tiles {}, IO tiles {}, streaming {}):\n",
             bytes(plan.memory.computeTilesCapacity), bytes(plan.memory.ioTilesCapacity),
             bytes(plan.memory.streamingCapacity));
  fmt::print("{}", formatTable({"replica", "compute tiles", "IO tiles", "streaming"}, rows));
  if (!plan.notApplied.empty()) {
    fmt::print("\nNot applied:\n");
    for (const NotApplied& n : plan.notApplied) {
      fmt::print("  {}: {} {} -> {}: {}\n", n.tensor, n.downgrade.setting, n.downgrade.requested,
                 n.downgrade.applied, n.downgrade.why);
    }
  }
  const TimeReport& t = plan.time;
  fmt::print("\nModelled step time: {} (compute {}, collectives {}, streaming {}, overlapped streaming {})\n",
             seconds(t.stepSeconds), seconds(t.computeSeconds), seconds(t.collectiveSeconds),
             seconds(t.streamingSeconds), seconds(t.overlappedStreamingSeconds));
}

void printWhatIf(const std::vector<std::string>& settings, const RunPlan& before, const RunPlan& after) {
  fmt::print("\nWhat if {}:\n", fmt::join(settings, ", "));
  std::vector<std::vector<std::string>> rows;
  for (std::size_t r = 0; r < before.memory.perReplica.size() && r < after.memory.perReplica.size(); ++r) {
    const ReplicaMemory& a = before.memory.perReplica[r];
    const ReplicaMemory& b = after.memory.perReplica[r];
    rows.push_back({std::to_string(a.replica), fmt::format("{} -> {}", bytes(a.computeTilesBytes), bytes(b.computeTilesBytes)),
                    fmt::format("{} -> {}", bytes(a.ioTilesBytes), bytes(b.ioTilesBytes)),
                    fmt::format("{} -> {}", bytes(a.streamingBytes), bytes(b.streamingBytes))});
  }
  fmt::print("{}", formatTable({"replica", "compute tiles", "IO tiles", "streaming"}, rows));
  fmt::print("modelled step time {} -> {}\n", seconds(before.time.stepSeconds), seconds(after.time.stepSeconds));
  for (const TensorPlacement& b : after.tensors) {
    if (b.category == TensorCategory::Activation) continue;
    for (const TensorPlacement& a : before.tensors) {
      if (a.name != b.name) continue;
      if (a.storage != b.storage || a.shardElements != b.shardElements || a.storageTileSet != b.storageTileSet) {
        fmt::print("  {}: {} {} {} elements -> {} {} {} elements\n", b.name, toString(a.storage),
                   toString(a.storageTileSet), a.shardElements, toString(b.storage), toString(b.storageTileSet),
                   b.shardElements);
      }
    }
  }
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
  command.add_option("--what-if", args->whatIf,
                     "Also show the program with PATH set to VALUE (a JSON value, or a bare string), beside "
                     "the config's; repeatable")
      ->type_name("PATH=VALUE");
  command.add_flag("--json", args->json, "Print JSON instead of text");
  return [args] {
    const LoadedRunConfig loaded = loadValidated(args->config);
    std::optional<LoadedRunConfig> changed;
    if (!args->whatIf.empty()) {
      ConfigArgs whatIf = args->config;
      whatIf.overrides.insert(whatIf.overrides.end(), args->whatIf.begin(), args->whatIf.end());
      changed = loadValidated(whatIf);
    }
    if (args->json) {
      nlohmann::json out = explainJson(loaded);
      if (changed) {
        nlohmann::json after = planJson(planRun(changed->config));
        after["settings"] = args->whatIf;
        out["whatIf"] = std::move(after);
      }
      printJson(out);
    } else {
      printText(args->config.path, loaded);
      const RunPlan plan = planRun(loaded.config);
      printPlan(plan);
      if (changed) printWhatIf(args->whatIf, plan, planRun(changed->config));
    }
    return kExitOk;
  };
}

}  // namespace tessera::cli
