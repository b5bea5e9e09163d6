// tessera explain CONFIG [--set PATH=VALUE]... [--what-if PATH=VALUE]... [--values]
//                 [--per-replica] [--json]:
// the answer first (does the program fit, the peak per replica, the largest
// categories at it and the settings that lower it), then the sharding domains
// in use, where the tensors of the compiled training program live, memory
// and the modelled step time; with --what-if, the same for the config with
// those settings changed, beside it. Replicas alike, variables alike and
// groups of a domain are shown once with their count and replica ranges, so
// the report grows with the model, not with the replica count; --values adds
// every value of the config with where it came from, --per-replica every
// replica and group one by one. Exits with kExitDoesNotFit when the program
// does not fit the device.
#include <algorithm>
#include <array>
#include <cstddef>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "tessera/app/config_notes.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/lib/replica_grouping.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/app/run_plan.hpp"
#include "tessera/lib/session_options.hpp"
#include "tessera/lib/tensor_location.hpp"

namespace tessera::cli {
namespace {

struct ExplainArgs {
  ConfigArgs config;
  std::vector<std::string> whatIf;
  bool values = false;
  bool perReplica = false;
  bool json = false;
  int64_t leverPlans = 24;
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

// A domain's grouping by its parameters; its groups and each replica's group
// one by one only when asked for (they grow with the replica count).
nlohmann::json domainGroupingJson(const ReplicaGrouping& grouping, bool perReplica) {
  if (perReplica) return groupingJson(grouping);
  return {{"numReplicas", grouping.numReplicas()},
          {"stride", grouping.stride()},
          {"groupSize", grouping.groupSize()},
          {"numGroups", grouping.numGroups()}};
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
      // By its parameters: the groups of a domain are listed once, under
      // shardingDomains, with --per-replica.
      {"shardingDomain",
       t.shardingDomain ? domainGroupingJson(*t.shardingDomain, false) : nlohmann::json(nullptr)},
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

// Replicas alike: the same bytes in every space, by category, at the peaks
// and held all step. They differ, if at all, in the padding of their shards.
bool sameCategories(const std::vector<CategoryMemory>& a, const std::vector<CategoryMemory>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const CategoryMemory& x, const CategoryMemory& y) {
                      return x.category == y.category && x.computeTilesBytes == y.computeTilesBytes &&
                             x.ioTilesBytes == y.ioTilesBytes && x.streamingBytes == y.streamingBytes;
                    });
}

bool alike(const ReplicaMemory& a, const ReplicaMemory& b) {
  return a.computeTilesBytes == b.computeTilesBytes && a.ioTilesBytes == b.ioTilesBytes &&
         a.streamingBytes == b.streamingBytes && a.variableBytes == b.variableBytes &&
         a.peakActivationBytes == b.peakActivationBytes && sameCategories(a.byCategory, b.byCategory) &&
         sameCategories(a.resident, b.resident);
}

// Inclusive runs of consecutive replica indices.
using ReplicaRange = std::pair<int64_t, int64_t>;

// The replicas of one memory class, shown once with their count and ranges.
struct ReplicaClass {
  const ReplicaMemory* memory = nullptr;  // its first replica
  std::vector<ReplicaRange> ranges;
  int64_t count = 0;
  int64_t minPaddingBytes = 0;
  int64_t maxPaddingBytes = 0;
};

std::vector<ReplicaClass> replicaClasses(const MemoryReport& memory) {
  std::vector<ReplicaClass> classes;
  for (const ReplicaMemory& m : memory.perReplica) {
    auto it = std::find_if(classes.begin(), classes.end(),
                           [&](const ReplicaClass& c) { return c.memory->ipu == m.ipu && alike(*c.memory, m); });
    if (it == classes.end()) {
      classes.push_back({&m, {}, 0, m.paddingBytes, m.paddingBytes});
      it = std::prev(classes.end());
    }
    if (!it->ranges.empty() && it->ranges.back().second + 1 == m.replica) {
      it->ranges.back().second = m.replica;
    } else {
      it->ranges.emplace_back(m.replica, m.replica);
    }
    ++it->count;
    it->minPaddingBytes = std::min(it->minPaddingBytes, m.paddingBytes);
    it->maxPaddingBytes = std::max(it->maxPaddingBytes, m.paddingBytes);
  }
  return classes;
}

nlohmann::json rangesJson(const std::vector<ReplicaRange>& ranges) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [first, last] : ranges) out.push_back({first, last});
  return out;
}

// "0-63", "0-15, 32-47"; past `shown` ranges, how many more.
std::string rangesText(const std::vector<ReplicaRange>& ranges, std::size_t shown = 4) {
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < ranges.size() && i < shown; ++i) {
    const auto& [first, last] = ranges[i];
    parts.push_back(first == last ? std::to_string(first) : fmt::format("{}-{}", first, last));
  }
  std::string text = fmt::format("{}", fmt::join(parts, ", "));
  if (ranges.size() > shown) text += fmt::format(" and {} more ranges", ranges.size() - shown);
  return text;
}

