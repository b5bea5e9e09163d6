// tessera explain CONFIG [--set PATH=VALUE]... [--what-if PATH=VALUE]... [--json]:
// the resolved run config, where each value came from, the replica groups of
// every sharding domain in use, where every tensor of the compiled training
// program lives, its memory per replica and its modelled step time; with
// --what-if, the same for the config with those settings changed, beside it.
#include <algorithm>
#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "tessera/config_notes.hpp"
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
      {"dtype", toString(t.dtype)},
      {"storage", toString(t.storage)},
      {"loadTileSet", toString(t.loadTileSet)},
      {"storageTileSet", toString(t.storageTileSet)},
      {"replicatedTensorSharding", toString(t.replicatedTensorSharding)},
      {"shardingDomain", t.shardingDomain ? groupingJson(*t.shardingDomain) : nlohmann::json(nullptr)},
      {"shardElements", t.shardElements},
      {"bytesPerReplica", t.shardElements * dtypeBytes(t.dtype)},
      {"padding", t.padding},
      {"reason", t.reason},
  };
}

// The categories of the model state (ZeRO's weights, gradients and optimizer
// state, master weights included), in the order the report shows them.
constexpr std::array kModelStateCategories = {TensorCategory::Weight, TensorCategory::Accumulator,
                                              TensorCategory::OptimizerState};

int64_t totalOf(const CategoryMemory& c) { return c.computeTilesBytes + c.ioTilesBytes + c.streamingBytes; }

const CategoryMemory& categoryOf(const std::vector<CategoryMemory>& memory, TensorCategory category) {
  return memory.at(static_cast<std::size_t>(category));
}

nlohmann::json spacesJson(const CategoryMemory& c) {
  return {{"computeTiles", c.computeTilesBytes},
          {"ioTiles", c.ioTilesBytes},
          {"streaming", c.streamingBytes},
          {"total", totalOf(c)}};
}

// One replica's model state (held all step) by category and space, and the
// activations at each space's peak.
nlohmann::json breakdownJson(const ReplicaMemory& m) {
  nlohmann::json state = nlohmann::json::object();
  int64_t total = 0;
  for (const TensorCategory category : kModelStateCategories) {
    const CategoryMemory& c = categoryOf(m.resident, category);
    state[std::string(toString(category))] = spacesJson(c);
    total += totalOf(c);
  }
  state["totalBytes"] = total;
  nlohmann::json atPeak = nlohmann::json::object();
  for (const CategoryMemory& c : m.byCategory) atPeak[std::string(toString(c.category))] = spacesJson(c);
  return {{"modelState", std::move(state)},
          {"activations", spacesJson(categoryOf(m.byCategory, TensorCategory::Activation))},
          {"byCategoryAtPeak", std::move(atPeak)}};
}

nlohmann::json memoryJson(const MemoryReport& memory) {
  nlohmann::json perReplica = nlohmann::json::array();
  for (const ReplicaMemory& m : memory.perReplica) {
    nlohmann::json entry = {{"replica", m.replica},
                            {"computeTilesBytes", m.computeTilesBytes},
                            {"ioTilesBytes", m.ioTilesBytes},
                            {"streamingBytes", m.streamingBytes},
                            {"paddingBytes", m.paddingBytes}};
    entry.update(breakdownJson(m));
    perReplica.push_back(std::move(entry));
  }
  nlohmann::json shortfall = nullptr;
  if (const std::optional<MemoryShortfall> s = findShortfall(memory)) {
    shortfall = {{"replica", s->replica},
                 {"space", toString(s->space)},
                 {"neededBytes", s->neededBytes},
                 {"availableBytes", s->availableBytes}};
  }
  return {{"perReplica", std::move(perReplica)},       {"fits", shortfall.is_null()},
          {"shortfall", std::move(shortfall)},         {"computeTilesCapacity", memory.computeTilesCapacity},
          {"ioTilesCapacity", memory.ioTilesCapacity}, {"streamingCapacity", memory.streamingCapacity}};
}

// What one replica moves and computes in a step, per lane of the time model.
struct LaneTraffic {
  int64_t ops = 0;
  double seconds = 0.0;
  double bytes = 0.0;
  double flops = 0.0;
};

