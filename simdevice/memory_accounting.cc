#include "memory_accounting.hpp"

#include <algorithm>
#include <vector>

namespace tessera::sim {

MemoryReport accountMemory(const Program& program, std::span<const OpId> schedule, const DeviceSpec& spec) {
  const Graph& graph = program.graph;
  auto bytesOf = [](const Shape& shape) { return numElements(shape) * kBytesPerElement; };

  int64_t variableBytes = 0;
  for (const OpNode& op : graph.ops()) {
    if (op.kind != OpKind::Variable) continue;
    const TensorNode& node = graph.tensor(op.outputs[0]);
    if (node.remoteBuffer < 0) variableBytes += bytesOf(node.shape);
  }
  int64_t remoteBytes = 0;
  for (const RemoteBufferInfo& info : graph.remoteBuffers())
    remoteBytes += info.entries * bytesOf(info.shape);

  // Liveness of every storage that is not a variable: [first, last] positions.
  const std::size_t tensorCount = graph.tensors().size();
  std::vector<int64_t> first(tensorCount, -1);
  std::vector<int64_t> last(tensorCount, -1);
  std::vector<char> counted(tensorCount, 0);
  for (std::size_t pos = 0; pos < schedule.size(); ++pos) {
    const OpNode& op = graph.op(schedule[pos]);
    const auto now = static_cast<int64_t>(pos);
    auto touch = [&](TensorId t) {
      const auto s = static_cast<std::size_t>(graph.storageOf(t));
      if (first[s] < 0) first[s] = now;
      last[s] = std::max(last[s], now);
    };
    for (TensorId t : op.inputs) touch(t);
    for (TensorId t : op.outputs) touch(t);
    if (op.kind != OpKind::Variable) {
      for (TensorId t : op.outputs)
        if (graph.storageOf(t) == t) counted[static_cast<std::size_t>(t)] = 1;
    }
  }
  std::vector<int64_t> delta(schedule.size() + 1, 0);
  for (std::size_t t = 0; t < tensorCount; ++t) {
    if (!counted[t] || first[t] < 0) continue;
    const int64_t bytes = bytesOf(graph.tensor(static_cast<TensorId>(t)).shape);
    delta[static_cast<std::size_t>(first[t])] += bytes;
    delta[static_cast<std::size_t>(last[t]) + 1] -= bytes;
  }
  int64_t live = 0;
  int64_t peak = 0;
  for (int64_t d : delta) {
    live += d;
    peak = std::max(peak, live);
  }

  MemoryReport report;
  report.computeTilesCapacity = (spec.tilesPerIpu - program.numIOTiles) * spec.bytesPerTile;
  report.ioTilesCapacity = program.numIOTiles * spec.bytesPerTile;
  report.streamingCapacity = spec.streamingMemoryBytes;
  for (int64_t r = 0; r < program.localReplicas; ++r) {
    ReplicaMemory m;
    m.replica = program.replicaOffset + r;
    m.variableBytes = variableBytes;
    m.peakActivationBytes = peak;
    m.remoteBufferBytes = remoteBytes;
    m.computeTilesBytes = variableBytes + peak;
    m.ioTilesBytes = 0;
    m.streamingBytes = remoteBytes;
    report.perReplica.push_back(m);
  }
  return report;
}

}  // namespace tessera::sim
