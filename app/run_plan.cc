#include "tessera/app/run_plan.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "memory_planner.hpp"
#include "run_model.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/app/mlp.hpp"

namespace tessera {
namespace {

int64_t spaceBytes(const ReplicaMemory& m, MemorySpace space) {
  switch (space) {
    case MemorySpace::ComputeTiles: return m.computeTilesBytes;
    case MemorySpace::IOTiles: return m.ioTilesBytes;
    case MemorySpace::Streaming: return m.streamingBytes;
  }
  return 0;
}

int64_t capacityOf(const MemoryReport& report, MemorySpace space) {
  switch (space) {
    case MemorySpace::ComputeTiles: return report.computeTilesCapacity;
    case MemorySpace::IOTiles: return report.ioTilesCapacity;
    case MemorySpace::Streaming: return report.streamingCapacity;
  }
  return 0;
}

// How far over capacity the fullest space of any IPU is: 1 or less fits.
double overRatio(const MemoryReport& report) {
  double over = 0.0;
  for (const ReplicaMemory& m : report.perReplica) {
    for (const MemorySpace space : {MemorySpace::ComputeTiles, MemorySpace::IOTiles, MemorySpace::Streaming}) {
      const int64_t capacity = capacityOf(report, space);
      const int64_t bytes = spaceBytes(m, space);
      if (capacity <= 0) {
        if (bytes > 0) over = std::max(over, 1e9);
        continue;
      }
      over = std::max(over, static_cast<double>(bytes) / static_cast<double>(capacity));
    }
  }
  return over;
}

int64_t globalBatchOf(const RunConfig& config) {
  const SessionOptions& o = config.sessionOptions;
  return config.data.batchSize * o.getGlobalReplicationFactor() * o.getAccumulationFactor();
}

std::string locationPath(TensorCategory category, std::string_view field) {
  return fmt::format("{}/{}/location/{}", kSessionOptionsPath, SessionOptions::locationSettingsKey(category),
                     field);
}

constexpr std::array kShardedCategories = {TensorCategory::Weight, TensorCategory::OptimizerState,
                                           TensorCategory::Accumulator};

// The forward phases of the phased-execution lever: one per layer (weight
// layers of the mlp, blocks of the transformer; 4 for an ONNX model, whose
// layers the config does not say), 2 to 16.
int64_t phaseCountOf(const RunConfig& config) {
  int64_t layers = 4;
  if (config.model.type == kMlpModel) layers = static_cast<int64_t>(config.model.layers.size()) - 1;
  if (config.model.type == kTransformerModel) layers = config.model.transformer.layers;
  return std::clamp<int64_t>(layers, 2, 16);
}

// The levers a config can still pull, each one step from it.
std::vector<Lever> leversOf(const RunConfig& config, double over) {
  const SessionOptions& options = config.sessionOptions;
  std::vector<Lever> out;
  if (options.autoRecomputation == RecomputationType::None) {
    for (const RecomputationType type : {RecomputationType::Standard, RecomputationType::NormOnly}) {
      out.push_back({fmt::format("autoRecomputation {}", toString(type)),
                     {{fmt::format("{}/autoRecomputation", kSessionOptionsPath), fmt::format("\"{}\"", toString(type))}},
                     type == RecomputationType::Standard
                         ? "keeps checkpoints only and runs the forward ops between them again in the backward pass: "
                           "extra forward work"
                         : "recomputes the normalisations in the backward pass: a little extra forward work"});
    }
  }
  const int64_t replicas = options.getGlobalReplicationFactor();
  const int64_t ipus = config.device.ipusPerReplica;
  const int64_t af = options.getAccumulationFactor();
  const bool oneInstance = options.getLocalReplicationFactor() == replicas;
  // More IPUs per replica at the same IPU count: by 2, and by the power of
  // two the peak is over capacity.
  std::vector<int64_t> factors = {2};
  int64_t jump = 2;
  while (static_cast<double>(jump) < over && jump < replicas) jump *= 2;
  if (jump > 2) factors.push_back(jump);
  for (const int64_t k : factors) {
    if (!oneInstance || replicas % k != 0 || ipus * k > 64) continue;
    const int64_t newReplicas = replicas / k;
    Lever lever{fmt::format("{} IPUs per replica", ipus * k),
                {{"/device/ipusPerReplica", std::to_string(ipus * k)},
                 {fmt::format("{}/replicatedGraphCount", kSessionOptionsPath), std::to_string(newReplicas)}},
                fmt::format("{} replicas instead of {}: less data parallelism (a global batch of {} instead of {}); "
                            "the IPUs of a replica take turns and copy activations between them",
                            newReplicas, replicas, globalBatchOf(config) / k, globalBatchOf(config))};
    if (options.virtualGraphMode == VirtualGraphMode::Off) {
      lever.changes.push_back({fmt::format("{}/virtualGraphMode", kSessionOptionsPath), "\"Auto\""});
    }
    if (options.enablePipelining && af < 2 * ipus * k - 1) {
      lever.changes.push_back({fmt::format("{}/accumulationFactor", kSessionOptionsPath),
                               std::to_string(2 * ipus * k - 1)});
    }
    // A sharding domain that no longer divides the replicas: all of them.
    for (const auto& [category, name] : EnumNames<TensorCategory>::kNames) {
      const CommGroup& domain = options.locationSettings(category).location.shardingDomain;
      if (domain == CommGroup{}) continue;
      const int64_t g = domain.groupSize(replicas);
      if (g < newReplicas && newReplicas % g == 0) continue;
      lever.changes.push_back({locationPath(category, "shardingDomain"), R"({"type": "All"})"});
    }
    out.push_back(std::move(lever));
  }
  // Pipelining over a few IPUs only: the program holds the micro-batches
  // unrolled, so planning an accumulation of 2 x 32 - 1 would cost a minute.
  if (ipus > 1 && ipus <= 4 && !options.enablePipelining) {
    const int64_t needed = std::max(af, 2 * ipus - 1);
    out.push_back({fmt::format("pipelining, accumulation {}", needed),
                   {{fmt::format("{}/enablePipelining", kSessionOptionsPath), "true"},
                    {fmt::format("{}/enableGradientAccumulation", kSessionOptionsPath), "true"},
                    {fmt::format("{}/accumulationFactor", kSessionOptionsPath), std::to_string(needed)}},
                   fmt::format("the IPUs work at once on {} micro-batches, stashing their activations; the pipeline "
                               "fills and flushes (bubble) and the global batch is {} times larger",
                               needed, needed / af)});
  }
  // Phased execution on the 1 or 2 IPUs of a replica: the forward pass cut
  // into phases of about equal memory (as Auto cuts it into IPUs, so no
  // annotation is needed), with the weights and activations in streaming
  // memory, without which a phase holds what the whole step does.
  if ((ipus == 1 || ipus == 2) && !options.enablePipelining &&
      options.virtualGraphMode != VirtualGraphMode::ExecutionPhases) {
    const int64_t phases = phaseCountOf(config);
    Lever lever{fmt::format("execution phases {}", phases),
                {{fmt::format("{}/virtualGraphMode", kSessionOptionsPath), "\"ExecutionPhases\""},
                 {fmt::format("{}/executionPhaseSettings/phases", kSessionOptionsPath), std::to_string(phases)},
                 {fmt::format("{}/executionPhaseSettings/stages", kSessionOptionsPath), std::to_string(ipus)}},
                fmt::format("the forward pass in {} phases ({} a step) {}; weights and activations in streaming "
                            "memory, loaded in each phase that reads them (streaming traffic, overlapped with the "
                            "previous phase only through the IO tiles)",
                            phases, 2 * phases - 1,
                            ipus == 1 ? "one after the other on the one IPU" : "taking turns on the 2 IPUs")};
    for (const TensorCategory category : {TensorCategory::Weight, TensorCategory::Activation}) {
      if (options.locationSettings(category).location.storage == TensorStorage::OffChip) continue;
      lever.changes.push_back({locationPath(category, "storage"), "\"OffChip\""});
    }
    out.push_back(std::move(lever));
  }
  if (replicas > 1) {
    // RTS of the model state; a narrower domain widened to every replica
    // (categories sharded together share their domain).
    std::vector<ConfigChange> widen;
    for (const TensorCategory category : kShardedCategories) {
      const TensorLocation& location = options.locationSettings(category).location;
      if (location.replicatedTensorSharding == ReplicatedTensorSharding::Off) {
        if (category == TensorCategory::Accumulator && af <= 1) continue;
        out.push_back({fmt::format("{} sharded (RTS)", toString(category)),
                       {{locationPath(category, "replicatedTensorSharding"), "\"On\""}},
                       "gathered before use and its updates reduce-scattered: link traffic each step"});
      } else if (location.shardingDomain.groupSize(replicas) < replicas) {
        widen.push_back({locationPath(category, "shardingDomain"), R"({"type": "All"})"});
      }
    }
    if (!widen.empty()) {
      out.push_back({"sharding over all replicas", std::move(widen),
                     "one copy of the model state over every replica: gathers and reduce-scatters span them all"});
    }
  }
  for (const TensorCategory category : {TensorCategory::OptimizerState, TensorCategory::Accumulator,
                                        TensorCategory::Weight, TensorCategory::Activation}) {
    if (category == TensorCategory::Accumulator && af <= 1) continue;
    if (options.locationSettings(category).location.storage == TensorStorage::OffChip) continue;
    out.push_back({fmt::format("{} OffChip", toString(category)),
                   {{locationPath(category, "storage"), "\"OffChip\""}},
                   "kept in streaming memory: loaded and stored each step (streaming traffic)"});
  }
  // State streamed through the IO tiles: through the compute tiles instead,
  // when the IO tiles are what is short or fuller than the compute tiles.
  for (const TensorCategory category : {TensorCategory::OptimizerState, TensorCategory::Accumulator,
                                        TensorCategory::Weight}) {
    const TensorLocation& location = options.locationSettings(category).location;
    if (location.storage != TensorStorage::OffChip ||
        (location.loadTileSet != TileSet::IO && location.storageTileSet != TileSet::IO)) {
      continue;
    }
    out.push_back({fmt::format("{} through the compute tiles", toString(category)),
                   {{locationPath(category, "loadTileSet"), "\"Compute\""},
                    {locationPath(category, "storageTileSet"), "\"Compute\""}},
                   "loaded and stored by the compute tiles: the transfers no longer overlap compute"});
  }
  if (config.model.dtype == DType::Float32) {
    out.push_back({"float16", {{"/model/dtype", "\"float16\""}},
                   "float16 weights and activations (half the bytes; an 11-bit significand), float32 master "
                   "weights kept as optimizer state"});
  }
  return out;
}

std::optional<RunConfig> applied(const RunConfig& config, const std::vector<ConfigChange>& changes) {
  nlohmann::json document = config;
  try {
    for (const ConfigChange& change : changes) {
      document[nlohmann::json::json_pointer(change.path)] = nlohmann::json::parse(change.value);
    }
    LoadedRunConfig loaded = parseRunConfig(document.dump(), "lever");
    validateForPlanning(loaded.config);
    return std::move(loaded.config);
  } catch (const Error&) {
    return std::nullopt;  // a combination the config cannot take is no lever
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::string bytesText(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / (1 << 10));
  return fmt::format("{} B", bytes);
}

// The device's out-of-memory error with the cheapest combinations of levers
// that make the run fit, as searchRunLevers() finds them (the figures
// `tessera explain` prints under levers).
DeviceError outOfMemoryWithLevers(const DeviceError& error, const RunConfig& config, const RunPlan& plan,
                                  int64_t maxPlans) {
  const LeverSearch search = searchRunLevers(config, plan, maxPlans);
  const std::string space(spaceLabel(search.space));
  const auto effect = [&](const LeverPlan& p) {
    return fmt::format("{} {} -> {} per IPU{}; modelled step {:.3f} ms -> {:.3f} ms{}", space,
                       bytesText(search.peakBytes), bytesText(p.peakBytes), p.fits ? ", fits" : ", still too large",
                       search.stepSeconds * 1e3, p.stepSeconds * 1e3,
                       p.globalBatch != search.globalBatch
                           ? fmt::format("; {} replicas x {} IPUs, global batch {} -> {}", p.replicas,
                                         p.ipusPerReplica, search.globalBatch, p.globalBatch)
                           : std::string());
  };
  constexpr std::size_t kShown = 3;
  std::string text = error.detail();
  if (!search.fitting.empty()) {
    text += fmt::format("\nlevers that make it fit (each combination planned, the fastest modelled step first; {} "
                        "plans):",
                        search.plans);
    for (std::size_t i = 0; i < search.fitting.size() && i < kShown; ++i) {
      const LeverPlan& p = search.fitting[i];
      std::vector<std::string> sets;
      for (const Lever& l : p.levers)
        for (const ConfigChange& c : l.changes) sets.push_back(setArgument(c));
      text += fmt::format("\n  {}. {}: {}\n     {}", i + 1, leverNames(p), effect(p), fmt::join(sets, " "));
    }
  } else {
    text += fmt::format("\nno combination of levers found that fits in {} plans; use a smaller batch, sequence or "
                        "model",
                        search.plans);
    for (std::size_t i = 0; i < search.single.size() && i < kShown; ++i) {
      if (i == 0) text += "\nthe levers that lower it most, each alone:";
      text += fmt::format("\n  {}: {}", leverNames(search.single[i]), effect(search.single[i]));
    }
  }
  text += "\n`tessera explain CONFIG` (with the same --set settings) lists every lever, its cost and more "
          "combinations";
  return DeviceError(error.code(), error.subject(), text);
}

}  // namespace

RunPlan planRun(const RunConfig& config) {
  const SessionOptions& options = config.sessionOptions;
  RunModel model = buildRunModel(config, config.data.batchSize, options.getGlobalReplicationFactor());
  const std::unique_ptr<Optimizer> optimizer = makeOptimizer(config.optimizer);
  const DataFlow dataFlow = runDataFlow(config, model);
  return planTraining(std::move(model.graph), model.loss, *optimizer, options, config.device, dataFlow);
}

std::vector<MemorySuggestion> suggestRunSettings(const RunConfig& config, const MemoryShortfall& shortfall) {
  const SessionOptions& options = config.sessionOptions;
  const RunModel model = buildRunModel(config, config.data.batchSize, options.getGlobalReplicationFactor());
  const std::unique_ptr<Optimizer> optimizer = makeOptimizer(config.optimizer);
  return suggestMemorySettings(model.graph, model.loss, *optimizer, options, config.device, shortfall,
                               runDataFlow(config, model));
}

int64_t highestPeak(const MemoryReport& report, MemorySpace space) {
  int64_t peak = 0;
  for (const ReplicaMemory& m : report.perReplica) peak = std::max(peak, spaceBytes(m, space));
  return peak;
}

LeverSearch searchRunLevers(const RunConfig& config, const RunPlan& plan, int64_t maxPlans) {
  LeverSearch search;
  const std::optional<MemoryShortfall> shortfall = findShortfall(plan.memory);
  if (shortfall) search.space = shortfall->space;
  search.peakBytes = highestPeak(plan.memory, search.space);
  search.availableBytes = capacityOf(plan.memory, search.space);
  search.stepSeconds = plan.time.stepSeconds;
  search.globalBatch = globalBatchOf(config);
  if (!shortfall) return search;

  struct State {
    RunConfig config;
    LeverPlan plan;
    double over = 0.0;
  };
  const auto score = [](const State& s) { return s.plan.stepSeconds * std::max(1.0, s.over); };
  const auto tryLever = [&](const State& from, const Lever& lever) -> std::optional<State> {
    std::optional<RunConfig> changed = applied(from.config, lever.changes);
    if (!changed || search.plans >= maxPlans) return std::nullopt;
    ++search.plans;
    RunPlan p;
    try {
      p = planRun(*changed);
    } catch (const Error&) {
      return std::nullopt;
    }
    State next{std::move(*changed), from.plan, overRatio(p.memory)};
    next.plan.levers.push_back(lever);
    next.plan.peakBytes = highestPeak(p.memory, search.space);
    next.plan.fits = !findShortfall(p.memory).has_value();
    next.plan.stepSeconds = p.time.stepSeconds;
    next.plan.replicas = next.config.sessionOptions.getGlobalReplicationFactor();
    next.plan.ipusPerReplica = next.config.device.ipusPerReplica;
    next.plan.globalBatch = globalBatchOf(next.config);
    return next;
  };

  State current{config, {}, overRatio(plan.memory)};
  current.plan.stepSeconds = plan.time.stepSeconds;
  current.plan.peakBytes = search.peakBytes;
  // Rounds: every lever still open added to the best combination so far;
  // a lever that alone lowers nothing much is not tried again.
  std::set<std::string> useless;
  for (int round = 0; search.fitting.empty() && search.plans < maxPlans; ++round) {
    std::optional<State> best;
    for (const Lever& lever : leversOf(current.config, current.over)) {
      if (useless.count(lever.name) != 0) continue;
      std::optional<State> next = tryLever(current, lever);
      if (!next) continue;
      if (round == 0) {
        search.single.push_back(next->plan);
        // The tile sets matter once another lever has moved the peak to the IO tiles.
        if (next->over > 0.95 * current.over && !lever.name.ends_with("through the compute tiles"))
          useless.insert(lever.name);
      }
      if (next->plan.fits) search.fitting.push_back(next->plan);
      if (next->over < current.over && (!best || score(*next) < score(*best))) best = std::move(next);
    }
    if (!best) break;
    current = std::move(*best);
  }
  // A fitting combination without the levers it does not need is cheaper.
  const std::vector<LeverPlan> found = search.fitting;
  for (const LeverPlan& fit : found) {
    if (fit.levers.size() < 3) continue;
    for (std::size_t drop = 0; drop + 1 < fit.levers.size() && search.plans < maxPlans; ++drop) {
      State state{config, {}, 0.0};
      bool ok = true;
      for (std::size_t i = 0; i < fit.levers.size() && ok; ++i) {
        if (i == drop) continue;
        std::optional<State> next = tryLever(state, fit.levers[i]);
        ok = next.has_value();
        if (ok) state = std::move(*next);
      }
      if (ok && state.plan.fits) search.fitting.push_back(state.plan);
    }
  }
  std::stable_sort(search.single.begin(), search.single.end(),
                   [](const LeverPlan& a, const LeverPlan& b) { return a.peakBytes < b.peakBytes; });
  std::stable_sort(search.fitting.begin(), search.fitting.end(),
                   [](const LeverPlan& a, const LeverPlan& b) { return a.stepSeconds < b.stepSeconds; });
  return search;
}

std::string leverNames(const LeverPlan& plan) {
  std::vector<std::string> names;
  for (const Lever& l : plan.levers) names.push_back(l.name);
  return fmt::format("{}", fmt::join(names, " + "));
}

std::string setArgument(const ConfigChange& change) {
  const nlohmann::json value = nlohmann::json::parse(change.value);
  const std::string text = value.is_string() ? value.get<std::string>() : value.dump();
  const std::string argument = change.path + "=" + text;
  if (argument.find_first_of(" \"{}[]") == std::string::npos) return "--set " + argument;
  return "--set '" + argument + "'";
}

void requireRunFits(const RunConfig& config, const RunPlan& plan, int64_t maxPlans) {
  try {
    sim::requireFits(plan.memory);
  } catch (const DeviceError& error) {
    if (error.code() != ErrorCode::OutOfMemory) throw;
    throw outOfMemoryWithLevers(error, config, plan, maxPlans);
  }
}

}  // namespace tessera
