#include "tessera/placement.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "run_model.hpp"
#include "session_runtime.hpp"
#include "tessera/error.hpp"
#include "tessera/mlp.hpp"
#include "tessera/shard_layout.hpp"
#include "tessera/transform.hpp"
#include "training_pipeline.hpp"

namespace tessera {
namespace {

bool isVariable(const Graph& graph, const TensorNode& node) {
  return node.producer != kNoOp && graph.op(node.producer).kind == OpKind::Variable;
}

// A copy the location transforms add to move a value between tile sets or
// out of a load: part of the placement of the tensor it copies.
bool transferCopy(const Graph& graph, const OpNode& op) {
  if (op.kind != OpKind::Copy) return false;
  const TensorNode& in = graph.tensor(op.inputs[0]);
  return in.tileSet != graph.tensor(op.outputs[0]).tileSet ||
         (in.producer != kNoOp && graph.op(in.producer).kind == OpKind::RemoteLoad);
}

// Stored to streaming memory, directly or staged on the IO tiles.
bool storedOffChip(const Graph& graph, const TensorNode& node) {
  return std::any_of(node.consumers.begin(), node.consumers.end(), [&](OpId consumer) {
    const OpNode& op = graph.op(consumer);
    return op.kind == OpKind::RemoteStore ||
           (transferCopy(graph, op) && storedOffChip(graph, graph.tensor(op.outputs[0])));
  });
}

// An activation kept on the IO tiles between the forward and backward passes.
bool keptOnIoTiles(const Graph& graph, const TensorNode& node) {
  return std::any_of(node.consumers.begin(), node.consumers.end(), [&](OpId consumer) {
    const OpNode& op = graph.op(consumer);
    return op.kind == OpKind::Copy && graph.tensor(op.outputs[0]).tileSet == TileSet::IO &&
           graph.tensor(op.outputs[0]).consumers.size() == 1 &&
           graph.op(graph.tensor(op.outputs[0]).consumers.front()).kind == OpKind::Copy;
  });
}

// The variables the program keeps and the activations that own storage;
// the location transforms' load and staging copies are part of their
// tensor's placement, not tensors of their own.
std::vector<TensorPlacement> placements(const Graph& graph, const SessionOptions& options,
                                        std::vector<NotApplied>& notApplied) {
  std::vector<TensorPlacement> out;
  // Each downgrade once, with every tensor it applies to, in the order found.
  std::vector<std::pair<LocationDowngrade, std::vector<std::string>>> downgrades;
  std::map<std::tuple<std::string, std::string, std::string, std::string>, std::size_t> downgradeIndex;
  int64_t variables = 0;
  const auto place = [&](const TensorNode& node, bool variable) {
    const int64_t elements = numElements(node.metaShape.empty() ? node.shape : node.metaShape);
    const ResolvedLocation resolved = resolveTensorLocation(options, {node.name, node.category, elements});
    TensorPlacement p;
    p.name = node.name;
    p.category = node.category;
    p.elements = elements;
    p.loadTileSet = resolved.location.loadTileSet;
    p.storageTileSet = resolved.location.storageTileSet;
    p.reason = resolved.reason();
    if (variable) {
      p.storage = node.remoteBuffer >= 0 ? TensorStorage::OffChip : TensorStorage::OnChip;
      if (!node.metaShape.empty()) {
        p.replicatedTensorSharding = ReplicatedTensorSharding::On;
        p.shardingDomain = node.shardDomain;
        p.padding = ShardLayout(elements, node.shardCount).paddedElements() - elements;
      }
    } else {
      p.storage = storedOffChip(graph, node) ? TensorStorage::OffChip : TensorStorage::OnChip;
      if (resolved.location.storage == TensorStorage::OffChip && p.storage == TensorStorage::OnChip) {
        p.reason += "; storage OffChip -> OnChip: not read by the backward pass";
      }
      if (p.storage == TensorStorage::OnChip && p.storageTileSet == TileSet::IO && !keptOnIoTiles(graph, node)) {
        p.storageTileSet = TileSet::Compute;
        p.reason += "; storageTileSet IO -> Compute: not read by the backward pass";
      }
    }
    p.shardElements = numElements(node.shape);
    p.dtype = node.dtype;
    for (const LocationDowngrade& downgrade : resolved.downgrades) {
      const auto key = std::tuple(downgrade.setting, downgrade.requested, downgrade.applied, downgrade.why);
      const auto [at, added] = downgradeIndex.emplace(key, downgrades.size());
      if (added) downgrades.push_back({downgrade, {}});
      downgrades[at->second].second.push_back(node.name);
    }
    if (variable) ++variables;
    out.push_back(std::move(p));
  };
  for (const TensorNode& node : graph.tensors()) {
    if (isVariable(graph, node)) place(node, true);
  }
  for (const OpId id : graph.schedule()) {
    const OpNode& op = graph.op(id);
    if (op.kind == OpKind::Variable || op.kind == OpKind::RemoteLoad || op.kind == OpKind::Input ||
        op.kind == OpKind::Constant || transferCopy(graph, op)) {
      continue;
    }
    for (TensorId t : op.outputs) {
      const TensorNode& node = graph.tensor(t);
      if (node.category != TensorCategory::Activation || node.aliasOf != kNoTensor) continue;
      place(node, false);
    }
  }
  // Each downgrade names every tensor it applies to (up to kListed of them,
  // with the count), "all N variables" when that is every variable.
  constexpr std::size_t kListed = 64;
  for (auto& [downgrade, names] : downgrades) {
    const std::size_t shown = std::min(names.size(), kListed);
    const std::string listed =
        fmt::format("{}{}", fmt::join(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
                    names.size() > shown ? fmt::format(" and {} more", names.size() - shown) : std::string());
    std::string tensors = listed;
    if (names.size() > 1) {
      const bool all = static_cast<int64_t>(names.size()) == variables;
      tensors = fmt::format("{} {} {}: {}", all ? "all" : "these", names.size(),
                            all ? "variables" : "tensors", listed);
    }
    notApplied.push_back({std::move(tensors), std::move(downgrade)});
  }
  return out;
}

Program programOf(Graph graph, const SessionOptions& options, const ReplicaTopology& topology) {
  Program program;
  program.graph = std::move(graph);
  program.replicas = topology;
  program.numIOTiles = options.numIOTiles;
  return program;
}

int64_t peakOf(const MemoryReport& report, const MemoryShortfall& shortfall) {
  for (const ReplicaMemory& replica : report.perReplica) {
    if (replica.replica != shortfall.replica || replica.ipu != shortfall.ipu) continue;
    switch (shortfall.space) {
      case MemorySpace::ComputeTiles: return replica.computeTilesBytes;
      case MemorySpace::IOTiles: return replica.ioTilesBytes;
      case MemorySpace::Streaming: return replica.streamingBytes;
    }
  }
  return 0;
}

struct Candidate {
  std::string setting;
  std::string value;
  SessionOptions options;
};

std::vector<Candidate> candidates(const Graph& graph, const SessionOptions& options) {
  std::vector<Candidate> out;
  const int64_t replicas = options.getGlobalReplicationFactor();
  const auto path = [](TensorCategory category, std::string_view field) {
    return fmt::format("{}/{}/location/{}", kSessionOptionsPath, SessionOptions::locationSettingsKey(category), field);
  };
  for (TensorCategory category : {TensorCategory::OptimizerState, TensorCategory::Accumulator,
                                  TensorCategory::Weight, TensorCategory::Activation}) {
    if (options.locationSettings(category).location.storage == TensorStorage::OffChip) continue;
    Candidate c{path(category, "storage"), "\"OffChip\"", options};
    c.options.locationSettings(category).location.storage = TensorStorage::OffChip;
    out.push_back(std::move(c));
  }
  // Recomputation: fewer activations kept, more forward work. RecomputeAll
  // differs from no recomputation only with ops marked Checkpoint by hand
  // (without them PopART's rule keeps the whole forward pass, the segment
  // that ends at the loss), so it is planned only then.
  if (options.autoRecomputation == RecomputationType::None) {
    const bool marked = std::any_of(graph.ops().begin(), graph.ops().end(),
                                    [](const OpNode& op) { return op.recompute == RecomputeType::Checkpoint; });
    for (RecomputationType type : {RecomputationType::Standard, RecomputationType::RecomputeAll}) {
      if (type == RecomputationType::RecomputeAll && !marked) continue;
      Candidate c{fmt::format("{}/autoRecomputation", kSessionOptionsPath),
                  fmt::format("\"{}\"", toString(type)), options};
      c.options.autoRecomputation = type;
      out.push_back(std::move(c));
    }
  }
  if (options.getLocalReplicationFactor() <= 1) return out;
  for (TensorCategory category :
       {TensorCategory::OptimizerState, TensorCategory::Weight, TensorCategory::Accumulator}) {
    const TensorLocation& location = options.locationSettings(category).location;
    if (location.replicatedTensorSharding == ReplicatedTensorSharding::Off) {
      Candidate c{path(category, "replicatedTensorSharding"), "\"On\"", options};
      c.options.locationSettings(category).location.replicatedTensorSharding = ReplicatedTensorSharding::On;
      out.push_back(std::move(c));
    } else if (location.shardingDomain.groupSize(replicas) < replicas) {
      Candidate c{path(category, "shardingDomain"), R"({"type": "All"})", options};
      c.options.locationSettings(category).location.shardingDomain = CommGroup{};
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace

RunPlan planTraining(Graph graph, TensorId loss, const Optimizer& optimizer, const SessionOptions& options,
                     const DeviceSpec& spec, const DataFlow& dataFlow) {
  validate(options, spec);
  const ReplicaTopology topology = ReplicaTopology::fromOptions(options, spec.ipusPerReplica);
  checkReplicationFactor(graph, topology);
  const std::string lossName = graph.tensor(loss).name;
  const std::unique_ptr<Optimizer> clone = optimizer.clone();
  TrainingGraph training{std::move(graph), TrainingTensors{loss, {}, {}}};
  runTrainingPipeline(training, options, *clone, topology);
  RunPlan plan;
  plan.tensors = placements(training.graph, options, plan.notApplied);
  const int64_t af = options.getAccumulationFactor();
  AnchorReturnType lossType = AnchorReturnType::all();
  for (const auto& anchor : dataFlow.anchors)
    if (anchor.first == lossName) lossType = anchor.second;
  const detail::HostIo io{dataFlow.batchesPerStep, {lossType}, {af > 1}};
  plan.program = programOf(std::move(training.graph), options, topology);
  plan.program.hostStreams = detail::hostStreamsOf(plan.program.graph, af, {training.tensors.loss}, io);
  plan.program.batchesPerStep = dataFlow.batchesPerStep;
  plan.program.accumulationFactor = af;
  plan.memory = planMemory(plan.program, spec);
  plan.time = modelTime(plan.program, spec);
  return plan;
}

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

std::vector<MemorySuggestion> suggestMemorySettings(const Graph& graph, TensorId loss, const Optimizer& optimizer,
                                                    const SessionOptions& options, const DeviceSpec& spec,
                                                    const MemoryShortfall& shortfall, const DataFlow& dataFlow) {
  std::vector<MemorySuggestion> out;
  for (Candidate& candidate : candidates(graph, options)) {
    RunPlan plan;
    try {
      plan = planTraining(graph, loss, optimizer, candidate.options, spec, dataFlow);
    } catch (const Error&) {
      continue;  // a change these options cannot take is no suggestion
    }
    const int64_t needed = peakOf(plan.memory, shortfall);
    if (needed >= shortfall.neededBytes) continue;
    out.push_back({std::move(candidate.setting), std::move(candidate.value), needed, shortfall.neededBytes - needed,
                   !findShortfall(plan.memory).has_value(), plan.time.stepSeconds});
  }
  std::stable_sort(out.begin(), out.end(), [](const MemorySuggestion& a, const MemorySuggestion& b) {
    return a.fits != b.fits ? a.fits : a.savingBytes > b.savingBytes;
  });
  return out;
}

}  // namespace tessera

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

}  // namespace

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

}  // namespace tessera
