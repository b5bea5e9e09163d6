// The replication transform: gradients reduced over the replicas that share
// a weight before the update (data parallelism).
//
// With a global replication factor R > 1, each gradient gets one
// ReplicatedAllReduce, Sum or Mean per accumulationAndReplicationReductionType,
// over all replicas for an ordinary weight and within the weight's grouping
// for a grouped variable (replicas that share a value reduce together; a
// grouping of one replica per group needs no reduction). With Mean the
// replicas always reduce with one Mean all-reduce: the Running/Post strategy
// only changes how micro-batches are accumulated.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/lib/replica_topology.hpp"
#include "tessera/lib/session_options.hpp"
#include "tessera/sessions/transform.hpp"

namespace tessera {

class ReplicationTransform final : public Transform {
 public:
  ReplicationTransform(const SessionOptions& options, const ReplicaTopology& topology,
                       TrainingTensors& tensors);

  std::string_view name() const noexcept override { return "replication"; }
  // Replaces tensors.gradients by the reduced gradients "<gradient>.reduced".
  // The graph's replication factor is the topology's global count (checked
  // once, by checkReplicationFactor, before the pipeline runs; asserted
  // here). A replica-sharded weight's gradient comes from autodiff's
  // ReduceScatter; only the replicas holding the same shard are still
  // reduced over (and a Mean scaled).
  void apply(Graph& graph) override;

 private:
  void reduceShardGradient(Graph& graph, std::size_t k, const ReplicaGrouping& grouping);
  void reduceScatteredGradient(Graph& graph, std::size_t k, const ReplicaGrouping& grouping);

  int64_t replicas_;
  ReductionType reduction_;
  TrainingTensors& tensors_;
};

}  // namespace tessera
