#include "layouts.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "tessera/lib/error.hpp"

namespace tessera::sim {
namespace {

using Assignment = std::vector<int64_t>;

std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

// Numbers keys by first appearance: the first key seen is 0, the next new
// one 1, and so on. An open-addressing table of at least twice as many
// slots as keys: two allocations, however many keys.
class FirstAppearance {
 public:
  explicit FirstAppearance(std::size_t keys) {
    std::size_t slots = 16;
    while (slots < 2 * keys) slots *= 2;
    keys_.resize(slots);
    ids_.assign(slots, -1);  // -1: an empty slot
  }
  int64_t operator()(int64_t key) {
    const std::size_t mask = keys_.size() - 1;
    std::size_t slot =
        static_cast<std::size_t>(static_cast<uint64_t>(key) * 0x9e3779b97f4a7c15ull >> 17) & mask;
    while (ids_[slot] >= 0 && keys_[slot] != key) slot = (slot + 1) & mask;
    if (ids_[slot] < 0) {
      keys_[slot] = key;
      ids_[slot] = next_++;
    }
    return ids_[slot];
  }

 private:
  std::vector<int64_t> keys_;
  std::vector<int64_t> ids_;
  int64_t next_ = 0;
};

// Renumbers group ids by first appearance, in place.
void renumber(Assignment& groups) {
  FirstAppearance ids(groups.size());
  for (int64_t& g : groups) g = ids(g);
}

// True when the ids already count up by first appearance (0, then 0 or 1, ...).
bool numberedByFirstAppearance(std::span<const int64_t> groups) {
  int64_t next = 0;
  for (int64_t g : groups) {
    if (g == next) {
      ++next;
    } else if (g < 0 || g > next) {
      return false;
    }
  }
  return true;
}

// The partition of the replicas that keeps two replicas together only while
// every key part added so far gives them the same value. Parts that are
// layouts (ReplicaGroupings) are combined without a per-replica table as long
// as they agree; the first part that does not expands the partition into an
// id per replica.
class KeyPartition {
 public:
  explicit KeyPartition(int64_t replicas) : replicas_(replicas), layout_(replicas) {}

  // Replicas in different groups of `grouping` (over the same replicas) get
  // different keys.
  void add(const ReplicaGrouping& grouping) {
    if (ids_.empty()) {
      if (grouping.numGroups() == 1 || grouping == layout_ || layout_.groupSize() == 1) return;
      if (layout_.numGroups() == 1 || grouping.groupSize() == 1) {
        layout_ = grouping;
        return;
      }
      expand();
    }
    if (grouping.numGroups() == 1) return;
    join([&](int64_t r) { return grouping.groupAt(r); });
  }

  // Replicas with different `ids` (one per replica, each in [0, replicas))
  // get different keys.
  void add(std::span<const int64_t> ids) {
    if (ids_.empty()) {
      if (layout_.groupSize() == 1) return;
      expand();
    }
    join([&](int64_t r) { return ids[at(r)]; });
  }

  // The layout of the partition: the ReplicaGrouping that is exactly it, or
  // one group per replica when none is.
  ReplicaGrouping layout() const {
    if (ids_.empty()) return layout_;
    return groupingOfAssignment(ids_).value_or(perReplica(replicas_));
  }

 private:
  void expand() { ids_ = layout_.assignment(); }

  // Keys become (key, id of r): renumbered by first appearance of the pair.
  template <class IdOf>
  void join(const IdOf& idOf) {
    FirstAppearance pairs(ids_.size());
    for (int64_t r = 0; r < replicas_; ++r) ids_[at(r)] = pairs(ids_[at(r)] * replicas_ + idOf(r));
  }

