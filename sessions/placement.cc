#include "tessera/sessions/placement.hpp"

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "session_runtime.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/shard_layout.hpp"
#include "tessera/sessions/transform.hpp"
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
