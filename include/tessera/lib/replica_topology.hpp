// ReplicaTopology: how the replicas of a run are laid out, in one value.
//
// A run has globalReplicas replicas over every instance; this instance (its
// device) runs localReplicas of them, global indices replicaOffset to
// replicaOffset + localReplicas - 1, and each replica spans ipusPerReplica
// IPUs. The value is derived once, from the session options
// (enableReplicatedGraphs/replicatedGraphCount for the local count,
// enableDistributedReplicatedGraphs/globalReplicationFactor/
// globalReplicaOffset for the global count and the offset) and the device
// (DeviceSpec::ipusPerReplica, i.e. /device/ipusPerReplica), by
// ReplicaTopology::fromOptions. The rules on those options are checked by
// validate(SessionOptions) (tessera.config.110-118); that a graph was built
// for the topology is checked once, by checkReplicationFactor
// (tessera.graph.210), when a session or a plan takes the graph. The session
// then hands the same value to the transforms and, as Program::replicas, to
// the device, which only asserts its invariants.
#pragma once

#include <cstdint>

namespace tessera {

class Graph;
struct SessionOptions;

struct ReplicaTopology {
  int64_t globalReplicas = 1;  // replicas of the whole run, every instance's (Graph::replicationFactor)
  int64_t localReplicas = 1;   // replicas this instance runs; divides globalReplicas
  int64_t replicaOffset = 0;   // global index of this instance's first replica: a multiple of localReplicas
  int64_t ipusPerReplica = 1;  // IPUs a replica spans (DeviceSpec::ipusPerReplica)

  // The topology of `options` on a device of `ipusPerReplica` IPUs per
  // replica: localReplicas is replicatedGraphCount when enableReplicatedGraphs
  // is true, else 1; globalReplicas and replicaOffset are
  // globalReplicationFactor and globalReplicaOffset when
  // enableDistributedReplicatedGraphs is true, else localReplicas and 0.
  // Nothing is checked here: validate(options) checks the rules first.
  static ReplicaTopology fromOptions(const SessionOptions& options, int64_t ipusPerReplica = 1) noexcept;

  // Instances of the run, and the index of this one.
  int64_t instances() const noexcept { return globalReplicas / localReplicas; }
  int64_t instance() const noexcept { return replicaOffset / localReplicas; }
  // True when other instances run some of the replicas.
  bool distributed() const noexcept { return localReplicas != globalReplicas; }

  // The invariants every derived topology keeps: localReplicas >= 1 divides
  // globalReplicas, replicaOffset is a multiple of localReplicas with
  // replicaOffset + localReplicas <= globalReplicas, ipusPerReplica >= 1.
  bool consistent() const noexcept;

  bool operator==(const ReplicaTopology&) const = default;
};

// The one check that `graph` was built for the topology's global replica
// count: throws GraphError(ReplicationFactorMismatch) naming "Graph" when
// graph.replicationFactor() is not topology.globalReplicas.
void checkReplicationFactor(const Graph& graph, const ReplicaTopology& topology);

}  // namespace tessera