nlohmann::json replicaMemoryJson(const ReplicaMemory& m) {
  nlohmann::json entry = {{"computeTilesBytes", m.computeTilesBytes},
                          {"ioTilesBytes", m.ioTilesBytes},
                          {"streamingBytes", m.streamingBytes}};
  entry.update(breakdownJson(m));
  return entry;
}

// Every fact of the memory plan, with replicas alike once ("replicaClasses":
// their ranges, count and padding bounds); "perReplica" lists them one by one
// when asked for.
nlohmann::json memoryJson(const MemoryReport& memory, bool perReplica) {
  nlohmann::json classes = nlohmann::json::array();
  for (const ReplicaClass& c : replicaClasses(memory)) {
    nlohmann::json entry = {{"replicas", rangesJson(c.ranges)},
                            {"ipu", c.memory->ipu},
                            {"count", c.count},
                            {"paddingBytes", {{"min", c.minPaddingBytes}, {"max", c.maxPaddingBytes}}}};
    entry.update(replicaMemoryJson(*c.memory));
    classes.push_back(std::move(entry));
  }
  nlohmann::json shortfall = nullptr;
  if (const std::optional<MemoryShortfall> s = findShortfall(memory)) {
    shortfall = {{"replica", s->replica},
                 {"ipu", s->ipu},
                 {"space", toString(s->space)},
                 {"neededBytes", s->neededBytes},
                 {"availableBytes", s->availableBytes}};
  }
  nlohmann::json out = {{"replicaClasses", std::move(classes)},
                        {"fits", shortfall.is_null()},
                        {"shortfall", std::move(shortfall)},
                        {"paddingBytes", memory.paddingBytes},
                        {"ipusPerReplica", memory.ipusPerReplica},
                        {"computeTilesCapacity", memory.computeTilesCapacity},
                        {"ioTilesCapacity", memory.ioTilesCapacity},
                        {"streamingCapacity", memory.streamingCapacity}};
  if (perReplica) {
    nlohmann::json replicas = nlohmann::json::array();
    for (const ReplicaMemory& m : memory.perReplica) {
      nlohmann::json entry = {{"replica", m.replica}, {"ipu", m.ipu}, {"paddingBytes", m.paddingBytes}};
      entry.update(replicaMemoryJson(m));
      replicas.push_back(std::move(entry));
    }
    out["perReplica"] = std::move(replicas);
  }
  return out;
}

nlohmann::json changesJson(const std::vector<ConfigChange>& changes) {
  nlohmann::json out = nlohmann::json::array();
  for (const ConfigChange& c : changes) out.push_back({{"path", c.path}, {"value", nlohmann::json::parse(c.value)}});
  return out;
}

nlohmann::json leverPlanJson(const LeverPlan& p, const LeverSearch& search) {
  nlohmann::json levers = nlohmann::json::array();
  std::vector<ConfigChange> all;
  for (const Lever& l : p.levers) {
    levers.push_back({{"name", l.name}, {"changes", changesJson(l.changes)}, {"cost", l.cost}});
    all.insert(all.end(), l.changes.begin(), l.changes.end());
  }
  return {{"levers", std::move(levers)},
          {"changes", changesJson(all)},
          {"neededBytes", p.peakBytes},
          {"savingBytes", search.peakBytes - p.peakBytes},
          {"fits", p.fits},
          {"stepSeconds", p.stepSeconds},
          {"replicas", p.replicas},
          {"ipusPerReplica", p.ipusPerReplica},
          {"globalBatch", p.globalBatch}};
}

// Each lever alone ("levers": its first setting and value, all its changes,
// its peak and step), the combinations that fit, fastest first.
nlohmann::json suggestionsJson(const LeverSearch& search) {
  nlohmann::json single = nlohmann::json::array();
  for (const LeverPlan& p : search.single) {
    nlohmann::json entry = leverPlanJson(p, search);
    const Lever& lever = p.levers.front();
    entry["name"] = lever.name;
    entry["cost"] = lever.cost;
    entry["setting"] = lever.changes.front().path;
    entry["value"] = nlohmann::json::parse(lever.changes.front().value);
    entry.erase("levers");
    single.push_back(std::move(entry));
  }
  return single;
}

nlohmann::json combinationsJson(const LeverSearch& search) {
  nlohmann::json fitting = nlohmann::json::array();
  for (const LeverPlan& p : search.fitting) fitting.push_back(leverPlanJson(p, search));
  return fitting;
}

