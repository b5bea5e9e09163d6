#include "tessera/lib/replica_topology.hpp"

#include <fmt/format.h>

#include "tessera/lib/error.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/lib/session_options.hpp"

namespace tessera {

ReplicaTopology ReplicaTopology::fromOptions(const SessionOptions& options, int64_t ipusPerReplica) noexcept {
  ReplicaTopology topology;
  topology.localReplicas = options.enableReplicatedGraphs ? options.replicatedGraphCount : 1;
  topology.globalReplicas =
      options.enableDistributedReplicatedGraphs ? options.globalReplicationFactor : topology.localReplicas;
  topology.replicaOffset = options.enableDistributedReplicatedGraphs ? options.globalReplicaOffset : 0;
  topology.ipusPerReplica = ipusPerReplica;
  return topology;
}

bool ReplicaTopology::consistent() const noexcept {
  return localReplicas >= 1 && localReplicas <= globalReplicas && globalReplicas % localReplicas == 0 &&
         replicaOffset >= 0 && replicaOffset % localReplicas == 0 &&
         replicaOffset + localReplicas <= globalReplicas && ipusPerReplica >= 1;
}

void checkReplicationFactor(const Graph& graph, const ReplicaTopology& topology) {
  if (graph.replicationFactor() == topology.globalReplicas) return;
  throw GraphError(ErrorCode::ReplicationFactorMismatch, "Graph",
                   fmt::format("the graph was built for {} replica(s) but the session options give a global "
                               "replication factor of {}; build the graph with Graph({})",
                               graph.replicationFactor(), topology.globalReplicas, topology.globalReplicas));
}

}  // namespace tessera