std::vector<std::pair<TimeLane, LaneTraffic>> trafficOf(const TimeReport& time) {
  std::vector<std::pair<TimeLane, LaneTraffic>> lanes;
  for (const auto& [lane, name] : EnumNames<TimeLane>::kNames) lanes.push_back({lane, {}});
  for (const OpTime& op : time.ops) {
    LaneTraffic& t = lanes.at(static_cast<std::size_t>(op.lane)).second;
    ++t.ops;
    t.seconds += op.duration;
    t.bytes += op.bytes;
    t.flops += op.flops;
  }
  return lanes;
}

nlohmann::json trafficJson(const TimeReport& time) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [lane, t] : trafficOf(time)) {
    out[std::string(toString(lane))] = {
        {"ops", t.ops}, {"seconds", t.seconds}, {"bytes", t.bytes}, {"flops", t.flops}};
  }
  return out;
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
  int64_t parameters = 0;
  for (const TensorPlacement& t : plan.tensors)
    if (t.category == TensorCategory::Weight) parameters += t.elements;
  return {{"parameters", parameters},
          {"tensors", std::move(tensors)},
          {"memory", memoryJson(plan.memory)},
          {"notApplied", std::move(notApplied)},
          {"traffic", trafficJson(plan.time)},
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
  nlohmann::json notes = nlohmann::json::array();
  for (const ConfigNote& note : configNotes(loaded.config))
    notes.push_back({{"id", noteId(note.code)}, {"path", note.path}, {"message", note.message}});
  nlohmann::json out = {
      {"config", loaded.config},
      {"provenance", std::move(provenance)},
      {"notes", std::move(notes)},
      {"shardingDomains", std::move(domains)},
      {"replication", replicationJson(options)},
  };
  out.update(planJson(planRun(loaded.config)));
  return out;
}

std::string bytes(int64_t n) {
  if (n >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(n) / (1 << 30));
  if (n >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(n) / (1 << 20));
  if (n >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(n) / (1 << 10));
  return fmt::format("{} B", n);
}

std::string seconds(double s) { return fmt::format("{:.3f} ms", s * 1e3); }

// The first local replica's memory by category: the model state held all step
// (the ZeRO paper's accounting), then the activations at each space's peak.
void printBreakdown(const RunPlan& plan) {
  const ReplicaMemory& m = plan.memory.perReplica.front();
  int64_t parameters = 0;
  for (const TensorPlacement& t : plan.tensors)
    if (t.category == TensorCategory::Weight) parameters += t.elements;
  const auto row = [](std::string label, const CategoryMemory& c) {
    return std::vector<std::string>{std::move(label), bytes(c.computeTilesBytes), bytes(c.ioTilesBytes),
                                    bytes(c.streamingBytes), bytes(totalOf(c))};
  };
  std::vector<std::vector<std::string>> rows;
  CategoryMemory state;
  for (const TensorCategory category : kModelStateCategories) {
    const CategoryMemory& c = categoryOf(m.resident, category);
    const char* label = category == TensorCategory::Weight        ? "weights"
                        : category == TensorCategory::Accumulator ? "gradient accumulators"
                                                                  : "optimizer state";
    rows.push_back(row(label, c));
    state.computeTilesBytes += c.computeTilesBytes;
    state.ioTilesBytes += c.ioTilesBytes;
    state.streamingBytes += c.streamingBytes;
  }
  rows.push_back(row("model state", state));
  rows.push_back(row("activations at the peak", categoryOf(m.byCategory, TensorCategory::Activation)));
  fmt::print(
      "\nMemory of replica {} by category (model state: held all step; activations: live at each "
      "space's peak):\n",
      m.replica);
  fmt::print("{}", formatTable({"", "compute tiles", "IO tiles", "streaming", "total"}, rows));
  if (parameters > 0) {
    fmt::print("model state: {} bytes for {} parameters, {:.3f} bytes per parameter\n", totalOf(state),
               parameters, static_cast<double>(totalOf(state)) / static_cast<double>(parameters));
  }
}