// Pipelining: the stages, each IPU's stashes and the phases of a step.
nlohmann::json pipelineJson(const RunPlan& plan) {
  const PipelineTime& p = plan.time.pipeline;
  if (!p.enabled) return {{"enabled", false}};
  nlohmann::json stash = nlohmann::json::array();
  for (const ReplicaMemory& m : plan.memory.perReplica)
    if (m.replica == plan.memory.perReplica.front().replica) stash.push_back({{"ipu", m.ipu}, {"bytes", m.stashBytes}});
  return {{"enabled", true},
          {"forwardStages", p.forwardStages},
          {"stages", p.stages},
          {"microBatches", p.microBatches},
          {"cycles", p.cycles},
          {"fillSeconds", p.fillSeconds},
          {"mainSeconds", p.mainSeconds},
          {"flushSeconds", p.flushSeconds},
          {"bubbleFraction", p.bubbleFraction},
          {"stageSeconds", p.stageSeconds},
          {"stashBytes", std::move(stash)}};
}

// Phased execution: each phase's IPU, compute and streaming traffic.
nlohmann::json phasesJson(const TimeReport& time) {
  nlohmann::json phases = nlohmann::json::array();
  for (const PhaseTime& p : time.phases) {
    phases.push_back({{"phase", p.phase},
                      {"ipu", p.ipu},
                      {"computeSeconds", p.computeSeconds},
                      {"loadBytes", p.loadBytes},
                      {"storeBytes", p.storeBytes},
                      {"streamingSeconds", p.streamingSeconds},
                      {"overlappedSeconds", p.overlappedSeconds},
                      {"ipuCopyBytes", p.ipuCopyBytes}});
  }
  return phases;
}

// The compiled program of the config: tensors, memory, what was not applied,
// the modelled step time and, when it does not fit, the settings that lower
// the short space's peak.
nlohmann::json planJson(const RunPlan& plan, bool perReplica, const LeverSearch& levers) {
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
          {"memory", memoryJson(plan.memory, perReplica)},
          {"levers", suggestionsJson(levers)},
          {"leverCombinations", combinationsJson(levers)},
          {"leverSearch",
           {{"space", toString(levers.space)},
            {"peakBytes", levers.peakBytes},
            {"availableBytes", levers.availableBytes},
            {"plans", levers.plans}}},
          {"notApplied", std::move(notApplied)},
          {"traffic", trafficJson(plan.time)},
          {"modelledStepTime",
           {{"seconds", time.stepSeconds},
            {"computeSeconds", time.computeSeconds},
            {"collectiveSeconds", time.collectiveSeconds},
            {"streamingSeconds", time.streamingSeconds},
            {"overlappedStreamingSeconds", time.overlappedStreamingSeconds},
            {"ipuCopySeconds", time.ipuCopySeconds},
            {"deviceSeconds", time.deviceSeconds},
            {"hostSeconds", time.hostSeconds},
            {"hostBytes", time.hostBytes}}},
          {"ipuCopies", {{"count", time.ipuCopies}, {"bytes", time.ipuCopyBytes}}},
          {"hostStreams", hostStreamsJson(time)},
          {"pipeline", pipelineJson(plan)},
          {"phases", phasesJson(time)}};
}

// The config, where its values came from, its notes and sharding domains.
nlohmann::json configJson(const LoadedRunConfig& loaded, bool perReplica) {
  const SessionOptions& options = loaded.config.sessionOptions;
  nlohmann::json provenance = nlohmann::json::object();
  for (const auto& [path, source] : loaded.provenance) provenance[path] = toString(source);
  nlohmann::json domains = nlohmann::json::array();
  for (const DomainUse& use : domainsInUse(options)) {
    const ReplicaGrouping grouping =
        use.location.shardingDomain.toReplicaGrouping(options.getGlobalReplicationFactor());
    nlohmann::json entry = domainGroupingJson(grouping, perReplica);
    entry["setting"] = use.setting;
    entry["commGroup"] = use.location.shardingDomain;
    domains.push_back(std::move(entry));
  }
  nlohmann::json notes = nlohmann::json::array();
  for (const ConfigNote& note : configNotes(loaded.config))
    notes.push_back({{"id", noteId(note.code)}, {"path", note.path}, {"message", note.message}});
  return {
      {"config", loaded.config},
      {"provenance", std::move(provenance)},
      {"notes", std::move(notes)},
      {"shardingDomains", std::move(domains)},
      {"replication", replicationJson(options)},
  };
}

std::string bytes(int64_t n) {
  if (n >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(n) / (1 << 30));
  if (n >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(n) / (1 << 20));
  if (n >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(n) / (1 << 10));
  return fmt::format("{} B", n);
}

std::string seconds(double s) { return fmt::format("{:.3f} ms", s * 1e3); }

std::string_view categoryLabel(TensorCategory category) {
  switch (category) {
    case TensorCategory::Weight: return "weights";
    case TensorCategory::Accumulator: return "gradient accumulators";
    case TensorCategory::OptimizerState: return "optimizer state";
    case TensorCategory::Activation: return "activations";
  }
  return "tensors";
}

std::string percentOf(int64_t used, int64_t capacity) {
  if (capacity <= 0) return used > 0 ? "over" : "0 %";
  return fmt::format("{:.0f} %", 100.0 * static_cast<double>(used) / static_cast<double>(capacity));
}

