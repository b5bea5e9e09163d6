// The reference evaluator: the executable specification of every op.
//
// It runs a Graph on all of its replicas (the graph's replication factor) in
// double precision with plain loops, one replica after another, exactly as
// the op semantics are defined; the simulated device is tested against it.
//  - Inputs are fed per replica; constants hold their data.
//  - A variable on replica r is initialised from group grouping.groupAt(r) of
//    its host data; a sharded variable (metaShape set) holds shard
//    (indexInGroup mod shardCount) of ShardLayout(n, shardCount) of that
//    group's data. Variables kept in a remote buffer also initialise
//    buffer[remoteEntry] of every replica. Variables persist across run()s.
//  - Every replica has its own copy of every remote buffer (zero at start).
//  - In-place ops write their first input's storage; every tensor aliasing
//    that storage sees the new value.
//  - Collectives combine the replicas of each group of their grouping;
//    sharded values use ShardLayout(n, groupSize): member i of a group holds
//    shard i.
//  - Ops run in Graph::schedule() order; each op's arithmetic is its
//    family's reference (OpDef::reference, lib/ops/).
//  - Float16 tensors follow the rounding model of half storage with wider
//    arithmetic: every value stored in one (an op's output, an initial
//    value, a fed input) is rounded to the nearest half (ties to even,
//    beyond the range to inf); the arithmetic between stores is double.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/lib/graph.hpp"

namespace tessera::test {

class ReferenceEvaluator {
 public:
  explicit ReferenceEvaluator(const Graph& graph);

  int64_t replicas() const noexcept { return replicas_; }
  // Sets an input's value on one replica (or on all of them).
  void feed(TensorId input, int64_t replica, std::vector<double> values);
  void feedAll(TensorId input, const std::vector<double>& values);
  // One execution of the whole program.
  void run();

  // A tensor's value on a replica after run() (for a variable: its current state).
  const std::vector<double>& value(TensorId t, int64_t replica) const;
  // The sum of a scalar tensor over all replicas (the global loss).
  double sumOverReplicas(TensorId t) const;
  // A variable's state on a replica, writable (e.g. to perturb it).
  std::vector<double>& state(TensorId variable, int64_t replica);
  const std::vector<double>& buffer(int64_t buffer, int64_t entry, int64_t replica) const;

 private:
  using Values = std::vector<double>;
  class Op;
  Values& slot(TensorId t, int64_t replica);
  void initialiseVariable(TensorId t);

  const Graph& graph_;
  int64_t replicas_;
  // [replica][storage tensor id]
  std::vector<std::vector<Values>> storage_;
  // [replica][buffer][entry]
  std::vector<std::vector<std::vector<Values>>> buffers_;
  // [replica][input id]
  std::vector<std::vector<Values>> feeds_;
  std::vector<char> fed_;
};

}  // namespace tessera::test
