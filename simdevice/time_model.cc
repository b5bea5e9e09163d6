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
    for (TensorId t : op.inputs) start = std::max(start, ready[at(t)]);
    for (OpId before : op.after) start = std::max(start, done[at(before)]);
    for (const double* free : resources)
      if (free != nullptr) start = std::max(start, *free);
    const double end = start + w.seconds;
    for (double* free : resources)
      if (free != nullptr) *free = end;
    done[at(id)] = end;
    for (TensorId t : op.outputs) ready[at(t)] = end;

    report.stepSeconds = std::max(report.stepSeconds, end);
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
                          w.flops, w.bytes, ipu});
  }
  return report;
}

}  // namespace sim

TimeReport modelTime(const Program& program, const DeviceSpec& spec) {
  return sim::modelTime(program.graph, {program.localReplicas, program.globalReplicas, program.replicaOffset},
                        program.graph.schedule(), spec);
}

}  // namespace tessera
