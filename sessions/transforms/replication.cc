#include "replication.hpp"

#include <cassert>

#include <fmt/format.h>

#include "derived_grouping.hpp"
#include "locations.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"

namespace tessera {

ReplicationTransform::ReplicationTransform(const SessionOptions& options, const ReplicaTopology& topology,
                                           TrainingTensors& tensors)
    : replicas_(topology.globalReplicas), reduction_(options.accumulationAndReplicationReductionType),
      tensors_(tensors) {}

void ReplicationTransform::apply(Graph& graph) {
  // Checked where the session or plan took the graph (checkReplicationFactor).
  assert(graph.replicationFactor() == replicas_);
  if (replicas_ == 1) return;
  if (tensors_.gradients.size() != tensors_.weights.size()) {
    throw GraphError(ErrorCode::InvalidOperand, "gradients",
                     fmt::format("{} weights but {} gradients; run autodiff before reducing gradients",
                                 tensors_.weights.size(), tensors_.gradients.size()));
  }
  for (std::size_t k = 0; k < tensors_.weights.size(); ++k) {
    const TensorNode& weight = graph.tensor(tensors_.weights[k]);
    const ReplicaGrouping grouping = weight.grouping.value_or(ReplicaGrouping(replicas_));
    if (grouping.groupSize() == 1) continue;
    if (!weight.metaShape.empty()) {
      reduceShardGradient(graph, k, grouping);
      continue;
    }
    if (!graph.tensor(tensors_.gradients[k]).metaShape.empty()) {
      reduceScatteredGradient(graph, k, grouping);
      continue;
    }
    const std::optional<ReplicaGrouping> over =
        grouping.numGroups() == 1 ? std::nullopt : std::optional<ReplicaGrouping>(grouping);
    const Tensor gradient{&graph, tensors_.gradients[k]};
    const Tensor reduced = ops::replicatedAllReduce(gradient, reduction_, over);
    graph.rename(reduced.id(), graph.uniqueName(gradient.name() + ".reduced"));
    tensors_.gradients[k] = reduced.id();
  }
}

// A replica-sharded weight is used through an AllGather over the replicas
// that hold one shard each, so autodiff already reduce-scattered (summed) its
// gradient over them. What is left: summing over the replicas of the
// weight's group that hold the same shard, and the 1/groupSize of a Mean.
void ReplicationTransform::reduceShardGradient(Graph& graph, std::size_t k, const ReplicaGrouping& grouping) {
  const TensorNode& weight = graph.tensor(tensors_.weights[k]);
  const int64_t shards = weight.shardCount;
  if (shards < 1 || grouping.groupSize() % shards != 0) {
    throw GraphError(ErrorCode::InvalidCollective, weight.name,
                     fmt::format("{} shards do not divide the {} replicas of its group {}", shards,
                                 grouping.groupSize(), grouping.str()));
  }
  const std::string name = graph.tensor(tensors_.gradients[k]).name;
  Tensor gradient{&graph, tensors_.gradients[k]};
  const int64_t holders = grouping.groupSize() / shards;
  if (holders > 1) {
    // Without a domain, member m of the group holds shard m mod shards.
    const ReplicaGrouping over =
        weight.shardDomain ? shardHolders(grouping, *weight.shardDomain, weight.name)
                           : detail::derivedGrouping(replicas_, grouping.stride() * shards, holders);
    gradient = ops::replicatedAllReduce(gradient, ReductionType::Sum, over);
  }
  if (reduction_ == ReductionType::Mean) {
    gradient = ops::mul(
        gradient, ops::scalar(graph, 1.0 / static_cast<double>(grouping.groupSize()), gradient.dtype()));
  }
  if (gradient.id() == tensors_.gradients[k]) return;
  graph.rename(gradient.id(), graph.uniqueName(name + ".reduced"));
  tensors_.gradients[k] = gradient.id();
}

// The gradient of an unsharded weight accumulated in a sharded accumulator
// was reduce-scattered over the accumulator's domain micro-batch by
// micro-batch: all-reduce it over the replicas holding the same shard, scale
// a Mean, and gather the whole gradient for the update.
void ReplicationTransform::reduceScatteredGradient(Graph& graph, std::size_t k,
                                                   const ReplicaGrouping& grouping) {
  const TensorNode& accumulator = graph.tensor(graph.storageOf(tensors_.gradients[k]));
  const TensorNode& weight = graph.tensor(tensors_.weights[k]);
  if (!accumulator.shardDomain) {
    throw GraphError(ErrorCode::InvalidCollective, weight.name,
                     fmt::format("its gradient {} is sharded but has no sharding domain",
                                 graph.tensor(tensors_.gradients[k]).name));
  }
  const ReplicaGrouping domain = *accumulator.shardDomain;
  const ReplicaGrouping holders = shardHolders(grouping, domain, accumulator.name);
  const Shape shape = weight.shape;
  const std::string name = graph.tensor(tensors_.gradients[k]).name;
  Tensor gradient{&graph, tensors_.gradients[k]};
  if (holders.groupSize() > 1) gradient = ops::replicatedAllReduce(gradient, ReductionType::Sum, holders);
  if (reduction_ == ReductionType::Mean) {
    gradient = ops::mul(
        gradient, ops::scalar(graph, 1.0 / static_cast<double>(grouping.groupSize()), gradient.dtype()));
  }
  gradient = ops::replicatedAllGather(gradient, domain, shape);
  graph.rename(gradient.id(), graph.uniqueName(name + ".reduced"));
  tensors_.gradients[k] = gradient.id();
}

}  // namespace tessera
