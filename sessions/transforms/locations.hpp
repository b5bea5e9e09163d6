// The tensor location transforms: where every tensor lives, decided by
// resolveTensorLocation (include/tessera/lib/location_resolver.hpp) from the
// session options, applied to a plain graph.
//
// WeightShardingTransform runs before autodiff. A Weight variable whose
// location has replicated tensor sharding On over a domain of k > 1 replicas
// becomes a replica-sharded variable of the same name: each replica holds
// its shard of ShardLayout(n, k) (shard index = its index in the domain's
// group), and the full weight is all-gathered over the domain where it is
// used. Autodiff turns that gather into a reduce-scatter of the gradient,
// the replication transform all-reduces the shards over the replicas that
// hold the same shard, and optimizers create their state sharded like the
// weight, so the update runs on shards.
//
// LocationTransform runs last (after the optimizer update, or alone for
// inference) and rebuilds the graph:
//  - optimizer state and accumulators take their own RTS setting: a state
//    sharded unlike its weight is stored as its shard, and the elementwise
//    update ops that modify it run on shards (full operands are sliced with
//    ReplicaShardedSlice); a value needed whole is all-gathered;
//  - OffChip variables live in a remote buffer (streaming memory) of their
//    own: loaded before their first use in the step, stored after their
//    last in-place update, on chip only in between; with phased execution
//    (execution_phases.hpp) loaded again in each phase that reads them and
//    for the update after the phases, each load scheduled by its category's
//    IO schedule;
//  - OffChip activations (training) are stored right after the forward op
//    that produces them and loaded again for the backward ops that read
//    them; with phased execution (training or inference) also those read
//    by a forward op of a later phase (a skip connection), loaded again in
//    each such phase, so the phases in between do not hold them;
//  - a load or store through IO tiles (loadTileSet IO) is staged on the IO
//    tiles and copied to or from the compute tiles; an on-chip variable with
//    storageTileSet IO is kept on the IO tiles and copied to the compute
//    tiles around its use;
//  - a weight all-gathered from its shards in the forward pass is gathered
//    again for the backward pass, so the full weight is live only around its
//    uses.
// Variable names never change, so the host reads and writes (and
// checkpoints) the same logical tensors whatever the locations.
#pragma once

#include <optional>
#include <string>

#include "tessera/lib/ops.hpp"
#include "tessera/lib/session_options.hpp"
#include "tessera/sessions/transform.hpp"

namespace tessera {

class WeightShardingTransform final : public Transform {
 public:
  // `tensors` (nullable) has its ids remapped to the rebuilt graph.
  WeightShardingTransform(const SessionOptions& options, TrainingTensors* tensors);
  std::string_view name() const noexcept override { return "weightSharding"; }
  // Throws ConfigError(UnsupportedCombination) at the deciding setting when a
  // domain's groups do not fit within the variable's groups.
  void apply(Graph& graph) override;

 private:
  const SessionOptions& options_;
  TrainingTensors* tensors_;
};

class LocationTransform final : public Transform {
 public:
  // `tensors` (nullable): the loss says which ops form the forward pass (the
  // ops it depends on); without it no activation is moved off chip. Its ids
  // are remapped to the rebuilt graph.
  LocationTransform(const SessionOptions& options, TrainingTensors* tensors);
  std::string_view name() const noexcept override { return "locations"; }
  // Throws ConfigError(UnsupportedCombination) naming the tensor and the
  // deciding setting for a location that cannot be realised (a sharding
  // domain that does not fit the variable's groups), GraphError naming the
  // op when a value of unknown sharding would have to be converted.
  void apply(Graph& graph) override;

 private:
  const SessionOptions& options_;
  TrainingTensors* tensors_;
};

// For the accumulator `name` of `weight` (a weight variable as built, maybe
// sharded): the domain to shard it over when its location asks for RTS and
// the weight is not sharded, else nullopt (the accumulator is then made like
// its weight). Such an accumulator holds reduce-scattered gradients: each
// micro-batch's gradient is summed over the domain as it is accumulated, as
// a per-replica value cannot be split between replicas. Throws
// ConfigError(UnsupportedCombination) when the weight is sharded over
// another domain than the one the accumulator asks for.
std::optional<ReplicaGrouping> accumulatorShardingDomain(const SessionOptions& options, const TensorNode& weight,
                                                         const std::string& name);

// A zero-initialised Accumulator `name` like `weight`, sharded over `domain`.
Tensor shardedZeroVariable(Tensor weight, std::string name, const ReplicaGrouping& domain);

// The grouping whose groups are the replicas that hold the same shard of a
// variable sharded over `domain` within the groups of `variableGroups`
// (the replicas a sharded gradient is still all-reduced over). Throws
// GraphError(InvalidCollective) naming `tensor` when that is not a
// ReplicaGrouping.
ReplicaGrouping shardHolders(const ReplicaGrouping& variableGroups, const ReplicaGrouping& domain,
                             std::string_view tensor);

}  // namespace tessera
