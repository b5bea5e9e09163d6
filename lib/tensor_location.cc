#include "tessera/lib/tensor_location.hpp"

#include <fmt/format.h>

#include "tessera/lib/error.hpp"
#include "tessera/lib/replica_grouping.hpp"

namespace tessera {
namespace {

bool hasSize(CommGroupType type) noexcept {
  return type == CommGroupType::Consecutive || type == CommGroupType::Orthogonal;
}

void checkSize(const CommGroup& group) {
  if (!hasSize(group.type) || group.replicaGroupSize >= 1) return;
  throw ConfigError(ErrorCode::InvalidCommGroup, group.str(),
                    fmt::format("a CommGroup of type {} needs replicaGroupSize >= 1, found {}; set it to the "
                                "number of replicas per group",
                                group.type, group.replicaGroupSize));
}

}  // namespace

ReplicaGrouping CommGroup::toReplicaGrouping(int64_t numReplicas) const {
  checkSize(*this);
  if (hasSize(type) && numReplicas >= 1 && numReplicas % replicaGroupSize != 0) {
    throw ConfigError(
        ErrorCode::ReplicaGroupingNotDivisible, str(),
        fmt::format("groups of {} replicas do not divide {} replicas; choose a replicaGroupSize "
                    "that divides the replication factor",
                    replicaGroupSize, numReplicas));
  }
  switch (type) {
    case CommGroupType::All: return ReplicaGrouping(numReplicas, 1, numReplicas);
    case CommGroupType::Consecutive: return ReplicaGrouping(numReplicas, 1, replicaGroupSize);
    case CommGroupType::Orthogonal:
      return ReplicaGrouping(numReplicas, numReplicas / replicaGroupSize, replicaGroupSize);
    case CommGroupType::None: return ReplicaGrouping(numReplicas, 1, 1);
  }
  throw InternalError(ErrorCode::Internal, str(), "unknown CommGroupType");
}

int64_t CommGroup::groupSize(int64_t numReplicas) const {
  checkSize(*this);
  switch (type) {
    case CommGroupType::All: return numReplicas;
    case CommGroupType::None: return 1;
    case CommGroupType::Consecutive:
    case CommGroupType::Orthogonal: return replicaGroupSize;
  }
  throw InternalError(ErrorCode::Internal, str(), "unknown CommGroupType");
}

CommGroup CommGroup::fromReplicaGrouping(const ReplicaGrouping& grouping) {
  const int64_t size = grouping.groupSize();
  if (size == 1) return {CommGroupType::None, 0};
  if (size == grouping.numReplicas()) return {CommGroupType::All, 0};
  if (grouping.stride() == grouping.numGroups()) return {CommGroupType::Orthogonal, size};
  if (grouping.stride() == 1) return {CommGroupType::Consecutive, size};
  throw ConfigError(ErrorCode::NotACommGroup, grouping.str(),
                    fmt::format("no CommGroup names this grouping: Consecutive needs stride 1 and Orthogonal "
                                "needs stride equal to the number of groups ({}), found stride {}",
                                grouping.numGroups(), grouping.stride()));
}

std::string CommGroup::str() const {
  return fmt::format("CommGroup(type={}, replicaGroupSize={})", type, replicaGroupSize);
}

std::string TensorLocation::str() const {
  std::string out = fmt::format("({}, loadTileSet={}, storageTileSet={}, RTS={}", storage, loadTileSet,
                                storageTileSet, replicatedTensorSharding);
  if (replicatedTensorSharding == ReplicatedTensorSharding::On) {
    out += ", shardingDomain=";
    out += shardingDomain.str();
  }
  out += ')';
  return out;
}

}  // namespace tessera
