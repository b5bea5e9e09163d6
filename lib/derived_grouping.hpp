// Groupings tessera derives itself for its collectives, such as the replicas
// that hold the same shard within a larger group ((64, 2, 4) for two shards
// in consecutive groups of eight), are strided without tiling the replicas.
// PopXL's rule (stride * groupSize = numReplicas when stride != 1) is for the
// groupings a user gives; these are made by a private constructor that skips it.
#pragma once

#include <cstdint>

#include "tessera/lib/replica_grouping.hpp"

namespace tessera::detail {

// ReplicaGrouping(numReplicas, stride, groupSize) without PopXL's rule (the
// other checks apply).
ReplicaGrouping derivedGrouping(int64_t numReplicas, int64_t stride, int64_t groupSize);

}  // namespace tessera::detail
