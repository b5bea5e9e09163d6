#include "tessera/lib/replica_grouping.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "derived_grouping.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/tensor_location.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

using Ints = std::vector<int64_t>;

struct GroupingRow {
  int64_t replicas, stride, groupSize;
  Ints assignment;
  std::vector<Ints> groups;
  Ints indexInGroup;  // empty: not listed in the reference table
};

}  // namespace

TEST_CASE("replica to group: every row of the reference table") {
  const std::vector<GroupingRow> rows = {
      {8, 1, 8, {0, 0, 0, 0, 0, 0, 0, 0}, {{0, 1, 2, 3, 4, 5, 6, 7}}, {0, 1, 2, 3, 4, 5, 6, 7}},
      {8, 1, 1, {0, 1, 2, 3, 4, 5, 6, 7}, {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}, {0, 0, 0, 0, 0, 0, 0, 0}},
      {8, 1, 2, {0, 0, 1, 1, 2, 2, 3, 3}, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}, {0, 1, 0, 1, 0, 1, 0, 1}},
      {8, 4, 2, {0, 1, 2, 3, 0, 1, 2, 3}, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}, {0, 0, 0, 0, 1, 1, 1, 1}},
      {8, 1, 4, {0, 0, 0, 0, 1, 1, 1, 1}, {{0, 1, 2, 3}, {4, 5, 6, 7}}, {0, 1, 2, 3, 0, 1, 2, 3}},
      {8, 2, 4, {0, 1, 0, 1, 0, 1, 0, 1}, {{0, 2, 4, 6}, {1, 3, 5, 7}}, {0, 0, 1, 1, 2, 2, 3, 3}},
      {16,
       1,
       4,
       {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
       {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}},
       {}},
      {16,
       4,
       4,
       {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3},
       {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}},
       {}},
  };
  for (const GroupingRow& row : rows) {
    const ReplicaGrouping grouping(row.replicas, row.stride, row.groupSize);
    CAPTURE(grouping.str());
    CHECK(grouping.assignment() == row.assignment);
    REQUIRE(grouping.numGroups() == static_cast<int64_t>(row.groups.size()));
    for (int64_t g = 0; g < grouping.numGroups(); ++g) {
      CHECK(grouping.replicasAt(g) == row.groups[static_cast<std::size_t>(g)]);
    }
    for (int64_t r = 0; r < row.replicas && !row.indexInGroup.empty(); ++r) {
      CHECK(grouping.indexInGroupAt(r) == row.indexInGroup[static_cast<std::size_t>(r)]);
    }
  }
}

TEST_CASE("a grouping of all replicas is (R, 1, R)") {
  const ReplicaGrouping all(6);
  CHECK(all == ReplicaGrouping(6, 1, 6));
  CHECK(all.numGroups() == 1);
  CHECK(all.str() == "ReplicaGrouping(numReplicas=6, stride=1, groupSize=6)");
}

TEST_CASE("a group size of one normalises the stride to one") {
  const ReplicaGrouping grouping(4, 2, 1);
  CHECK(grouping.stride() == 1);
  CHECK(grouping == ReplicaGrouping(4, 1, 1));
  CHECK(grouping.str() == "ReplicaGrouping(numReplicas=4, stride=1, groupSize=1)");
}