// The combinations that fit, fastest first, each with its settings and the
// cost of each lever; then every lever alone.
void printLevers(const LeverSearch& search, std::string_view space) {
  const auto effect = [&](const LeverPlan& p) {
    return fmt::format("{} {} -> {} per IPU{}; modelled step {} -> {}{}", space, bytes(search.peakBytes),
                       bytes(p.peakBytes), p.fits ? ", fits" : ", still too large", seconds(search.stepSeconds),
                       seconds(p.stepSeconds),
                       p.globalBatch != search.globalBatch
                           ? fmt::format("; {} replicas x {} IPUs, global batch {} -> {}", p.replicas,
                                         p.ipusPerReplica, search.globalBatch, p.globalBatch)
                           : std::string());
  };
  constexpr std::size_t kShown = 3;
  if (search.fitting.empty()) {
    fmt::print("Levers: no combination found that fits ({} plans); use a smaller batch, sequence or model\n",
               search.plans);
  } else {
    fmt::print("Levers that make it fit (each combination planned; the fastest modelled step first; {} plans):\n",
               search.plans);
    for (std::size_t i = 0; i < search.fitting.size() && i < kShown; ++i) {
      const LeverPlan& p = search.fitting[i];
      fmt::print("  {}. {}: {}\n", i + 1, leverNames(p), effect(p));
      std::vector<std::string> sets;
      for (const Lever& l : p.levers)
        for (const ConfigChange& c : l.changes) sets.push_back(setArgument(c));
      fmt::print("     {}\n", fmt::join(sets, " "));
      for (const Lever& l : p.levers) fmt::print("     {}: {}\n", l.name, l.cost);
    }
    if (search.fitting.size() > kShown)
      fmt::print("  and {} more combinations that fit (--json)\n", search.fitting.size() - kShown);
  }
  if (search.single.empty()) return;
  fmt::print("Each lever alone:\n");
  for (const LeverPlan& p : search.single) fmt::print("  {}: {}\n", leverNames(p), effect(p));
}

// The answer first: whether the program fits, the peak of each space per
// replica (replicas alike once, with their ranges), the largest categories
// at the peak that decides, and the settings that lower it.
void printAnswer(const std::string& source, const RunPlan& plan, const LeverSearch& levers) {
  const MemoryReport& memory = plan.memory;
  const std::vector<ReplicaClass> classes = replicaClasses(memory);
  const std::optional<MemoryShortfall> shortfall = findShortfall(memory);
  const auto replicaCount = static_cast<int64_t>(memory.perReplica.size());
  // With several IPUs per replica every row is one IPU of the replicas in
  // its ranges.
  const bool ipus = memory.ipusPerReplica > 1;
  const std::string unit = ipus ? "IPU" : "replica";
  const std::string alikeText =
      classes.size() == 1 ? fmt::format("all {} {}s alike", replicaCount, unit)
                          : fmt::format("{} kinds of {} over {}", classes.size(), unit, replicaCount);
  if (shortfall) {
    fmt::print("{}: valid; does not fit: {} need {} per {}, {} available ({}; first short: replica {}{})\n",
               source, spaceLabel(shortfall->space), bytes(shortfall->neededBytes), unit,
               bytes(shortfall->availableBytes), alikeText, shortfall->replica,
               ipus ? fmt::format(", IPU {}", shortfall->ipu) : std::string());
  } else {
    fmt::print("{}: valid; fits: every {}'s peaks are within the capacities ({})\n", source, unit, alikeText);
  }
  std::vector<std::vector<std::string>> rows;
  for (const ReplicaClass& c : classes) {
    const ReplicaMemory& m = *c.memory;
    rows.push_back(
        {rangesText(c.ranges), std::to_string(m.ipu), std::to_string(c.count),
         fmt::format("{} ({})", bytes(m.computeTilesBytes),
                     percentOf(m.computeTilesBytes, memory.computeTilesCapacity)),
         fmt::format("{} ({})", bytes(m.ioTilesBytes), percentOf(m.ioTilesBytes, memory.ioTilesCapacity)),
         fmt::format("{} ({})", bytes(m.streamingBytes),
                     percentOf(m.streamingBytes, memory.streamingCapacity)),
         c.minPaddingBytes == c.maxPaddingBytes
             ? bytes(c.minPaddingBytes)
             : fmt::format("{} to {}", bytes(c.minPaddingBytes), bytes(c.maxPaddingBytes))});
  }
  rows.push_back({"capacity", "", "", bytes(memory.computeTilesCapacity), bytes(memory.ioTilesCapacity),
                  bytes(memory.streamingCapacity), ""});
  std::vector<std::string> header = {"replicas", "IPU", "count", "compute tiles", "IO tiles", "streaming",
                                     "shard padding"};
  if (!ipus) {
    header.erase(header.begin() + 1);
    for (std::vector<std::string>& row : rows) row.erase(row.begin() + 1);
  }
  fmt::print("Peak per {}:\n", unit);
  fmt::print("{}", indent(formatTable(header, rows), "  "));
  if (memory.perReplica.empty()) return;
  // The space that decides: the short one, else the fullest on chip.
  const ReplicaMemory* replica = &memory.perReplica.front();
  MemorySpace space = MemorySpace::ComputeTiles;
  if (shortfall) {
    space = shortfall->space;
    for (const ReplicaMemory& m : memory.perReplica)
      if (m.replica == shortfall->replica && m.ipu == shortfall->ipu) replica = &m;
  } else if (memory.ioTilesCapacity > 0 && memory.computeTilesCapacity > 0 &&
             static_cast<double>(replica->ioTilesBytes) / static_cast<double>(memory.ioTilesCapacity) >
                 static_cast<double>(replica->computeTilesBytes) /
                     static_cast<double>(memory.computeTilesCapacity)) {
    space = MemorySpace::IOTiles;
  }
  std::vector<std::pair<int64_t, TensorCategory>> categories;
  for (const CategoryMemory& c : replica->byCategory)
    if (c.bytesIn(space) > 0) categories.emplace_back(c.bytesIn(space), c.category);
  std::sort(categories.begin(), categories.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> parts;
  for (const auto& [n, category] : categories)
    parts.push_back(fmt::format("{} {}", categoryLabel(category), bytes(n)));
  const MemoryPeak& peak = replica->peak(space);
  fmt::print("Largest at the {} peak of replica {}{}{}: {}\n", spaceLabel(space), replica->replica,
             ipus ? fmt::format(", IPU {}", replica->ipu) : std::string(),
             peak.op.empty() ? std::string() : fmt::format(" (during op \"{}\")", peak.op),
             parts.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(parts, ", ")));
  parts.clear();
  for (std::size_t i = 0; i < peak.largest.size() && i < 3; ++i)
    parts.push_back(fmt::format("{} {}", peak.largest[i].name, bytes(peak.largest[i].bytes)));
  if (!parts.empty()) fmt::print("  largest tensors there: {}\n", fmt::join(parts, ", "));
  if (!shortfall) return;
  printLevers(levers, spaceLabel(shortfall->space));
}

