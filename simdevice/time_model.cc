#include "time_model.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "memory_planner.hpp"
#include "op_def.hpp"
#include "tessera/device.hpp"
#include "tessera/error.hpp"

namespace tessera {
namespace sim {
namespace {

std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

bool onIOTiles(const Graph& graph, TensorId t) {
  return graph.tensor(t).tileSet == TileSet::IO || graph.tensor(graph.storageOf(t)).tileSet == TileSet::IO;
}

// Whether a group holds replicas of two instances (of `localReplicas`
// consecutive replicas each). Checked once per collective, so its cost must
// not grow with the replica count where it need not: one instance holds every
// group, and a group's members increase (by its stride), so it spans
// instances exactly when its first and last members do.
bool spansInstances(const ReplicaGrouping& grouping, int64_t localReplicas) {
  if (localReplicas >= grouping.numReplicas() || grouping.groupSize() == 1) return false;
  const int64_t last = grouping.groupSize() - 1;
  for (int64_t group = 0; group < grouping.numGroups(); ++group)
    if (grouping.replicaAt(group, 0) / localReplicas != grouping.replicaAt(group, last) / localReplicas)
      return true;
  return false;
}

// What an op costs and where it runs, before it is placed in time.
struct Work {
  TimeLane lane = TimeLane::ComputeTiles;
  bool throughIOTiles = false;
  double seconds = 0.0;
  double flops = 0.0;
  double bytes = 0.0;
  std::string group;
  bool interInstance = false;
};

// A collective that moves data: its bytes over the link of its group (the
// links between instances when the group spans them).
Work collectiveWork(const Graph& graph, const OpNode& op, const OpCost& cost, const LocalTopology& topology,
                    const DeviceSpec& spec) {
  Work w;
  w.lane = TimeLane::Link;
  const ReplicaGrouping grouping =
      op.attributes.grouping.value_or(ReplicaGrouping(graph.replicationFactor()));
  w.group = grouping.str();
  w.throughIOTiles = onIOTiles(graph, op.inputs[0]) || onIOTiles(graph, op.outputs[0]);
  if (grouping.groupSize() == 1) return w;
  w.interInstance = spansInstances(grouping, topology.localReplicas);
  w.bytes = cost.linkBytes;
  const double bandwidth =
      w.interInstance ? spec.interInstanceBandwidthBytesPerSecond : spec.linkBandwidthBytesPerSecond;
  w.seconds = spec.transferLatencySeconds + w.bytes / bandwidth;
  return w;
}

// The IPU an op runs on: IPU 0 when it names none. The device refuses a
// program naming an IPU the replica does not have (checkVirtualGraphs).
int64_t ipuOf(const OpNode& op, int64_t ipus) {
  return op.virtualGraph >= 0 && op.virtualGraph < ipus ? op.virtualGraph : 0;
}

Work opWork(const Graph& graph, const OpNode& op, const OpDef& def, const LocalTopology& topology,
            const DeviceSpec& spec) {
  const OpCost cost = def.cost != nullptr ? def.cost(graph, op) : OpCost{};
  Work w;
  switch (def.work) {
    case OpWork::Collective: return collectiveWork(graph, op, cost, topology, spec);
    case OpWork::Streaming: {
      const TensorId moved = op.outputs.empty() ? op.inputs[0] : op.outputs[0];
      w.throughIOTiles = onIOTiles(graph, moved);
      w.lane = w.throughIOTiles ? TimeLane::IOTiles : TimeLane::Streaming;
      w.bytes = cost.streamedBytes;
      w.seconds = spec.transferLatencySeconds + w.bytes / spec.streamingBandwidthBytesPerSecond;
      return w;
    }
    case OpWork::InterIpu:
      w.lane = TimeLane::IpuLink;
      w.bytes = cost.ipuLinkBytes;
      w.seconds = spec.interIpuLatencySeconds + w.bytes / spec.interIpuBandwidthBytesPerSecond;
      return w;
    case OpWork::None:
    case OpWork::Compute: break;
  }
  w.flops = cost.flops;
  w.seconds = w.flops / spec.computeFlopsPerSecond;
  return w;
}

// A pipelined program's order: the ops that need no micro-batch, then cycle
// by cycle (an IpuCopy after the cycle's other ops), then the ops that
// depend on a micro-batch but belong to none. `cycleOf` gets each op's
// cycle (-1 before, `cycles` after). Empty when the program is not pipelined.
std::vector<OpId> pipelineOrder(const Graph& graph, std::span<const OpId> schedule, std::vector<int64_t>& cycleOf,
                                PipelineTime& pipeline) {
  int64_t stages = 0;
  int64_t microBatches = 0;
  for (OpId id : schedule) {
    const OpNode& op = graph.op(id);
    if (op.microBatch == kNoMicroBatch || op.pipelineStage == kNoPipelineStage) continue;
    stages = std::max(stages, op.pipelineStage + 1);
    microBatches = std::max(microBatches, op.microBatch + 1);
  }
  if (stages < 2 || microBatches < 1) return {};
  pipeline.enabled = true;
  pipeline.stages = stages;
  pipeline.forwardStages = (stages + 1) / 2;
  pipeline.microBatches = microBatches;
  pipeline.cycles = microBatches + stages - 1;
  const int64_t cycles = pipeline.cycles;
  cycleOf.assign(graph.ops().size(), -1);
  std::vector<bool> after(graph.ops().size(), false);  // depends on a micro-batch
  std::vector<std::vector<OpId>> byCycle(at(cycles));
  std::vector<std::vector<OpId>> copies(at(cycles));
  std::vector<OpId> before;
  std::vector<OpId> last;
  for (OpId id : schedule) {
    const OpNode& op = graph.op(id);
    if (op.microBatch != kNoMicroBatch && op.pipelineStage != kNoPipelineStage) {
      const int64_t cycle = op.microBatch + op.pipelineStage;
      cycleOf[at(id)] = cycle;
      after[at(id)] = true;
      (op.kind == OpKind::IpuCopy ? copies : byCycle)[at(cycle)].push_back(id);
      continue;
    }
    bool late = false;
    for (TensorId t : op.inputs) {
      const OpId producer = graph.tensor(t).producer;
      late = late || (producer != kNoOp && after[at(producer)]);
    }
    for (OpId b : op.after) late = late || after[at(b)];
    after[at(id)] = late;
    cycleOf[at(id)] = late ? cycles : -1;
    (late ? last : before).push_back(id);
  }
  std::vector<OpId> order = std::move(before);
  for (int64_t c = 0; c < cycles; ++c) {
    order.insert(order.end(), byCycle[at(c)].begin(), byCycle[at(c)].end());
    order.insert(order.end(), copies[at(c)].begin(), copies[at(c)].end());
  }
  order.insert(order.end(), last.begin(), last.end());
  return order;
}

}  // namespace

TimeReport modelTime(const Graph& graph, const LocalTopology& topology, std::span<const OpId> schedule,
                     const DeviceSpec& spec) {
  if (topology.localReplicas < 1) {
    throw DeviceError(ErrorCode::InvalidProgram, "Program.localReplicas",
                      fmt::format("localReplicas is {}; it must be at least 1", topology.localReplicas));
  }
  // When each resource is next free, in seconds from the start of the step;
  // tiles per IPU of the replica.
  const int64_t ipus = std::max<int64_t>(1, spec.ipusPerReplica);
  std::vector<double> computeTiles(at(ipus), 0.0);
  std::vector<double> ioTiles(at(ipus), 0.0);
  double streamingLink = 0.0;
  double ipuLinks = 0.0;
  std::map<std::string, double> links;
  std::vector<double> ready(graph.tensors().size(), 0.0);
  std::vector<double> done(graph.ops().size(), 0.0);

  TimeReport report;
  std::vector<int64_t> cycleOf;
  const std::vector<OpId> pipelined = pipelineOrder(graph, schedule, cycleOf, report.pipeline);
  PipelineTime& pipeline = report.pipeline;
  if (pipeline.enabled) {
    schedule = pipelined;
    pipeline.cycleEnds.assign(at(pipeline.cycles), 0.0);
    pipeline.stageSeconds.assign(at(pipeline.stages), 0.0);
    pipeline.startSeconds = -1.0;
  }
  double cycleStart = 0.0;  // when the cycle being placed may start
  int64_t currentCycle = -1;
  double busy = 0.0;        // compute of the cycles
  for (OpId id : schedule) {
    const OpNode& op = graph.op(id);
    const OpDef& def = opDef(op.kind);
    if (def.family == OpFamily::Source) continue;
    Work w = opWork(graph, op, def, topology, spec);
    const int64_t ipu = ipuOf(op, ipus);
    // The tiles it occupies and the link it uses, if any.
    std::array<double*, 3> resources{&computeTiles[at(ipu)], nullptr, nullptr};
    switch (w.lane) {
      case TimeLane::ComputeTiles: break;
      case TimeLane::Streaming: resources[1] = &streamingLink; break;
      case TimeLane::IOTiles: resources = {&ioTiles[at(ipu)], &streamingLink, nullptr}; break;
      case TimeLane::Link:
        resources = {w.throughIOTiles ? &ioTiles[at(ipu)] : &computeTiles[at(ipu)], &links[w.group], nullptr};
        break;
      case TimeLane::IpuLink: {
        const int64_t from = ipuOf(graph.op(graph.tensor(op.inputs[0]).producer), ipus);
        resources = {&computeTiles[at(ipu)], &computeTiles[at(from)], &ipuLinks};
        if (from == ipu) resources[1] = nullptr;
        break;
      }
    }
    double start = 0.0;
    const int64_t cycle = pipeline.enabled ? cycleOf[at(id)] : -1;
    if (pipeline.enabled && cycle >= 0) {
      if (cycle != currentCycle) {
        // Every op of the earlier cycles has been placed.
        if (currentCycle >= 0 && currentCycle < pipeline.cycles) cycleStart = pipeline.cycleEnds[at(currentCycle)];
        currentCycle = cycle;
      }
      if (cycle < pipeline.cycles) start = cycleStart;
    }
    for (TensorId t : op.inputs) start = std::max(start, ready[at(t)]);
    for (OpId before : op.after) {
      // The accumulation run's order of one micro-batch after the other is
      // what pipelining undoes: only the order within a micro-batch holds.
      const int64_t m = graph.op(before).microBatch;
      if (pipeline.enabled && op.microBatch != kNoMicroBatch && m != kNoMicroBatch && m != op.microBatch) continue;
      start = std::max(start, done[at(before)]);
    }
    for (const double* free : resources)
      if (free != nullptr) start = std::max(start, *free);
    const double end = start + w.seconds;
    for (double* free : resources)
      if (free != nullptr) *free = end;
    done[at(id)] = end;
    for (TensorId t : op.outputs) ready[at(t)] = end;

    report.stepSeconds = std::max(report.stepSeconds, end);
    if (pipeline.enabled && cycle >= 0 && cycle < pipeline.cycles) {
      pipeline.cycleEnds[at(cycle)] = std::max(pipeline.cycleEnds[at(cycle)], end);
      if (pipeline.startSeconds < 0.0 || start < pipeline.startSeconds) pipeline.startSeconds = start;
      if (w.lane != TimeLane::IpuLink) {
        busy += w.seconds;
        pipeline.stageSeconds[at(op.pipelineStage)] += w.seconds;
      }
    }
    switch (w.lane) {
      case TimeLane::ComputeTiles: report.computeSeconds += w.seconds; break;
      case TimeLane::IOTiles: report.overlappedStreamingSeconds += w.seconds; break;
      case TimeLane::Link: report.collectiveSeconds += w.seconds; break;
      case TimeLane::Streaming: report.streamingSeconds += w.seconds; break;
      case TimeLane::IpuLink:
        report.ipuCopySeconds += w.seconds;
        report.ipuCopyBytes += w.bytes;
        ++report.ipuCopies;
        break;
    }
    report.flops += w.flops;
    if (w.lane == TimeLane::Link) {
      report.linkBytes += w.bytes;
    } else if (w.lane != TimeLane::IpuLink) {
      report.streamingBytes += w.bytes;
    }
    report.ops.push_back({op.name, op.kind, w.lane, std::move(w.group), w.interInstance, start, w.seconds,
                          w.flops, w.bytes, ipu, op.pipelineStage, op.microBatch});
  }
  if (pipeline.enabled) {
    // A cycle without ops ends when the one before it ends.
    for (int64_t c = 0; c < pipeline.cycles; ++c)
      pipeline.cycleEnds[at(c)] =
          std::max(pipeline.cycleEnds[at(c)], c > 0 ? pipeline.cycleEnds[at(c - 1)] : pipeline.startSeconds);
    const auto endOf = [&](int64_t c) { return c < 0 ? pipeline.startSeconds : pipeline.cycleEnds[at(c)]; };
    const int64_t p = pipeline.stages;
    const int64_t n = pipeline.microBatches;
    const int64_t fillEnd = std::min(p - 1, pipeline.cycles) - 1;
    const int64_t mainEnd = std::max(fillEnd, n - 1);
    pipeline.fillSeconds = endOf(fillEnd) - pipeline.startSeconds;
    pipeline.mainSeconds = endOf(mainEnd) - endOf(fillEnd);
    pipeline.flushSeconds = endOf(pipeline.cycles - 1) - endOf(mainEnd);
    const double span = endOf(pipeline.cycles - 1) - pipeline.startSeconds;
    if (span > 0.0)
      pipeline.bubbleFraction =
          std::max(0.0, 1.0 - busy / (static_cast<double>(pipeline.forwardStages) * span));
    for (double& seconds : pipeline.stageSeconds) seconds /= static_cast<double>(n);
  }
  return report;
}

}  // namespace sim

TimeReport modelTime(const Program& program, const DeviceSpec& spec) {
  return sim::modelTime(program.graph, {program.localReplicas, program.globalReplicas, program.replicaOffset},
                        program.graph.schedule(), spec);
}

}  // namespace tessera