  int64_t replicas_;
  ReplicaGrouping layout_;  // the partition while ids_ is empty
  Assignment ids_;          // the partition, numbered by first appearance, once expanded
};

// The layout of a partition joined with one more part.
ReplicaGrouping joined(const ReplicaGrouping& a, const ReplicaGrouping& b) {
  KeyPartition keys(a.numReplicas());
  keys.add(a);
  keys.add(b);
  return keys.layout();
}

}  // namespace

ReplicaGrouping perReplica(int64_t replicas) { return ReplicaGrouping(replicas, 1, 1); }

std::optional<ReplicaGrouping> groupingOfAssignment(std::span<const int64_t> groups) {
  const auto n = static_cast<int64_t>(groups.size());
  if (n == 0) return std::nullopt;
  Assignment renumbered;
  if (!numberedByFirstAppearance(groups)) {
    renumbered.assign(groups.begin(), groups.end());
    renumber(renumbered);
    groups = renumbered;
  }
  // Ids by first appearance make group 0 replica 0's, and the groups are
  // as many as the largest id + 1. A ReplicaGrouping has groups of equal size
  // whose members are `stride` apart: group 0's first two members give the
  // stride, and only that candidate can match.
  const int64_t numGroups = *std::max_element(groups.begin(), groups.end()) + 1;
  if (n % numGroups != 0) return std::nullopt;
  const int64_t groupSize = n / numGroups;
  int64_t stride = 1;
  if (groupSize > 1) stride = std::find(groups.begin() + 1, groups.end(), 0) - groups.begin();
  if (stride > n / groupSize || n % (stride * groupSize) != 0) return std::nullopt;
  const ReplicaGrouping candidate(n, stride, groupSize);
  for (int64_t r = 0; r < n; ++r)
    if (candidate.groupAt(r) != groups[at(r)]) return std::nullopt;
  return candidate;
}

std::vector<int64_t> localMembers(const ReplicaTopology& topology, const ReplicaGrouping& grouping,
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

int64_t localIndexInGroup(const ReplicaTopology& topology, const ReplicaGrouping& grouping, int64_t replica) {
  return grouping.indexInGroupAt(replica + topology.replicaOffset);
}

std::vector<ReplicaGrouping> inferLayouts(const Graph& graph, std::span<const OpId> schedule,
                                          const ReplicaTopology& topology, ExecutionMode mode,
                                          std::vector<ReplicaGrouping>* bufferLayouts) {
  if (topology.localReplicas < topology.globalReplicas) {
    // Other instances' values cannot be looked at, but the layouts of the
    // whole run can be inferred here too; restricted to this instance's
    // replicas they keep apart every pair of replicas whose values may differ.
    ReplicaTopology whole = topology;
    whole.localReplicas = topology.globalReplicas;
    whole.replicaOffset = 0;
    const auto restrict = [&](ReplicaGrouping& layout) {
      if (layout.numGroups() == 1 || layout.groupSize() == 1) {
        layout =
            ReplicaGrouping(topology.localReplicas, 1, layout.numGroups() == 1 ? topology.localReplicas : 1);
        return;
      }
      Assignment mine(at(topology.localReplicas));
      for (int64_t r = 0; r < topology.localReplicas; ++r)
        mine[at(r)] = layout.groupAt(r + topology.replicaOffset);
      layout = groupingOfAssignment(mine).value_or(perReplica(topology.localReplicas));
    };
    std::vector<ReplicaGrouping> layouts = inferLayouts(graph, schedule, whole, mode, bufferLayouts);
    for (ReplicaGrouping& layout : layouts) restrict(layout);
    if (bufferLayouts != nullptr)
      for (ReplicaGrouping& layout : *bufferLayouts) restrict(layout);
    return layouts;
  }
  // From here on this device simulates every replica (replicaOffset is 0),
  // so every member of every collective group is local.
  const int64_t replicas = topology.localReplicas;
  const std::size_t tensorCount = graph.tensors().size();
  if (mode == ExecutionMode::PerReplicaReference) {
    if (bufferLayouts != nullptr) bufferLayouts->assign(graph.remoteBuffers().size(), perReplica(replicas));
    return std::vector<ReplicaGrouping>(tensorCount, perReplica(replicas));
  }
  const ReplicaGrouping oneGroup(replicas);
  // What in-place writes add to their storage's layout, kept across passes.
  std::vector<ReplicaGrouping> written(tensorCount, oneGroup);
  std::vector<ReplicaGrouping> layout(tensorCount, oneGroup);

  auto storageLayout = [&](TensorId t) -> const ReplicaGrouping& { return layout[at(graph.storageOf(t))]; };
  // A key part of one id per replica.
  Assignment ids(at(replicas));
  auto idsOver = [&](auto&& idOf) -> std::span<const int64_t> {
    for (int64_t r = 0; r < replicas; ++r) ids[at(r)] = idOf(r);
    return ids;
  };

  // What each remote buffer holds. The host may write any buffer per replica,
  // so replicas' entries differ, unless a variable lives in the buffer: then
  // its entries are as fine as the variable and every value stored into them,
  // and a buffer that only ever holds a replicated value is loaded once for
  // all replicas.
  std::vector<ReplicaGrouping> held(graph.remoteBuffers().size(), perReplica(replicas));
  for (const OpNode& op : graph.ops()) {
    if (op.kind != OpKind::Variable) continue;
    const TensorNode& node = graph.tensor(op.outputs[0]);
    if (node.remoteBuffer >= 0) held[at(node.remoteBuffer)] = oneGroup;
  }
  const auto refineBuffer = [&](int64_t buffer, KeyPartition values) {
    ReplicaGrouping& buffered = held[at(buffer)];
    values.add(buffered);
    const ReplicaGrouping refined = values.layout();
    if (refined == buffered) return false;
    buffered = refined;
    return true;
  };

  for (bool changed = true; changed;) {
    changed = false;
    for (OpId id : schedule) {
      const OpNode& op = graph.op(id);
      if (op.kind == OpKind::RemoteStore) {
        KeyPartition stored(replicas);
        stored.add(storageLayout(op.inputs[0]));
        changed = refineBuffer(op.attributes.remoteBuffer, std::move(stored)) || changed;
        continue;
      }
      if (op.outputs.empty()) continue;
      const TensorId y = op.outputs[0];
      const TensorNode& node = graph.tensor(y);
      KeyPartition keys(replicas);
      switch (op.kind) {
        case OpKind::Input: keys.add(perReplica(replicas)); break;
        case OpKind::RemoteLoad: keys.add(held[at(op.attributes.remoteBuffer)]); break;
        case OpKind::Constant: break;
        case OpKind::Variable: {
          keys.add(node.grouping.value_or(oneGroup));
          if (!node.metaShape.empty())
            keys.add(idsOver([&](int64_t r) { return shardIndexAt(node, topology.globalReplicas, r); }));
          if (node.remoteBuffer >= 0) changed = refineBuffer(node.remoteBuffer, keys) || changed;
          break;
        }
        case OpKind::ReplicatedAllReduce:
        case OpKind::ReplicatedReduceScatter:
        case OpKind::ReplicatedAllGather:
        case OpKind::ReplicaShardedSlice:
        case OpKind::ReplicaShardedPad: {
          const ReplicaGrouping grouping = op.attributes.grouping.value_or(oneGroup);
          const ReplicaGrouping& x = storageLayout(op.inputs[0]);
          const bool gathers = op.kind != OpKind::ReplicaShardedSlice && op.kind != OpKind::ReplicaShardedPad;
          const bool keepsIndex =
              op.kind != OpKind::ReplicatedAllReduce && op.kind != OpKind::ReplicatedAllGather;
          if (!gathers || grouping.groupSize() == 1) {
            // The replica's own value.
            keys.add(x);
          } else if (x.numGroups() > 1) {
            // The values of the group's members, in order: equal sequences
            // get equal ids, worked out once per group.
            std::map<Assignment, int64_t> sequences;
            Assignment groupIds(at(grouping.numGroups()));
            Assignment members(at(grouping.groupSize()));
            for (int64_t c = 0; c < grouping.numGroups(); ++c) {
              for (int64_t i = 0; i < grouping.groupSize(); ++i)
                members[at(i)] = x.groupAt(grouping.replicaAt(c, i));
              groupIds[at(c)] =
                  sequences.try_emplace(members, static_cast<int64_t>(sequences.size())).first->second;
            }
            keys.add(idsOver([&](int64_t r) { return groupIds[at(grouping.groupAt(r))]; }));
          }
          if (keepsIndex) keys.add(idsOver([&](int64_t r) { return grouping.indexInGroupAt(r); }));
          break;
        }
        default:
          for (TensorId in : op.inputs) keys.add(storageLayout(in));
          break;
      }
      const std::size_t storage = at(graph.storageOf(y));
      keys.add(written[storage]);
      if (isInplace(op.kind)) {
        // The storage must be as fine as every value written into it.
        const ReplicaGrouping refined = keys.layout();
        if (refined != written[storage]) {
          written[storage] = refined;
          changed = true;
        }
        continue;
      }
      layout[storage] = keys.layout();
    }
    // Storages refined by in-place writes take their refinement at once.
    for (std::size_t t = 0; t < tensorCount; ++t) {
      if (graph.storageOf(static_cast<TensorId>(t)) != static_cast<TensorId>(t)) continue;
      const ReplicaGrouping value = joined(layout[t], written[t]);
      if (value != layout[t]) {
        layout[t] = value;
        changed = true;
      }
    }
  }
  std::vector<ReplicaGrouping> layouts;
  layouts.reserve(tensorCount);
  for (std::size_t t = 0; t < tensorCount; ++t) layouts.push_back(storageLayout(static_cast<TensorId>(t)));
  if (bufferLayouts != nullptr) *bufferLayouts = held;
  return layouts;
}

}  // namespace tessera::sim