// "h.*.attn.qkv.weight": a name with each run of digits a wildcard, so that
// the tensors of repeated layers share one.
std::string namePattern(const std::string& name) {
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] >= '0' && name[i] <= '9') {
      if (i == 0 || name[i - 1] < '0' || name[i - 1] > '9') out += '*';
    } else {
      out += name[i];
    }
  }
  return out;
}

std::string rtsText(const TensorPlacement& t) {
  return t.shardingDomain
             ? fmt::format("{} over {}", toString(t.replicatedTensorSharding), t.shardingDomain->groupSize())
             : std::string(toString(t.replicatedTensorSharding));
}

// Variables alike (the same name up to layer numbers, and the same category,
// type, size and placement) are one row with their count.
void printVariables(const RunPlan& plan) {
  struct Row {
    std::vector<std::string> cells;  // without the count
    std::string firstName;
    int64_t count = 0;
  };
  std::vector<Row> rows;
  std::map<std::vector<std::string>, std::size_t> index;
  for (const TensorPlacement& t : plan.tensors) {
    if (t.category == TensorCategory::Activation) continue;
    std::vector<std::string> cells = {namePattern(t.name),
                                      std::string(toString(t.category)),
                                      std::string(toString(t.dtype)),
                                      std::to_string(t.elements),
                                      std::string(toString(t.storage)),
                                      std::string(toString(t.storageTileSet)),
                                      rtsText(t),
                                      std::to_string(t.shardElements),
                                      std::to_string(t.padding)};
    const auto [it, added] = index.try_emplace(cells, rows.size());
    if (added) rows.push_back({std::move(cells), t.name, 0});
    ++rows[it->second].count;
  }
  std::vector<std::vector<std::string>> table;
  for (Row& row : rows) {
    if (row.count == 1) row.cells[0] = row.firstName;
    row.cells.insert(row.cells.begin() + 1, std::to_string(row.count));
    table.push_back(std::move(row.cells));
  }
  fmt::print(
      "\nVariables of the training program (alike once, * for layer numbers; every tensor: --json):\n");
  fmt::print("{}", formatTable({"name", "count", "category", "dtype", "elements", "storage", "tiles", "RTS",
                                "per replica", "padding"},
                               table));
}

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
    rows.push_back(row(std::string(categoryLabel(category)), c));
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

