// The launcher's environment: PopDist's queries, their cross-checks, what
// configureSessionOptions makes of them, and the exchange timeout.
#include "tessera/popdist/dist.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "tessera/lib/error.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

using Variables = std::map<std::string, std::string>;

dist::EnvLookup lookupIn(const Variables& variables) {
  return [variables](std::string_view name) -> std::optional<std::string> {
    const auto it = variables.find(std::string(name));
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

// What tessera launch exports for instance `rank` of `instances`, with
// Open MPI's own variables.
Variables launched(int64_t total, int64_t instances, int64_t rank) {
  const int64_t local = total / instances;
  return {{"POPDIST_NUM_TOTAL_REPLICAS", std::to_string(total)},
          {"POPDIST_NUM_LOCAL_REPLICAS", std::to_string(local)},
          {"POPDIST_REPLICA_INDEX_OFFSET", std::to_string(rank * local)},
          {"POPDIST_NUM_IPUS_PER_REPLICA", "1"},
          {"POPDIST_LOCAL_INSTANCE_INDEX", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", std::to_string(instances)},
          {"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank)}};
}

Variables with(Variables variables, const std::string& name, const std::string& value) {
  variables[name] = value;
  return variables;
}

Variables without(Variables variables, const std::string& name) {
  variables.erase(name);
  return variables;
}

}  // namespace

TEST_CASE("readDistEnv describes each instance of a launch") {
  struct Row {
    int64_t total, instances, rank;
    int64_t local, offset;
  };
  // The reference's PopDist relations: 8 replicas on 4 instances are 2 each,
  // at offsets 0, 2, 4, 6.
  const std::vector<Row> rows = {
      {8, 4, 0, 2, 0}, {8, 4, 1, 2, 2}, {8, 4, 2, 2, 4},   {8, 4, 3, 2, 6},
      {4, 2, 1, 2, 2}, {4, 4, 3, 1, 3}, {16, 1, 0, 16, 0}, {1, 1, 0, 1, 0},
  };
  for (const Row& row : rows) {
    CAPTURE(row.total);
    CAPTURE(row.instances);
    CAPTURE(row.rank);
    const dist::DistEnv env = dist::readDistEnv(lookupIn(launched(row.total, row.instances, row.rank)));
    CHECK(env.set);
    CHECK(env.numTotalReplicas == row.total);
    CHECK(env.numLocalReplicas == row.local);
    CHECK(env.replicaIndexOffset == row.offset);
    CHECK(env.numInstances == row.instances);
    CHECK(env.instanceIndex == row.rank);
    CHECK(env.localInstanceIndex == row.rank);
    CHECK(env.numIpusPerReplica == 1);
  }
}

TEST_CASE("readDistEnv without a launcher: PopDist's defaults, and Open MPI's rank as PopTorch reads it") {
  CHECK(dist::readDistEnv(lookupIn({})) == dist::DistEnv{});
  const dist::DistEnv mpirun =
      dist::readDistEnv(lookupIn({{"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_RANK", "2"}}));
  CHECK_FALSE(mpirun.set);
  CHECK(mpirun.numInstances == 3);
  CHECK(mpirun.instanceIndex == 2);
  CHECK(mpirun.numTotalReplicas == 1);
  CHECK(mpirun.numLocalReplicas == 1);
  // Only the local count given: the total defaults to 1 and must still fit.
  const dist::DistEnv localOnly = dist::readDistEnv(lookupIn({{"POPDIST_NUM_LOCAL_REPLICAS", "1"}}));
  CHECK(localOnly.set);
  CHECK(localOnly.numInstances == 1);
}

TEST_CASE("readDistEnv rejects malformed and inconsistent variables, naming the variable") {
  struct Row {
    Variables variables;
    std::string subject;
    std::string fragment;
  };
  const Variables base = launched(4, 2, 1);
  const std::vector<Row> rows = {
      {with(base, "POPDIST_NUM_LOCAL_REPLICAS", "two"), "POPDIST_NUM_LOCAL_REPLICAS",
       "\"two\" is not a whole number"},
      {with(base, "POPDIST_NUM_TOTAL_REPLICAS", "4x"), "POPDIST_NUM_TOTAL_REPLICAS",
       "\"4x\" is not a whole number"},
      {with(base, "POPDIST_NUM_TOTAL_REPLICAS", ""), "POPDIST_NUM_TOTAL_REPLICAS", "is not a whole number"},
      {with(base, "POPDIST_NUM_TOTAL_REPLICAS", "0"), "POPDIST_NUM_TOTAL_REPLICAS",
       "0 is below the minimum 1"},
      {with(base, "POPDIST_REPLICA_INDEX_OFFSET", "-2"), "POPDIST_REPLICA_INDEX_OFFSET",
       "-2 is below the minimum 0"},
      {with(base, "POPDIST_NUM_TOTAL_REPLICAS", "5"), "POPDIST_NUM_TOTAL_REPLICAS",
       "5 total replicas are not a multiple of POPDIST_NUM_LOCAL_REPLICAS=2"},
      {with(base, "POPDIST_REPLICA_INDEX_OFFSET", "1"), "POPDIST_REPLICA_INDEX_OFFSET",
       "offset 1 is not the first replica of an instance"},
      {with(base, "POPDIST_REPLICA_INDEX_OFFSET", "4"), "POPDIST_REPLICA_INDEX_OFFSET",
       "with 4 replicas, 2 per instance, the offsets are 0, 2 (instance index x local replicas)"},
      // total != local x instances
      {with(base, "OMPI_COMM_WORLD_SIZE", "3"), "OMPI_COMM_WORLD_SIZE",
       "mpirun started 3 instance(s) but POPDIST_NUM_TOTAL_REPLICAS=4 / POPDIST_NUM_LOCAL_REPLICAS=2 make 2"},
      // offset != rank x local
      {with(base, "POPDIST_REPLICA_INDEX_OFFSET", "0"), "POPDIST_REPLICA_INDEX_OFFSET",
       "offset 0 belongs to instance 0, but this is instance 1 (OMPI_COMM_WORLD_RANK), whose replicas start "
       "at "
       "1 x 2 = 2"},
      {with(base, "POPDIST_LOCAL_INSTANCE_INDEX", "0"), "POPDIST_LOCAL_INSTANCE_INDEX",
       "0 differs from OMPI_COMM_WORLD_LOCAL_RANK=1"},
      {with(without(base, "OMPI_COMM_WORLD_LOCAL_RANK"), "POPDIST_LOCAL_INSTANCE_INDEX", "2"),
       "POPDIST_LOCAL_INSTANCE_INDEX", "2 is not below the number of instances 2"},
      {{{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "2"}},
       "OMPI_COMM_WORLD_RANK",
       "rank 2 is not below the world size 2"},
  };
  for (const Row& row : rows) {
    CAPTURE(row.fragment);
    const auto error = test::catchError<DistError>([&] { dist::readDistEnv(lookupIn(row.variables)); });
    REQUIRE(error.has_value());
    INFO(error->what());
    CHECK(error->code() == ErrorCode::InconsistentDistEnv);
    CHECK(error->subject() == row.subject);
    CHECK(error->detail().find(row.fragment) != std::string::npos);
  }
}

TEST_CASE("configureSessionOptions fills the distributed fields as PopDist does") {
  SessionOptions options;
  options.replicatedGraphCount = 8;  // overridden, as PopRun overrides the application
  options.enableReplicatedGraphs = true;
  options.accumulationFactor = 3;  // left alone
  options.enableGradientAccumulation = true;
  dist::configureSessionOptions(options, dist::readDistEnv(lookupIn(launched(8, 4, 3))));
  CHECK(options.enableReplicatedGraphs);
  CHECK(options.replicatedGraphCount == 2);
  CHECK(options.enableDistributedReplicatedGraphs);
  CHECK(options.globalReplicationFactor == 8);
  CHECK(options.globalReplicaOffset == 6);
  CHECK(options.accumulationFactor == 3);
  CHECK(options.getGlobalReplicationFactor() == 8);
  CHECK(options.getLocalReplicationFactor() == 2);
  validate(options);

  SUBCASE("one replica per instance leaves local replication off") {
    SessionOptions one;
    dist::configureSessionOptions(one, dist::readDistEnv(lookupIn(launched(4, 4, 1))));
    CHECK_FALSE(one.enableReplicatedGraphs);
    CHECK(one.replicatedGraphCount == 1);
    CHECK(one.globalReplicaOffset == 1);
    validate(one);
  }
  SUBCASE("without a launcher nothing changes") {
    SessionOptions untouched = options;
    dist::configureSessionOptions(untouched, dist::DistEnv{});
    CHECK(untouched == options);
  }
}

TEST_CASE("the exchange timeout comes from TESSERA_DIST_TIMEOUT in seconds") {
  using std::chrono::milliseconds;
  CHECK(dist::exchangeTimeout(lookupIn({})) == milliseconds(60000));
  CHECK(dist::exchangeTimeout(lookupIn({{"TESSERA_DIST_TIMEOUT", "5"}})) == milliseconds(5000));
  CHECK(dist::exchangeTimeout(lookupIn({{"TESSERA_DIST_TIMEOUT", "0.25"}})) == milliseconds(250));
  for (const char* bad : {"0", "-1", "soon", "", "1e9", "nan"}) {
    CAPTURE(bad);
    const auto error = test::catchError<DistError>([&] {
      dist::exchangeTimeout(lookupIn({{"TESSERA_DIST_TIMEOUT", bad}}));
    });
    REQUIRE(error.has_value());
    CHECK(error->code() == ErrorCode::InconsistentDistEnv);
    CHECK(error->subject() == "TESSERA_DIST_TIMEOUT");
  }
}

TEST_CASE("the version instances compare is MAJOR.MINOR.PATCH") {
  const std::string version(dist::tesseraVersion());
  CHECK(std::count(version.begin(), version.end(), '.') == 2);
  CHECK(version.find_first_not_of("0123456789.") == std::string::npos);
}
