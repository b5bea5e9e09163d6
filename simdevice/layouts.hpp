// Replica layouts: which local replicas hold the same value of a tensor.
//
// A layout is a ReplicaGrouping over the replicas this device simulates;
// replicas of one group hold one value and the buffer stores one value per
// group. Layouts are inferred from value equality: for every replica the
// planner computes a key (the groups of the values it was computed from) and
// replicas with equal keys share a group. When the partition of equal keys is
// not a ReplicaGrouping, the layout is per replica, which is always correct.
//
// The inference keeps one ReplicaGrouping per tensor, never a table per
// replica: a key made of layouts that agree (or of one layout) is that
// layout, and only keys that combine different layouts are worked out
// replica by replica, in time linear in the replica count. A collective's
// key is worked out once per group of its grouping, not once per replica.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/simdevice/device.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/lib/replica_grouping.hpp"

namespace tessera::sim {

// One group per replica.
ReplicaGrouping perReplica(int64_t replicas);

// The grouping whose assignment() equals `groups` after renumbering the groups
// by first appearance, or nullopt when no ReplicaGrouping partitions the
// replicas that way. Linear in the replica count.
std::optional<ReplicaGrouping> groupingOfAssignment(std::span<const int64_t> groups);

// The replicas of this device in a collective's group, as local indices in
// group order. `grouping` is over the global replicas.
// Members of the group of local replica r, and r's index in that group.
// Throws DeviceError(InvalidProgram) naming `subject` when a member is not
// simulated by this device.
std::vector<int64_t> localMembers(const ReplicaTopology& topology, const ReplicaGrouping& grouping,
                                  int64_t replica, const std::string& subject);
int64_t localIndexInGroup(const ReplicaTopology& topology, const ReplicaGrouping& grouping, int64_t replica);

// Layouts of every tensor's storage (indexed by tensor id; aliases share
// their storage's layout). In PerReplicaReference mode every layout is per
// replica. `schedule` is graph.schedule(). With `bufferLayouts`, also what
// each remote buffer holds: replicas of one group always have equal
// entries (a buffer that only ever holds a replicated value is one group).
std::vector<ReplicaGrouping> inferLayouts(const Graph& graph, std::span<const OpId> schedule,
                                          const ReplicaTopology& topology, ExecutionMode mode,
                                          std::vector<ReplicaGrouping>* bufferLayouts = nullptr);

}  // namespace tessera::sim
