#include "time_model.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "memory_planner.hpp"
#include "tessera/device.hpp"
#include "tessera/error.hpp"

namespace tessera {
namespace sim {
namespace {

std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

double elementsOf(const Graph& graph, TensorId t) {
  return static_cast<double>(numElements(graph.tensor(t).shape));
}

double bytesOf(const Graph& graph, TensorId t) {
  return elementsOf(graph, t) * static_cast<double>(kBytesPerElement);
}

// The arithmetic of one replica's op (the table in tessera/time_model.hpp).
double computeFlops(const Graph& graph, const OpNode& op) {
  const double out = op.outputs.empty() ? 0.0 : elementsOf(graph, op.outputs[0]);
  const double in = op.inputs.empty() ? 0.0 : elementsOf(graph, op.inputs[0]);
  switch (op.kind) {
    case OpKind::MatMul: {
      const Shape& a = graph.tensor(op.inputs[0]).shape;
      return 2.0 * out * (a.empty() ? 1.0 : static_cast<double>(a.back()));
    }
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::Div:
    case OpKind::Neg:
    case OpKind::Relu:
    case OpKind::ReluGrad:
    case OpKind::Copy:
    case OpKind::CopyInplace:
    case OpKind::Transpose:
    case OpKind::Slice:
    case OpKind::Concat:
    case OpKind::BroadcastTo:
    case OpKind::SlicePad:
    case OpKind::ReplicaShardedSlice:
    case OpKind::ReplicaShardedPad: return out;
    case OpKind::ScaledAddInplace: return 3.0 * out;
    case OpKind::Exp:
    case OpKind::Log:
    case OpKind::Sqrt:
    case OpKind::Tanh:
    case OpKind::Sigmoid: return 4.0 * out;
    case OpKind::Softmax:
    case OpKind::LogSoftmax: return 5.0 * out;
    case OpKind::SoftmaxCrossEntropy: return 5.0 * in;
    case OpKind::SoftmaxCrossEntropyGrad: return 5.0 * elementsOf(graph, op.inputs[1]);
    case OpKind::Gelu:
    case OpKind::GeluGrad: return 8.0 * out;
    case OpKind::ReduceSum:
    case OpKind::ReduceMean:
    case OpKind::ReduceToShape:
    case OpKind::ArgMax: return in;
    case OpKind::Reshape:
    case OpKind::Input:
    case OpKind::Variable:
    case OpKind::Constant:
    case OpKind::ReplicatedAllReduce:
    case OpKind::ReplicatedReduceScatter:
    case OpKind::ReplicatedAllGather:
    case OpKind::RemoteLoad:
    case OpKind::RemoteStore: return 0.0;
  }
  return 0.0;
}

bool isSource(OpKind kind) {
  return kind == OpKind::Input || kind == OpKind::Variable || kind == OpKind::Constant;
}

// Collectives that move data between replicas (the sharded slice and pad
// only rearrange a replica's own value).
bool movesData(OpKind kind) {
  return kind == OpKind::ReplicatedAllReduce || kind == OpKind::ReplicatedReduceScatter ||
         kind == OpKind::ReplicatedAllGather;
}

bool onIOTiles(const Graph& graph, TensorId t) {
  return graph.tensor(t).tileSet == TileSet::IO || graph.tensor(graph.storageOf(t)).tileSet == TileSet::IO;
}

bool spansInstances(const ReplicaGrouping& grouping, int64_t localReplicas) {
  for (int64_t group = 0; group < grouping.numGroups(); ++group) {
    const int64_t instance = grouping.replicaAt(group, 0) / localReplicas;
    for (int64_t m = 1; m < grouping.groupSize(); ++m)
      if (grouping.replicaAt(group, m) / localReplicas != instance) return true;
  }
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

Work collectiveWork(const Graph& graph, const OpNode& op, const LocalTopology& topology,
                    const DeviceSpec& spec) {
  Work w;
  w.lane = TimeLane::Link;
  const ReplicaGrouping grouping =
      op.attributes.grouping.value_or(ReplicaGrouping(graph.replicationFactor()));
  w.group = grouping.str();
  w.throughIOTiles = onIOTiles(graph, op.inputs[0]) || onIOTiles(graph, op.outputs[0]);
  const auto g = static_cast<double>(grouping.groupSize());
  if (grouping.groupSize() == 1) return w;
  w.interInstance = spansInstances(grouping, topology.localReplicas);
  const double kBytes = static_cast<double>(kBytesPerElement);
  switch (op.kind) {
    case OpKind::ReplicatedAllReduce: w.bytes = 2.0 * (g - 1.0) / g * bytesOf(graph, op.inputs[0]); break;
    case OpKind::ReplicatedReduceScatter:
      // Every replica sends g - 1 padded shards of ceil(n/g) elements.
      w.bytes = (g - 1.0) * elementsOf(graph, op.outputs[0]) * kBytes;
      break;
    default:  // ReplicatedAllGather: receives the g - 1 other shards.
      w.bytes = (g - 1.0) * elementsOf(graph, op.inputs[0]) * kBytes;
      break;
  }
  const double bandwidth =
      w.interInstance ? spec.interInstanceBandwidthBytesPerSecond : spec.linkBandwidthBytesPerSecond;
  w.seconds = spec.transferLatencySeconds + w.bytes / bandwidth;
  return w;
}

Work opWork(const Graph& graph, const OpNode& op, const LocalTopology& topology, const DeviceSpec& spec) {
  if (movesData(op.kind)) return collectiveWork(graph, op, topology, spec);
  if (op.kind == OpKind::RemoteLoad || op.kind == OpKind::RemoteStore) {
    const TensorId moved = op.kind == OpKind::RemoteLoad ? op.outputs[0] : op.inputs[0];
    Work w;
    w.throughIOTiles = onIOTiles(graph, moved);
    w.lane = w.throughIOTiles ? TimeLane::IOTiles : TimeLane::Streaming;
    w.bytes = bytesOf(graph, moved);
    w.seconds = spec.transferLatencySeconds + w.bytes / spec.streamingBandwidthBytesPerSecond;
    return w;
  }
  Work w;
  w.flops = computeFlops(graph, op);
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
  // When each resource is next free, in seconds from the start of the step.
  double computeTiles = 0.0;
  double ioTiles = 0.0;
  double streamingLink = 0.0;
  std::map<std::string, double> links;
  std::vector<double> ready(graph.tensors().size(), 0.0);
  std::vector<double> done(graph.ops().size(), 0.0);

  TimeReport report;
  for (OpId id : schedule) {
    const OpNode& op = graph.op(id);
    if (isSource(op.kind)) continue;
    Work w = opWork(graph, op, topology, spec);
    // The tiles it occupies and the link it uses, if any.
    std::array<double*, 2> resources{&computeTiles, nullptr};
    switch (w.lane) {
      case TimeLane::ComputeTiles: break;
      case TimeLane::Streaming: resources[1] = &streamingLink; break;
      case TimeLane::IOTiles: resources = {&ioTiles, &streamingLink}; break;
      case TimeLane::Link: resources = {w.throughIOTiles ? &ioTiles : &computeTiles, &links[w.group]}; break;
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
    }
    report.flops += w.flops;
    (w.lane == TimeLane::Link ? report.linkBytes : report.streamingBytes) += w.bytes;
    report.ops.push_back(
        {op.name, op.kind, w.lane, std::move(w.group), w.interInstance, start, w.seconds, w.flops, w.bytes});
  }
  return report;
}

}  // namespace sim

TimeReport modelTime(const Program& program, const DeviceSpec& spec) {
  return sim::modelTime(program.graph, {program.localReplicas, program.globalReplicas, program.replicaOffset},
                        program.graph.schedule(), spec);
}

}  // namespace tessera
