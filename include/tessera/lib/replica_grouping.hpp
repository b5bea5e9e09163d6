// ReplicaGrouping: which replicas belong together. One type serves sharding
// domains, collective groups, variable groupings and replica layouts on the
// device. Replica r belongs to group groupAt(r); a group's members are `stride`
// apart; groups of `groupSize` replicas tile the `numReplicas` replicas.
//
//   ReplicaGrouping(8, 1, 2): groups [0,1] [2,3] [4,5] [6,7]
//   ReplicaGrouping(8, 2, 4): groups [0,2,4,6] [1,3,5,7]
//   ReplicaGrouping(8, 4, 2): groups [0,4] [1,5] [2,6] [3,7]
//
// As in PopXL, a stride other than 1 needs stride * groupSize = numReplicas:
// (8, 2, 2), groups [0,2] [1,3] [4,6] [5,7], is refused.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

class ReplicaGrouping;

namespace detail {
// The groupings tessera derives for its own collectives (lib/derived_grouping.hpp).
ReplicaGrouping derivedGrouping(int64_t numReplicas, int64_t stride, int64_t groupSize);
}  // namespace detail

class ReplicaGrouping {
 public:
  // All replicas in one group: (numReplicas, 1, numReplicas).
  explicit ReplicaGrouping(int64_t numReplicas);
  // Throws ConfigError: InvalidReplicaGrouping when a value is not
  // positive, ReplicaGroupingNotDivisible when numReplicas is not a multiple
  // of stride * groupSize, StridedGroupingNotTiling when stride != 1 and
  // stride * groupSize != numReplicas (PopXL's rule). A group size of 1
  // makes the stride 1 (and is never refused for its stride).
  ReplicaGrouping(int64_t numReplicas, int64_t stride, int64_t groupSize);

  int64_t numReplicas() const noexcept { return numReplicas_; }
  int64_t stride() const noexcept { return stride_; }
  int64_t groupSize() const noexcept { return groupSize_; }
  int64_t numGroups() const noexcept { return numReplicas_ / groupSize_; }

  // The group of replica r.
  int64_t groupAt(int64_t replica) const;
  // The i-th member of group g.
  int64_t replicaAt(int64_t group, int64_t indexInGroup = 0) const;
  // The position of replica r within its group.
  int64_t indexInGroupAt(int64_t replica) const;
  // The members of group g in increasing order.
  std::vector<int64_t> replicasAt(int64_t group) const;
  // groupAt(r) for every replica.
  std::vector<int64_t> assignment() const;

  // The grouping whose groups take one member from each group of this one
  // (so the two together address every replica exactly once). Throws
  // ConfigError(TransposeNotRepresentable) when that is not a
  // ReplicaGrouping.
  ReplicaGrouping transpose() const;

  // "ReplicaGrouping(numReplicas=4, stride=1, groupSize=2)"
  std::string str() const;
  bool operator==(const ReplicaGrouping&) const = default;

 private:
  // Whether PopXL's rule applies: to every grouping a user gives, not to
  // those tessera derives (detail::derivedGrouping).
  enum class Rule { PopXL, Derived };
  ReplicaGrouping(int64_t numReplicas, int64_t stride, int64_t groupSize, Rule rule);
  friend ReplicaGrouping detail::derivedGrouping(int64_t numReplicas, int64_t stride, int64_t groupSize);

  int64_t numReplicas_;
  int64_t stride_;
  int64_t groupSize_;
};

}  // namespace tessera