TEST_CASE("invalid groupings name the values and the grouping") {
  struct Row {
    int64_t replicas, stride, groupSize;
    ErrorCode code;
    std::string fragment;
  };
  const std::vector<Row> rows = {
      {4, 3, 1, ErrorCode::ReplicaGroupingNotDivisible,
       "numReplicas 4 is not a multiple of stride 3 * groupSize 1"},
      {4, 1, 3, ErrorCode::ReplicaGroupingNotDivisible,
       "numReplicas 4 is not a multiple of stride 1 * groupSize 3"},
      {12, 4, 2, ErrorCode::ReplicaGroupingNotDivisible, "stride 4 * groupSize 2"},
      {4, 4, 2, ErrorCode::ReplicaGroupingNotDivisible, "stride 4 * groupSize 2"},
      {4, 8, 1, ErrorCode::ReplicaGroupingNotDivisible, "stride 8 * groupSize 1"},
      {INT64_MAX, INT64_MAX, 2, ErrorCode::ReplicaGroupingNotDivisible, "groupSize 2"},
      // PopXL's rule: a stride other than 1 needs groups that tile the replicas.
      {8, 2, 2, ErrorCode::StridedGroupingNotTiling,
       "with stride 2 != 1, stride * groupSize must equal numReplicas 8 (PopXL's rule) but is 4; use "
       "groupSize 4 "
       "or stride 1"},
      {12, 3, 2, ErrorCode::StridedGroupingNotTiling, "but is 6; use groupSize 4 or stride 1"},
      {16, 2, 4, ErrorCode::StridedGroupingNotTiling, "but is 8; use groupSize 8 or stride 1"},
      {0, 1, 1, ErrorCode::InvalidReplicaGrouping, "numReplicas is 0; it must be a positive integer"},
      {1, 0, 1, ErrorCode::InvalidReplicaGrouping, "stride is 0; it must be a positive integer"},
      {1, 1, 0, ErrorCode::InvalidReplicaGrouping, "groupSize is 0; it must be a positive integer"},
      {-4, 1, 1, ErrorCode::InvalidReplicaGrouping, "numReplicas is -4"},
      {4, -1, 2, ErrorCode::InvalidReplicaGrouping, "stride is -1"},
      {4, 1, -2, ErrorCode::InvalidReplicaGrouping, "groupSize is -2"},
  };
  for (const Row& row : rows) {
    const std::string subject = fmt::format("ReplicaGrouping(numReplicas={}, stride={}, groupSize={})",
                                            row.replicas, row.stride, row.groupSize);
    CAPTURE(subject);
    const auto error =
        test::catchError<ConfigError>([&] { ReplicaGrouping(row.replicas, row.stride, row.groupSize); });
    REQUIRE(error.has_value());
    CHECK(error->code() == row.code);
    CHECK(error->subject() == subject);
    CHECK(error->detail().find(row.fragment) != std::string::npos);
  }
}

TEST_CASE("indices outside the grouping are rejected with the grouping as subject") {
  const ReplicaGrouping grouping(8, 4, 2);
  const std::string subject = "ReplicaGrouping(numReplicas=8, stride=4, groupSize=2)";
  struct Row {
    const char* call;
    ErrorCode code;
    std::function<void()> fn;
  };
  const std::vector<Row> rows = {
      {"groupAt(-1)", ErrorCode::ReplicaIndexOutOfRange, [&] { (void)grouping.groupAt(-1); }},
      {"groupAt(8)", ErrorCode::ReplicaIndexOutOfRange, [&] { (void)grouping.groupAt(8); }},
      {"indexInGroupAt(8)", ErrorCode::ReplicaIndexOutOfRange, [&] { (void)grouping.indexInGroupAt(8); }},
      {"replicaAt(4)", ErrorCode::GroupIndexOutOfRange, [&] { (void)grouping.replicaAt(4); }},
      {"replicaAt(-1)", ErrorCode::GroupIndexOutOfRange, [&] { (void)grouping.replicaAt(-1); }},
      {"replicaAt(0, 2)", ErrorCode::ReplicaIndexOutOfRange, [&] { (void)grouping.replicaAt(0, 2); }},
      {"replicaAt(0, -1)", ErrorCode::ReplicaIndexOutOfRange, [&] { (void)grouping.replicaAt(0, -1); }},
      {"replicasAt(4)", ErrorCode::GroupIndexOutOfRange, [&] { (void)grouping.replicasAt(4); }},
  };
  for (const Row& row : rows) {
    CAPTURE(row.call);
    const auto error = test::catchError<ConfigError>(row.fn);
    REQUIRE(error.has_value());
    CHECK(error->code() == row.code);
    CHECK(error->subject() == subject);
  }
  const auto error = test::catchError<ConfigError>([&] { (void)grouping.groupAt(8); });
  REQUIRE(error.has_value());
  CHECK(error->detail() == "replica 8 is out of range; replicas are 0..7");
}

TEST_CASE("transposes of the reference table") {
  struct Row {
    ReplicaGrouping from, to;
  };
  const std::vector<Row> rows = {
      {{16, 1, 1}, {16, 1, 16}}, {{16, 1, 16}, {16, 1, 1}}, {{16, 16, 1}, {16, 1, 16}},
      {{16, 1, 4}, {16, 4, 4}},  {{16, 4, 4}, {16, 1, 4}},  {{16, 2, 8}, {16, 1, 2}},
      {{16, 1, 2}, {16, 2, 8}},  {{16, 8, 2}, {16, 1, 8}},  {{16, 1, 8}, {16, 8, 2}},
  };
  for (const Row& row : rows) {
    CAPTURE(row.from.str());
    CHECK(row.from.transpose() == row.to);
  }
}

