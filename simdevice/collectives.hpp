// Collectives and streaming-memory transfers as steps.
//
// A collective is a layout change plus a reduction: each output group is
// computed from the input groups of its replicas' collective group, read in
// replica order so that results are deterministic. The tables are built at
// load time from the layouts; the kernels only follow them.
//
// Across instances: when a collective's groups span instances (see
// crossesInstances), an exchange step first gathers every replica's input
// value from every instance through the communicator (Exchange), and the
// collective then reads the members of each group from that copy, in the
// same replica order as a single instance would: the results are bitwise
// those of one instance simulating every replica.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels.hpp"
#include "layouts.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/lib/replica_grouping.hpp"

namespace tessera::sim {

// One tensor's value on every replica of the run, gathered from every
// instance.
struct ExchangedTensor {
  TensorId tensor = kNoTensor;         // the tensor whose buffer `source` is
  const float* source = nullptr;       // one value per group of the tensor's layout
  std::vector<int64_t> sourceOffsets;  // per local replica, where its value starts in `source`
  int64_t elements = 0;                // per replica
  std::vector<float> values;           // [globalReplicas, elements], in replica order
};

// One message between the instances: this instance's replicas' values of
// every tensor, all-gathered, then spread into each tensor's `values`.
// Exchanges of several collectives can be merged into one message
// (mergeExchanges), so that a step waits for the other instances once
// rather than once per collective.
struct Exchange {
  Communicator* communicator = nullptr;
  int64_t replicaOffset = 0;  // global index of local replica 0
  int64_t localReplicas = 1;
  std::vector<ExchangedTensor> tensors;
  std::vector<float> send;     // this instance's values of every tensor
  std::vector<float> receive;  // every instance's `send`, in rank order
};

// True when a group of `grouping` that holds a replica of this instance also
// holds a replica of another instance.
bool crossesInstances(const ReplicaTopology& topology, const ReplicaGrouping& grouping);

// Plans the exchange of `tensor`, whose buffer `source` has layout `layout`
// and `elements` per replica, before `op`, and returns the step that runs
// it; `exchange` must outlive the plan.
Step planExchange(Exchange& exchange, Communicator* communicator, TensorId tensor, const float* source,
                  const ReplicaGrouping& layout, int64_t elements, const ReplicaTopology& topology,
                  const OpNode& op);

// Moves the tensors of `parts` (in order) into `merged` and returns the step
// that exchanges them all in one message. The tensors' `values` keep their
// memory, so the collectives planned on them stay valid.
Step mergeExchanges(Exchange& merged, std::span<Exchange* const> parts);

// True when every group of `grouping` that holds a replica of this instance
// is a run of consecutive global replicas.
bool consecutiveGroups(const ReplicaTopology& topology, const ReplicaGrouping& grouping);

// True when every group of `grouping` that holds a replica of this instance
// is a run of consecutive global replicas, and the local replicas of one
// group (and only those) share a group of the layout `reduced`: the case in
// which the executor computes a gradient product and its all-reduce as one
// GEMM per group over the concatenated batch.
bool consecutiveGroupsLayout(const ReplicaTopology& topology, const ReplicaGrouping& grouping,
                             const ReplicaGrouping& reduced);

// Fills step.table/table2, groups and sizes and sets the kernel of a
// collective op (AllReduce, ReduceScatter, AllGather, ReplicaShardedSlice,
// ReplicaShardedPad). `out` and `in` are the layouts of the output and the
// input; their buffers are step.out and step.in[0]. With `exchanged`, group
// members are read from every replica's values gathered from the other
// instances instead (step.in[0] becomes exchanged->values).
// The tables grow with the output groups plus the members of the collective
// groups, each listed once: for a reduce-scatter over R replicas, O(R)
// entries, not one member list per replica.
void planCollective(Step& step, const OpNode& op, const ReplicaGrouping& out, const ReplicaGrouping& in,
                    int64_t inputElements, int64_t outputElements, const ReplicaTopology& topology,
                    const ExchangedTensor* exchanged = nullptr);

// Remote buffers live in one array: buffer b, entry e, local replica r at
// base(b) + (e * replicas + r) * elements, so an entry of every replica is
// one contiguous block. `remote` points at buffer b's base.
void planRemoteLoad(Step& step, const ReplicaGrouping& out, const ReplicaGrouping& held, int64_t entry,
                    int64_t elements, int64_t replicas);
// A store writes the entry of the first replica of each group of `held`
// (what the buffer holds, see inferLayouts); loads read those.
void planRemoteStore(Step& step, const ReplicaGrouping& in, const ReplicaGrouping& held, int64_t entry,
                     int64_t elements, int64_t replicas);

}  // namespace tessera::sim