void printPlan(const RunPlan& plan, bool perReplica) {
  printVariables(plan);
  if (perReplica) {
    std::vector<std::vector<std::string>> rows;
    for (const ReplicaMemory& m : plan.memory.perReplica) {
      rows.push_back({plan.memory.ipusPerReplica > 1 ? fmt::format("{} IPU {}", m.replica, m.ipu)
                                                     : std::to_string(m.replica),
                      bytes(m.computeTilesBytes), bytes(m.ioTilesBytes), bytes(m.streamingBytes),
                      bytes(m.paddingBytes)});
    }
    fmt::print("\nMemory per replica (peak; capacity: compute tiles {}, IO tiles {}, streaming {}):\n",
               bytes(plan.memory.computeTilesCapacity), bytes(plan.memory.ioTilesCapacity),
               bytes(plan.memory.streamingCapacity));
    fmt::print("{}",
               formatTable({"replica", "compute tiles", "IO tiles", "streaming", "shard padding"}, rows));
  }
  if (!plan.memory.perReplica.empty()) printBreakdown(plan);
  if (!plan.notApplied.empty()) {
    fmt::print("\nNot applied:\n");
    for (const NotApplied& n : plan.notApplied) {
      fmt::print("  {}: {} {} -> {}: {}\n", n.tensor, n.downgrade.setting, n.downgrade.requested,
                 n.downgrade.applied, n.downgrade.why);
    }
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& [lane, traffic] : trafficOf(plan.time)) {
    // The IPU links appear with several IPUs per replica.
    if (lane == TimeLane::IpuLink && traffic.ops == 0) continue;
    rows.push_back({std::string(toString(lane)), std::to_string(traffic.ops),
                    bytes(static_cast<int64_t>(traffic.bytes)), fmt::format("{:.3g}", traffic.flops),
                    seconds(traffic.seconds)});
  }
  fmt::print(
      "\nTraffic per step (one replica; bytes over the links, to or from streaming memory, and over the host "
      "link for one batch):\n");
  fmt::print("{}", formatTable({"lane", "ops", "bytes", "flops", "busy"}, rows));
  const TimeReport& t = plan.time;
  fmt::print("\nModelled step time: {} (compute {}, collectives {}, streaming {}, overlapped streaming {}{})\n",
             seconds(t.stepSeconds), seconds(t.computeSeconds), seconds(t.collectiveSeconds),
             seconds(t.streamingSeconds), seconds(t.overlappedStreamingSeconds),
             t.ipuCopies > 0 ? fmt::format(", {} copies between IPUs {}: {}", t.ipuCopies,
                                           bytes(static_cast<int64_t>(t.ipuCopyBytes)), seconds(t.ipuCopySeconds))
                             : std::string());
  const std::string streams = hostStreamsTable(t);
  if (!streams.empty()) fmt::print("\n{}", streams);
  if (t.pipeline.enabled) {
    const PipelineTime& p = t.pipeline;
    std::vector<std::string> stashes;
    for (const ReplicaMemory& m : plan.memory.perReplica)
      if (m.replica == plan.memory.perReplica.front().replica)
        stashes.push_back(fmt::format("IPU {} {}", m.ipu, bytes(m.stashBytes)));
    fmt::print("Pipelined: {} forward stages ({} with the backward), {} micro-batches in {} cycles: fill {}, main "
               "{}, flush {}; bubble {:.1f} %; stashes {}\n",
               p.forwardStages, p.stages, p.microBatches, p.cycles, seconds(p.fillSeconds), seconds(p.mainSeconds),
               seconds(p.flushSeconds), 100.0 * p.bubbleFraction, fmt::join(stashes, ", "));
  }
  if (!t.phases.empty()) {
    fmt::print("Execution phases ({} with the backward): phase, IPU, compute, loaded, stored, streamed "
               "(overlapped)\n",
               t.phases.size());
    for (const PhaseTime& p : t.phases) {
      fmt::print("  {:>3}  IPU {}  {:>10}  {:>10}  {:>10}  {} ({})\n", p.phase, p.ipu, seconds(p.computeSeconds),
                 bytes(static_cast<int64_t>(p.loadBytes)), bytes(static_cast<int64_t>(p.storeBytes)),
                 seconds(p.streamingSeconds), seconds(p.overlappedSeconds));
    }
  }
}

