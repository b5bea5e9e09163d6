// Collectives and streaming-memory transfers as steps.
//
// A collective is a layout change plus a reduction: each output group is
// computed from the input groups of its replicas' collective group, read in
// replica order so that results are deterministic. The tables are built at
// load time from the layouts; the kernels only follow them.
#pragma once

#include <cstdint>

#include "kernels.hpp"
#include "layouts.hpp"
#include "tessera/graph.hpp"
#include "tessera/replica_grouping.hpp"

namespace tessera::sim {

// Fills step.table/table2, groups and sizes and sets the kernel of a
// collective op (AllReduce, ReduceScatter, AllGather, ReplicaShardedSlice,
// ReplicaShardedPad). `out` and `in` are the layouts of the output and the
// input; their buffers are step.out and step.in[0].
void planCollective(Step& step, const OpNode& op, const ReplicaGrouping& out, const ReplicaGrouping& in,
                    int64_t inputElements, int64_t outputElements, const LocalTopology& topology);

// Remote buffers live in one array: buffer b, entry e, local replica r at
// base(b) + (e * replicas + r) * elements, so an entry of every replica is
// one contiguous block. `remote` points at buffer b's base.
void planRemoteLoad(Step& step, const ReplicaGrouping& out, int64_t entry, int64_t elements,
                    int64_t replicas);
void planRemoteStore(Step& step, const ReplicaGrouping& in, int64_t entry, int64_t elements,
                     int64_t replicas);

}  // namespace tessera::sim
