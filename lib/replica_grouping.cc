#include "tessera/lib/replica_grouping.hpp"

#include <fmt/format.h>

#include "derived_grouping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera {
namespace {

std::string groupingStr(int64_t numReplicas, int64_t stride, int64_t groupSize) {
  return fmt::format("ReplicaGrouping(numReplicas={}, stride={}, groupSize={})", numReplicas, stride,
                     groupSize);
}

// The subject is only formatted on the error path: groupings are made by
// the thousand when a large program is loaded.
void checkPositive(int64_t value, std::string_view what, int64_t numReplicas, int64_t stride, int64_t groupSize) {
  if (value > 0) return;
  throw ConfigError(ErrorCode::InvalidReplicaGrouping, groupingStr(numReplicas, stride, groupSize),
                    fmt::format("{} is {}; it must be a positive integer", what, value));
}

}  // namespace

namespace detail {

ReplicaGrouping derivedGrouping(int64_t numReplicas, int64_t stride, int64_t groupSize) {
  return ReplicaGrouping(numReplicas, stride, groupSize, ReplicaGrouping::Rule::Derived);
}

}  // namespace detail

ReplicaGrouping::ReplicaGrouping(int64_t numReplicas) : ReplicaGrouping(numReplicas, 1, numReplicas) {}

ReplicaGrouping::ReplicaGrouping(int64_t numReplicas, int64_t stride, int64_t groupSize)
    : ReplicaGrouping(numReplicas, stride, groupSize, Rule::PopXL) {}

ReplicaGrouping::ReplicaGrouping(int64_t numReplicas, int64_t stride, int64_t groupSize, Rule rule)
    : numReplicas_(numReplicas), stride_(stride), groupSize_(groupSize) {
  // Errors name the grouping as the caller wrote it, before the stride is
  // normalised, so that (4, 3, 1) is reported with its stride of 3.
  checkPositive(numReplicas, "numReplicas", numReplicas, stride, groupSize);
  checkPositive(stride, "stride", numReplicas, stride, groupSize);
  checkPositive(groupSize, "groupSize", numReplicas, stride, groupSize);
  // The first test keeps stride * groupSize from overflowing.
  if (stride > numReplicas / groupSize || numReplicas % (stride * groupSize) != 0) {
    throw ConfigError(ErrorCode::ReplicaGroupingNotDivisible, groupingStr(numReplicas, stride, groupSize),
                      fmt::format("numReplicas {} is not a multiple of stride {} * groupSize {}; choose a "
                                  "stride and group size whose product divides {}",
                                  numReplicas, stride, groupSize, numReplicas));
  }
  // PopXL's rule: strided groups must tile the replicas exactly (a group of
  // one replica has no stride, see below).
  if (rule == Rule::PopXL && stride != 1 && groupSize != 1 &&
      stride * groupSize != numReplicas) {
    throw ConfigError(
        ErrorCode::StridedGroupingNotTiling, groupingStr(numReplicas, stride, groupSize),
        fmt::format("with stride {} != 1, stride * groupSize must equal numReplicas {} (PopXL's "
                    "rule) but is {}; use groupSize {} or stride 1",
                    stride, numReplicas, stride * groupSize, numReplicas / stride));
  }
  // A group of one replica has no stride; normalising makes equal groupings
  // compare equal.
  if (groupSize_ == 1) stride_ = 1;
}

int64_t ReplicaGrouping::groupAt(int64_t replica) const {
  if (replica < 0 || replica >= numReplicas_) {
    throw ConfigError(
        ErrorCode::ReplicaIndexOutOfRange, str(),
        fmt::format("replica {} is out of range; replicas are 0..{}", replica, numReplicas_ - 1));
  }
  return replica % stride_ + stride_ * (replica / (stride_ * groupSize_));
}

int64_t ReplicaGrouping::replicaAt(int64_t group, int64_t indexInGroup) const {
  if (group < 0 || group >= numGroups()) {
    throw ConfigError(ErrorCode::GroupIndexOutOfRange, str(),
                      fmt::format("group {} is out of range; groups are 0..{}", group, numGroups() - 1));
  }
  if (indexInGroup < 0 || indexInGroup >= groupSize_) {
    throw ConfigError(
        ErrorCode::ReplicaIndexOutOfRange, str(),
        fmt::format("index in group {} is out of range; indices are 0..{}", indexInGroup, groupSize_ - 1));
  }
  return (group / stride_) * stride_ * groupSize_ + group % stride_ + indexInGroup * stride_;
}

int64_t ReplicaGrouping::indexInGroupAt(int64_t replica) const {
  return (replica - replicaAt(groupAt(replica), 0)) / stride_;
}

std::vector<int64_t> ReplicaGrouping::replicasAt(int64_t group) const {
  const int64_t first = replicaAt(group, 0);
  std::vector<int64_t> replicas(static_cast<std::size_t>(groupSize_));
  for (int64_t i = 0; i < groupSize_; ++i) replicas[static_cast<std::size_t>(i)] = first + i * stride_;
  return replicas;
}

std::vector<int64_t> ReplicaGrouping::assignment() const {
  std::vector<int64_t> groups(static_cast<std::size_t>(numReplicas_));
  for (int64_t r = 0; r < numReplicas_; ++r) groups[static_cast<std::size_t>(r)] = groupAt(r);
  return groups;
}

ReplicaGrouping ReplicaGrouping::transpose() const {
  if (stride_ == 1) return ReplicaGrouping(numReplicas_, groupSize_, numGroups());
  if (stride_ * groupSize_ == numReplicas_) return ReplicaGrouping(numReplicas_, 1, stride_);
  throw ConfigError(
      ErrorCode::TransposeNotRepresentable, str(),
      fmt::format("the transpose is a ReplicaGrouping only when stride is 1 or stride * groupSize "
                  "equals numReplicas; found stride {} and stride * groupSize = {} of {} replicas",
                  stride_, stride_ * groupSize_, numReplicas_));
}

std::string ReplicaGrouping::str() const { return groupingStr(numReplicas_, stride_, groupSize_); }

}  // namespace tessera