void printWhatIf(const std::vector<std::string>& settings, const RunPlan& before, const RunPlan& after) {
  fmt::print("\nWhat if {}:\n", fmt::join(settings, ", "));
  // Replicas whose memory is alike before and after, once with their ranges.
  struct Change {
    const ReplicaMemory* a;
    const ReplicaMemory* b;
    std::vector<ReplicaRange> ranges;
  };
  std::vector<Change> changes;
  for (std::size_t r = 0; r < before.memory.perReplica.size() && r < after.memory.perReplica.size(); ++r) {
    const ReplicaMemory& a = before.memory.perReplica[r];
    const ReplicaMemory& b = after.memory.perReplica[r];
    auto it = std::find_if(changes.begin(), changes.end(),
                           [&](const Change& c) { return alike(*c.a, a) && alike(*c.b, b); });
    if (it == changes.end()) {
      changes.push_back({&a, &b, {}});
      it = std::prev(changes.end());
    }
    if (!it->ranges.empty() && it->ranges.back().second + 1 == a.replica) {
      it->ranges.back().second = a.replica;
    } else {
      it->ranges.emplace_back(a.replica, a.replica);
    }
  }
  std::vector<std::vector<std::string>> rows;
  for (const Change& c : changes) {
    rows.push_back({rangesText(c.ranges),
                    fmt::format("{} -> {}", bytes(c.a->computeTilesBytes), bytes(c.b->computeTilesBytes)),
                    fmt::format("{} -> {}", bytes(c.a->ioTilesBytes), bytes(c.b->ioTilesBytes)),
                    fmt::format("{} -> {}", bytes(c.a->streamingBytes), bytes(c.b->streamingBytes))});
  }
  fmt::print("{}", formatTable({"replicas", "compute tiles", "IO tiles", "streaming"}, rows));
  if (!before.memory.perReplica.empty() && !after.memory.perReplica.empty()) {
    const ReplicaMemory& a = before.memory.perReplica.front();
    const ReplicaMemory& b = after.memory.perReplica.front();
    std::vector<std::string> categories;
    for (const TensorCategory category : kModelStateCategories) {
      categories.push_back(fmt::format("{} {} -> {}", toString(category),
                                       bytes(totalOf(categoryOf(a.resident, category))),
                                       bytes(totalOf(categoryOf(b.resident, category)))));
    }
    fmt::print("model state of replica {}: {}\n", a.replica, fmt::join(categories, ", "));
  }
  fmt::print("modelled step time {} -> {}\n", seconds(before.time.stepSeconds),
             seconds(after.time.stepSeconds));
  // Variables whose placement changes, those alike once with their count.
  std::map<std::string, const TensorPlacement*> previous;
  for (const TensorPlacement& a : before.tensors)
    if (a.category != TensorCategory::Activation) previous.emplace(a.name, &a);
  std::vector<std::pair<std::string, int64_t>> lines;
  std::map<std::string, std::size_t> index;
  std::vector<std::string> firstNames;
  for (const TensorPlacement& b : after.tensors) {
    if (b.category == TensorCategory::Activation) continue;
    const auto found = previous.find(b.name);
    if (found == previous.end()) continue;
    const TensorPlacement& a = *found->second;
    if (a.storage == b.storage && a.shardElements == b.shardElements && a.storageTileSet == b.storageTileSet)
      continue;
    const std::string change =
        fmt::format("{} {} {} elements -> {} {} {} elements", toString(a.storage), toString(a.storageTileSet),
                    a.shardElements, toString(b.storage), toString(b.storageTileSet), b.shardElements);
    const std::string key = namePattern(b.name) + ": " + change;
    const auto [it, added] = index.try_emplace(key, lines.size());
    if (added) {
      lines.emplace_back(change, 0);
      firstNames.push_back(b.name);
    }
    ++lines[it->second].second;
  }
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& [change, count] = lines[i];
    if (count == 1) {
      fmt::print("  {}: {}\n", firstNames[i], change);
    } else {
      fmt::print("  {} ({} alike): {}\n", namePattern(firstNames[i]), count, change);
    }
  }
}

// "0-15", or "0, 4, ..., 60" for a stride: the replicas of a group.
std::string groupText(const ReplicaGrouping& grouping, int64_t group) {
  const int64_t first = grouping.replicaAt(group, 0);
  const int64_t last = grouping.replicaAt(group, grouping.groupSize() - 1);
  if (grouping.groupSize() == 1) return std::to_string(first);
  if (grouping.stride() == 1) return fmt::format("{}-{}", first, last);
  if (grouping.groupSize() == 2) return fmt::format("{} {}", first, last);
  return fmt::format("{} {} ... {} (every {})", first, first + grouping.stride(), last, grouping.stride());
}

// The groups of a domain by their rule: the first two and the last, each
// with its replicas, whatever the replica count.
std::string groupsSummary(const ReplicaGrouping& grouping) {
  std::string out = fmt::format("{} groups of {}: ", grouping.numGroups(), grouping.groupSize());
  std::vector<std::string> parts;
  const int64_t groups = grouping.numGroups();
  for (int64_t g = 0; g < groups && g < 2; ++g)
    parts.push_back(fmt::format("group {}: {}", g, groupText(grouping, g)));
  if (groups > 3) parts.emplace_back("...");
  if (groups > 2) parts.push_back(fmt::format("group {}: {}", groups - 1, groupText(grouping, groups - 1)));
  return out + fmt::format("{}", fmt::join(parts, "; ")) + "\n";
}