TEST_CASE("a grouping whose transpose would not be a ReplicaGrouping cannot be made") {
  // (12, 3, 2): groups [0,3] [1,4] [2,5] [6,9] ...; PopXL refuses it, and so its
  // transpose never has to be represented.
  const auto error = test::catchError<ConfigError>([] { (void)ReplicaGrouping(12, 3, 2); });
  REQUIRE(error.has_value());
  CHECK(error->code() == ErrorCode::StridedGroupingNotTiling);
  CHECK(error->subject() == "ReplicaGrouping(numReplicas=12, stride=3, groupSize=2)");
}

TEST_CASE("CommGroup and ReplicaGrouping convert both ways at 4 replicas") {
  struct Row {
    CommGroup group;
    ReplicaGrouping grouping;
  };
  const std::vector<Row> rows = {
      {{CommGroupType::All, 0}, {4, 1, 4}},
      {{CommGroupType::Consecutive, 2}, {4, 1, 2}},
      {{CommGroupType::Orthogonal, 2}, {4, 2, 2}},
      {{CommGroupType::None, 0}, {4, 1, 1}},
  };
  for (const Row& row : rows) {
    CAPTURE(row.group.str());
    CHECK(row.group.toReplicaGrouping(4) == row.grouping);
    CHECK(CommGroup::fromReplicaGrouping(row.grouping) == row.group);
  }
  CHECK(CommGroup(CommGroupType::All, 0).groupSize(4) == 4);
  CHECK(CommGroup(CommGroupType::None, 0).groupSize(4) == 1);
  CHECK(CommGroup(CommGroupType::Consecutive, 2).groupSize(4) == 2);
  CHECK(CommGroup(CommGroupType::Orthogonal, 2).groupSize(4) == 2);
  // Orthogonal groups of size k among R replicas are R/k apart.
  CHECK(CommGroup(CommGroupType::Orthogonal, 4).toReplicaGrouping(16) == ReplicaGrouping(16, 4, 4));
  CHECK(CommGroup(CommGroupType::Orthogonal, 2).toReplicaGrouping(8).assignment() ==
        std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3});
}

TEST_CASE("a grouping without a CommGroup equivalent cannot be made") {
  const auto error = test::catchError<ConfigError>([] { (void)CommGroup::fromReplicaGrouping({8, 2, 2}); });
  REQUIRE(error.has_value());
  CHECK(error->code() == ErrorCode::StridedGroupingNotTiling);
  CHECK(error->subject() == "ReplicaGrouping(numReplicas=8, stride=2, groupSize=2)");
}

TEST_CASE("CommGroups that do not fit the replication factor are rejected") {
  struct Row {
    CommGroup group;
    int64_t replicas;
    ErrorCode code;
  };
  const std::vector<Row> rows = {
      {{CommGroupType::Consecutive, 0}, 4, ErrorCode::InvalidCommGroup},
      {{CommGroupType::Orthogonal, -2}, 4, ErrorCode::InvalidCommGroup},
      {{CommGroupType::Consecutive, 3}, 4, ErrorCode::ReplicaGroupingNotDivisible},
      {{CommGroupType::Orthogonal, 8}, 4, ErrorCode::ReplicaGroupingNotDivisible},
      {{CommGroupType::Orthogonal, 4}, 6, ErrorCode::ReplicaGroupingNotDivisible},
  };
  for (const Row& row : rows) {
    CAPTURE(row.group.str());
    const auto error =
        test::catchError<ConfigError>([&] { (void)row.group.toReplicaGrouping(row.replicas); });
    REQUIRE(error.has_value());
    CHECK(error->code() == row.code);
    CHECK(error->subject() == row.group.str());
  }
  const auto error =
      test::catchError<ConfigError>([] { (void)CommGroup(CommGroupType::Consecutive, 0).groupSize(4); });
  REQUIRE(error.has_value());
  CHECK(error->code() == ErrorCode::InvalidCommGroup);
}

