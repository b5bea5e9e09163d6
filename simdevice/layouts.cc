#include "layouts.hpp"

#include <map>

#include <fmt/format.h>

#include "tessera/error.hpp"

namespace tessera::sim {
namespace {

using Assignment = std::vector<int64_t>;

// Replicas share a group when they share a group in both.
Assignment join(const Assignment& a, const Assignment& b) {
  std::vector<std::vector<int64_t>> keys(a.size());
  for (std::size_t r = 0; r < a.size(); ++r) keys[r] = {a[r], b[r]};
  return assignmentOfKeys(keys);
}

ReplicaGrouping groupingOf(const Assignment& groups) {
  return groupingOfAssignment(groups).value_or(perReplica(static_cast<int64_t>(groups.size())));
}

}  // namespace

ReplicaGrouping perReplica(int64_t replicas) { return ReplicaGrouping(replicas, 1, 1); }

std::vector<int64_t> assignmentOfKeys(const std::vector<std::vector<int64_t>>& keys) {
  std::map<std::vector<int64_t>, int64_t> ids;
  std::vector<int64_t> out;
  out.reserve(keys.size());
  for (const auto& key : keys) {
    auto [it, inserted] = ids.emplace(key, static_cast<int64_t>(ids.size()));
    out.push_back(it->second);
  }
  return out;
}

std::optional<ReplicaGrouping> groupingOfAssignment(std::span<const int64_t> groups) {
  const auto n = static_cast<int64_t>(groups.size());
  std::vector<std::vector<int64_t>> keys;
  keys.reserve(groups.size());
  for (int64_t g : groups) keys.push_back({g});
  const Assignment canonical = assignmentOfKeys(keys);
  for (int64_t groupSize = 1; groupSize <= n; ++groupSize) {
    if (n % groupSize != 0) continue;
    for (int64_t stride = 1; stride * groupSize <= n; ++stride) {
      if (n % (stride * groupSize) != 0) continue;
      const ReplicaGrouping candidate(n, stride, groupSize);
      if (candidate.assignment() == canonical) return candidate;
      if (groupSize == 1) break;  // every stride is the same grouping
    }
  }
  return std::nullopt;
}

std::vector<int64_t> localMembers(const LocalTopology& topology, const ReplicaGrouping& grouping,
                                  int64_t replica, const std::string& subject) {
  const int64_t global = replica + topology.replicaOffset;
  std::vector<int64_t> members = grouping.replicasAt(grouping.groupAt(global));
  for (int64_t& m : members) {
    m -= topology.replicaOffset;
    if (m < 0 || m >= topology.localReplicas) {
      throw DeviceError(
          ErrorCode::InvalidProgram, subject,
          fmt::format("the collective's group {} spans replicas {}..{} beyond the {} replicas this "
                      "device simulates (global {}..{}); run such collectives through the "
                      "multi-instance backend or choose a grouping within one instance",
                      grouping.str(), m + topology.replicaOffset, global, topology.localReplicas,
                      topology.replicaOffset, topology.replicaOffset + topology.localReplicas - 1));
    }
  }
  return members;
}

int64_t localIndexInGroup(const LocalTopology& topology, const ReplicaGrouping& grouping, int64_t replica) {
  return grouping.indexInGroupAt(replica + topology.replicaOffset);
}

std::vector<ReplicaGrouping> inferLayouts(const Graph& graph, std::span<const OpId> schedule,
                                          const LocalTopology& topology, ExecutionMode mode,
                                          std::vector<ReplicaGrouping>* bufferLayouts) {
  if (topology.localReplicas < topology.globalReplicas) {
    // Other instances' values cannot be looked at, but the layouts of the
    // whole run can be inferred here too; restricted to this instance's
    // replicas they keep apart every pair of replicas whose values may differ.
    const LocalTopology whole{topology.globalReplicas, topology.globalReplicas, 0};
    const auto restrict = [&](ReplicaGrouping& layout) {
      const std::vector<int64_t> all = layout.assignment();
      const std::span<const int64_t> mine(all.data() + topology.replicaOffset,
                                          static_cast<std::size_t>(topology.localReplicas));
      layout = groupingOfAssignment(mine).value_or(perReplica(topology.localReplicas));
    };
    std::vector<ReplicaGrouping> layouts = inferLayouts(graph, schedule, whole, mode, bufferLayouts);
    for (ReplicaGrouping& layout : layouts) restrict(layout);
    if (bufferLayouts != nullptr)
      for (ReplicaGrouping& layout : *bufferLayouts) restrict(layout);
    return layouts;
  }
  const int64_t replicas = topology.localReplicas;
  const std::size_t tensorCount = graph.tensors().size();
  if (mode == ExecutionMode::PerReplicaReference) {
    if (bufferLayouts != nullptr) bufferLayouts->assign(graph.remoteBuffers().size(), perReplica(replicas));
    return std::vector<ReplicaGrouping>(tensorCount, perReplica(replicas));
  }
  const auto local = static_cast<std::size_t>(replicas);
  const Assignment oneGroup(local, 0);
  // What in-place writes add to their storage's layout, kept across passes.
  std::vector<Assignment> written(tensorCount, oneGroup);
  std::vector<Assignment> assignment(tensorCount, oneGroup);

  auto storageAssignment = [&](TensorId t) -> const Assignment& {
    return assignment[static_cast<std::size_t>(graph.storageOf(t))];
  };
  auto keysOver = [&](auto&& keyOf) {
    std::vector<std::vector<int64_t>> keys(local);
    for (std::size_t r = 0; r < local; ++r) keys[r] = keyOf(static_cast<int64_t>(r));
    return keys;
  };

  // What each remote buffer holds. The host may write any buffer per replica,
  // so replicas' entries differ, unless a variable lives in the buffer: then
  // its entries are as fine as the variable and every value stored into them,
  // and a buffer that only ever holds a replicated value is loaded once for
  // all replicas.
  Assignment eachOwn(local);
  for (std::size_t r = 0; r < local; ++r) eachOwn[r] = static_cast<int64_t>(r);
  std::vector<Assignment> bufferAssignment(graph.remoteBuffers().size(), eachOwn);
  for (const OpNode& op : graph.ops()) {
    if (op.kind != OpKind::Variable) continue;
    const TensorNode& node = graph.tensor(op.outputs[0]);
    if (node.remoteBuffer >= 0) bufferAssignment[static_cast<std::size_t>(node.remoteBuffer)] = oneGroup;
  }
  const auto refineBuffer = [&](int64_t buffer, const Assignment& values) {
    Assignment& held = bufferAssignment[static_cast<std::size_t>(buffer)];
    Assignment refined = groupingOf(join(held, values)).assignment();
    if (refined == held) return false;
    held = std::move(refined);
    return true;
  };

  for (bool changed = true; changed;) {
    changed = false;
    for (OpId id : schedule) {
      const OpNode& op = graph.op(id);
      if (op.kind == OpKind::RemoteStore) {
        changed = refineBuffer(op.attributes.remoteBuffer, storageAssignment(op.inputs[0])) || changed;
        continue;
      }
      if (op.outputs.empty()) continue;
      const TensorId y = op.outputs[0];
      const TensorNode& node = graph.tensor(y);
      std::vector<std::vector<int64_t>> keys;
      switch (op.kind) {
        case OpKind::Input: keys = keysOver([](int64_t r) { return std::vector<int64_t>{r}; }); break;
        case OpKind::RemoteLoad: {
          const Assignment& held = bufferAssignment[static_cast<std::size_t>(op.attributes.remoteBuffer)];
          keys = keysOver([&](int64_t r) { return std::vector<int64_t>{held[static_cast<std::size_t>(r)]}; });
          break;
        }
        case OpKind::Constant: keys = keysOver([](int64_t) { return std::vector<int64_t>{0}; }); break;
        case OpKind::Variable: {
          const ReplicaGrouping grouping = node.grouping.value_or(ReplicaGrouping(topology.globalReplicas));
          const bool sharded = !node.metaShape.empty();
          keys = keysOver([&](int64_t r) {
            const int64_t global = r + topology.replicaOffset;
            std::vector<int64_t> key{grouping.groupAt(global)};
            if (sharded) key.push_back(shardIndexAt(node, topology.globalReplicas, global));
            return key;
          });
          if (node.remoteBuffer >= 0) changed = refineBuffer(node.remoteBuffer, assignmentOfKeys(keys)) || changed;
          break;
        }
        case OpKind::ReplicatedAllReduce:
        case OpKind::ReplicatedReduceScatter:
        case OpKind::ReplicatedAllGather:
        case OpKind::ReplicaShardedSlice:
        case OpKind::ReplicaShardedPad: {
          const ReplicaGrouping grouping =
              op.attributes.grouping.value_or(ReplicaGrouping(topology.globalReplicas));
          const Assignment& x = storageAssignment(op.inputs[0]);
          const bool gathers = op.kind != OpKind::ReplicaShardedSlice && op.kind != OpKind::ReplicaShardedPad;
          const bool keepsIndex =
              op.kind != OpKind::ReplicatedAllReduce && op.kind != OpKind::ReplicatedAllGather;
          keys = keysOver([&](int64_t r) {
            std::vector<int64_t> key;
            if (gathers) {
              for (int64_t m : localMembers(topology, grouping, r, op.name))
                key.push_back(x[static_cast<std::size_t>(m)]);
            } else {
              localMembers(topology, grouping, r, op.name);
              key.push_back(x[static_cast<std::size_t>(r)]);
            }
            if (keepsIndex) key.push_back(localIndexInGroup(topology, grouping, r));
            return key;
          });
          break;
        }
        default:
          keys = keysOver([&](int64_t r) {
            std::vector<int64_t> key;
            for (TensorId in : op.inputs) key.push_back(storageAssignment(in)[static_cast<std::size_t>(r)]);
            return key;
          });
          break;
      }
      const std::size_t storage = static_cast<std::size_t>(graph.storageOf(y));
      if (isInplace(op.kind)) {
        // The storage must be as fine as every value written into it.
        Assignment refined = join(written[storage], assignmentOfKeys(keys));
        refined = groupingOf(refined).assignment();
        if (refined != written[storage]) {
          written[storage] = std::move(refined);
          changed = true;
        }
        continue;
      }
      assignment[storage] = groupingOf(join(assignmentOfKeys(keys), written[storage])).assignment();
    }
    // Storages refined by in-place writes take their refinement at once.
    for (std::size_t t = 0; t < tensorCount; ++t) {
      if (graph.storageOf(static_cast<TensorId>(t)) != static_cast<TensorId>(t)) continue;
      Assignment value = groupingOf(join(assignment[t], written[t])).assignment();
      if (value != assignment[t]) {
        assignment[t] = std::move(value);
        changed = true;
      }
    }
  }
  std::vector<ReplicaGrouping> layouts;
  layouts.reserve(tensorCount);
  for (std::size_t t = 0; t < tensorCount; ++t) {
    layouts.push_back(
        groupingOf(assignment[static_cast<std::size_t>(graph.storageOf(static_cast<TensorId>(t)))]));
  }
  if (bufferLayouts != nullptr) {
    bufferLayouts->clear();
    for (const Assignment& held : bufferAssignment) bufferLayouts->push_back(groupingOf(held));
  }
  return layouts;
}

}  // namespace tessera::sim