void printConfig(const LoadedRunConfig& loaded, bool values, bool perReplica) {
  const SessionOptions& options = loaded.config.sessionOptions;
  const std::vector<ConfigNote> notes = configNotes(loaded.config);
  if (!notes.empty()) {
    fmt::print("\nWarnings (the config runs as written; docs/errors.md explains each id):\n");
    for (const ConfigNote& note : notes) fmt::print("  warning: {}\n", note.text());
  }

  if (values) {
    std::vector<ValueLine> lines;
    collectValues(nlohmann::json(loaded.config), "", loaded.provenance, Provenance::Default, lines);
    std::size_t pathWidth = 0;
    std::size_t valueWidth = 0;
    for (const ValueLine& line : lines) {
      pathWidth = std::max(pathWidth, line.path.size());
      valueWidth = std::max(valueWidth, line.value.size());
    }
    fmt::print("\nValues (default, from the file, or from --set):\n");
    for (const ValueLine& line : lines) {
      fmt::print("{:<{}} = {:<{}}   ({})\n", line.path, pathWidth, line.value, valueWidth,
                 toString(line.provenance));
    }
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
      "group; settings with the same domain once):\n",
      replicas);
  // Settings with the same domain and RTS, once.
  std::vector<std::pair<const DomainUse*, std::vector<std::string>>> distinct;
  for (const DomainUse& use : uses) {
    const auto it = std::find_if(distinct.begin(), distinct.end(), [&](const auto& d) {
      return d.first->location.shardingDomain == use.location.shardingDomain &&
             d.first->location.replicatedTensorSharding == use.location.replicatedTensorSharding;
    });
    if (it == distinct.end()) {
      distinct.push_back({&use, {use.setting}});
    } else {
      it->second.push_back(use.setting);
    }
  }
  for (const auto& [use, settings] : distinct) {
    const ReplicaGrouping grouping = use->location.shardingDomain.toReplicaGrouping(replicas);
    fmt::print("\n{}\n", fmt::join(settings, "\n"));
    fmt::print("  {} -> {}, replicatedTensorSharding {}\n", use->location.shardingDomain.str(),
               grouping.str(), use->location.replicatedTensorSharding);
    fmt::print("  {}", groupsSummary(grouping));
    if (perReplica) fmt::print("{}", indent(groupingTables(grouping, "shard"), "  "));
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
  command.add_flag("--values", args->values, "Also list every value of the config and where it came from");
  command.add_flag("--per-replica", args->perReplica,
                   "Also list every replica and every group of a sharding domain one by one (text and JSON)");
  command.add_flag("--json", args->json, "Print JSON instead of text");
  command
      .add_option("--lever-plans", args->leverPlans,
                  "When the program does not fit, plan at most N changed configs in the search for levers that "
                  "make it fit (0: no search)")
      ->type_name("N")
      ->check(CLI::Range(int64_t{0}, int64_t{1000}));
  return [args] {
    const LoadedRunConfig loaded = loadForPlanning(args->config);
    std::optional<LoadedRunConfig> changed;
    if (!args->whatIf.empty()) {
      ConfigArgs whatIf = args->config;
      whatIf.overrides.insert(whatIf.overrides.end(), args->whatIf.begin(), args->whatIf.end());
      changed = loadForPlanning(whatIf);
    }
    const RunPlan plan = planRun(loaded.config);
    const std::optional<MemoryShortfall> shortfall = findShortfall(plan.memory);
    const LeverSearch levers = shortfall ? searchRunLevers(loaded.config, plan, args->leverPlans) : LeverSearch{};
    if (args->json) {
      nlohmann::json out = configJson(loaded, args->perReplica);
      out.update(planJson(plan, args->perReplica, levers));
      // A session run of batchesPerStep batches repeats the step's device
      // work; the time model has no per-run host cost to pay once.
      const int64_t batchesPerStep = loaded.config.data.batchesPerStep;
      out["modelledStepTime"]["batchesPerStep"] = batchesPerStep;
      out["modelledStepTime"]["runSeconds"] = plan.time.runSeconds;
      if (changed) {
        nlohmann::json after = planJson(planRun(changed->config), args->perReplica, LeverSearch{});
        after["settings"] = args->whatIf;
        out["whatIf"] = std::move(after);
      }
      printJson(out);
    } else {
      printAnswer(args->config.path, plan, levers);
      fmt::print(
          "More: --values lists every value of the config, --per-replica every replica and group, --json "
          "everything.\n");
      printConfig(loaded, args->values, args->perReplica);
      printPlan(plan, args->perReplica);
      if (loaded.config.data.batchesPerStep > 1) {
        const int64_t batchesPerStep = loaded.config.data.batchesPerStep;
        fmt::print(
            "Batches per step: {}: a session run takes {} x {} = {} (each batch's device work repeats; the "
            "host streams overlap as their strategies allow)\n",
            batchesPerStep, batchesPerStep, seconds(plan.time.stepSeconds), seconds(plan.time.runSeconds));
      }
      if (changed) printWhatIf(args->whatIf, plan, planRun(changed->config));
    }
    return shortfall ? reportDoesNotFit(*shortfall, plan.memory) : kExitOk;
  };
}

}  // namespace tessera::cli