TEST_CASE("property: every valid grouping of up to 64 replicas") {
  int64_t checked = 0;
  int64_t transposed = 0;
  int64_t refused = 0;
  for (int64_t replicas = 1; replicas <= 64; ++replicas) {
    for (int64_t stride = 1; stride <= replicas; ++stride) {
      for (int64_t groupSize = 1; groupSize <= replicas; ++groupSize) {
        if (replicas % (stride * groupSize) != 0) continue;
        if (stride != 1 && groupSize != 1 && stride * groupSize != replicas) {
          const auto error =
              test::catchError<ConfigError>([&] { (void)ReplicaGrouping(replicas, stride, groupSize); });
          REQUIRE(error.has_value());
          REQUIRE(error->code() == ErrorCode::StridedGroupingNotTiling);
          ++refused;
          continue;
        }
        const ReplicaGrouping grouping(replicas, stride, groupSize);
        CAPTURE(grouping.str());
        ++checked;

        // The groups partition the replicas, and every accessor agrees.
        const std::vector<int64_t> assignment = grouping.assignment();
        std::vector<int> seen(static_cast<std::size_t>(replicas), 0);
        for (int64_t g = 0; g < grouping.numGroups(); ++g) {
          const std::vector<int64_t> members = grouping.replicasAt(g);
          REQUIRE(static_cast<int64_t>(members.size()) == grouping.groupSize());
          REQUIRE(std::is_sorted(members.begin(), members.end()));
          for (int64_t i = 0; i < grouping.groupSize(); ++i) {
            const int64_t r = grouping.replicaAt(g, i);
            REQUIRE(r == members[static_cast<std::size_t>(i)]);
            REQUIRE(grouping.groupAt(r) == g);
            REQUIRE(grouping.indexInGroupAt(r) == i);
            REQUIRE(assignment[static_cast<std::size_t>(r)] == g);
            ++seen[static_cast<std::size_t>(r)];
          }
        }
        REQUIRE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));

        const auto transpose = test::catchError<ConfigError>([&] { (void)grouping.transpose(); });
        const bool representable =
            grouping.stride() == 1 || grouping.stride() * grouping.groupSize() == replicas;
        REQUIRE(transpose.has_value() == !representable);
        if (!representable) {
          CHECK(transpose->code() == ErrorCode::TransposeNotRepresentable);
          continue;
        }
        ++transposed;
        const ReplicaGrouping t = grouping.transpose();
        REQUIRE(t.numGroups() == grouping.groupSize());
        REQUIRE(t.transpose() == grouping);
        for (int64_t g = 0; g < grouping.numGroups(); ++g) {
          for (int64_t tg = 0; tg < t.numGroups(); ++tg) {
            const std::vector<int64_t> a = grouping.replicasAt(g);
            const std::vector<int64_t> b = t.replicasAt(tg);
            std::vector<int64_t> common;
            std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
            REQUIRE(common.size() == 1);
          }
        }
      }
    }
  }
  // Guards against a loop that silently checks nothing.
  CHECK(checked == 649);
  CHECK(refused == 147);
  // What PopXL allows always has a transpose.
  CHECK(transposed == checked);
}

TEST_CASE("groupings tessera derives for its collectives skip PopXL's rule, and only those") {
  // The holders of one shard within consecutive groups of 8 replicas, two shards each.
  const ReplicaGrouping holders = detail::derivedGrouping(64, 2, 4);
  CHECK(holders.replicasAt(0) == std::vector<int64_t>{0, 2, 4, 6});
  CHECK(holders.replicasAt(1) == std::vector<int64_t>{1, 3, 5, 7});
  CHECK(holders.replicasAt(2) == std::vector<int64_t>{8, 10, 12, 14});
  // The other checks still apply, and the rule is back for the next grouping.
  const auto notDivisible = test::catchError<ConfigError>([] { (void)detail::derivedGrouping(12, 5, 2); });
  REQUIRE(notDivisible.has_value());
  CHECK(notDivisible->code() == ErrorCode::ReplicaGroupingNotDivisible);
  for (int i = 0; i < 2; ++i) {
    const auto refused = test::catchError<ConfigError>([] { (void)ReplicaGrouping(64, 2, 4); });
    REQUIRE(refused.has_value());
    CHECK(refused->code() == ErrorCode::StridedGroupingNotTiling);
    (void)detail::derivedGrouping(8, 2, 2);
  }
}