void printPlan(const RunPlan& plan) {
  std::vector<std::vector<std::string>> rows;
  for (const TensorPlacement& t : plan.tensors) {
    if (t.category == TensorCategory::Activation) continue;
    rows.push_back({t.name, std::string(toString(t.category)), std::string(toString(t.dtype)),
                    std::to_string(t.elements), std::string(toString(t.storage)),
                    std::string(toString(t.storageTileSet)),
                    t.shardingDomain ? fmt::format("{} over {}", toString(t.replicatedTensorSharding),
                                                   t.shardingDomain->groupSize())
                                     : std::string(toString(t.replicatedTensorSharding)),
                    std::to_string(t.shardElements), std::to_string(t.padding)});
  }
  fmt::print("\nVariables of the training program (activations: --json):\n");
  fmt::print("{}", formatTable({"name", "category", "dtype", "elements", "storage", "tiles", "RTS",
                                "per replica", "padding"},
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
  if (const std::optional<MemoryShortfall> s = findShortfall(plan.memory)) {
    fmt::print("Does not fit: replica {}, {}: the peak is {}, the capacity {}.\n", s->replica,
               toString(s->space), bytes(s->neededBytes), bytes(s->availableBytes));
  } else {
    fmt::print("Fits: every replica's peaks are within the capacities.\n");
  }
  if (!plan.memory.perReplica.empty()) printBreakdown(plan);
  if (!plan.notApplied.empty()) {
    fmt::print("\nNot applied:\n");
    for (const NotApplied& n : plan.notApplied) {
      fmt::print("  {}: {} {} -> {}: {}\n", n.tensor, n.downgrade.setting, n.downgrade.requested,
                 n.downgrade.applied, n.downgrade.why);
    }
  }
  rows.clear();
  for (const auto& [lane, traffic] : trafficOf(plan.time)) {
    rows.push_back({std::string(toString(lane)), std::to_string(traffic.ops),
                    bytes(static_cast<int64_t>(traffic.bytes)), fmt::format("{:.3g}", traffic.flops),
                    seconds(traffic.seconds)});
  }
  fmt::print("\nTraffic per step (one replica; bytes over the links and to or from streaming memory):\n");
  fmt::print("{}", formatTable({"lane", "ops", "bytes", "flops", "busy"}, rows));
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
    rows.push_back({std::to_string(a.replica),
                    fmt::format("{} -> {}", bytes(a.computeTilesBytes), bytes(b.computeTilesBytes)),
                    fmt::format("{} -> {}", bytes(a.ioTilesBytes), bytes(b.ioTilesBytes)),
                    fmt::format("{} -> {}", bytes(a.streamingBytes), bytes(b.streamingBytes))});
  }
  fmt::print("{}", formatTable({"replica", "compute tiles", "IO tiles", "streaming"}, rows));
  if (!before.memory.perReplica.empty() && !after.memory.perReplica.empty()) {
    const ReplicaMemory& a = before.memory.perReplica.front();
    const ReplicaMemory& b = after.memory.perReplica.front();
    std::vector<std::string> changes;
    for (const TensorCategory category : kModelStateCategories) {
      changes.push_back(fmt::format("{} {} -> {}", toString(category),
                                    bytes(totalOf(categoryOf(a.resident, category))),
                                    bytes(totalOf(categoryOf(b.resident, category)))));
    }
    fmt::print("model state of replica {}: {}\n", a.replica, fmt::join(changes, ", "));
  }
  fmt::print("modelled step time {} -> {}\n", seconds(before.time.stepSeconds),
             seconds(after.time.stepSeconds));
  for (const TensorPlacement& b : after.tensors) {
    if (b.category == TensorCategory::Activation) continue;
    for (const TensorPlacement& a : before.tensors) {
      if (a.name != b.name) continue;
      if (a.storage != b.storage || a.shardElements != b.shardElements ||
          a.storageTileSet != b.storageTileSet) {
        fmt::print("  {}: {} {} {} elements -> {} {} {} elements\n", b.name, toString(a.storage),
                   toString(a.storageTileSet), a.shardElements, toString(b.storage),
                   toString(b.storageTileSet), b.shardElements);
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
  const std::vector<ConfigNote> notes = configNotes(loaded.config);
  if (!notes.empty()) {
    fmt::print("Warnings (the config runs as written; docs/errors.md explains each id):\n");
    for (const ConfigNote& note : notes) fmt::print("  warning: {}\n", note.text());
    fmt::print("\n");
  }

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
  command
      .add_option("--what-if", args->whatIf,
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
