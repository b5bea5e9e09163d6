#include "tessera/lib/session_options.hpp"

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/lib/replica_topology.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

using Edit = std::function<void(SessionOptions&)>;

SessionOptions with(const Edit& edit) {
  SessionOptions options;
  edit(options);
  return options;
}

void replicate(SessionOptions& o, int64_t count) {
  o.enableReplicatedGraphs = true;
  o.replicatedGraphCount = count;
}

void distribute(SessionOptions& o, int64_t local, int64_t global, int64_t offset) {
  if (local > 1) replicate(o, local);
  o.enableDistributedReplicatedGraphs = true;
  o.globalReplicationFactor = global;
  o.globalReplicaOffset = offset;
}

void shard(TensorLocationSettings& settings, CommGroup domain = {}) {
  settings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
  settings.location.shardingDomain = domain;
}

const std::string kWeight = "/sessionOptions/weightTensorLocationSettings";
const std::string kOptimizerState = "/sessionOptions/optimizerStateTensorLocationSettings";
const std::string kAccumulator = "/sessionOptions/accumulatorTensorLocationSettings";
const std::string kActivation = "/sessionOptions/activationTensorLocationSettings";
const std::string kOverride = "/sessionOptions/tensorLocationSettingsOverride";

}  // namespace

TEST_CASE("replication getters") {
  struct Row {
    const char* name;
    Edit edit;
    int64_t local, global, offset;
  };
  const std::vector<Row> rows = {
      {"defaults", [](SessionOptions&) {}, 1, 1, 0},
      {"local replication", [](SessionOptions& o) { replicate(o, 4); }, 4, 4, 0},
      {"count without enable", [](SessionOptions& o) { o.replicatedGraphCount = 4; }, 1, 1, 0},
      {"distributed", [](SessionOptions& o) { distribute(o, 2, 8, 4); }, 2, 8, 4},
      {"distributed without local replication", [](SessionOptions& o) { distribute(o, 1, 4, 3); }, 1, 4, 3},
      {"global fields without distribution",
       [](SessionOptions& o) {
         replicate(o, 4);
         o.globalReplicationFactor = 8;
         o.globalReplicaOffset = 4;
       },
       4, 4, 0},
  };
  for (const Row& row : rows) {
    CAPTURE(row.name);
    const SessionOptions options = with(row.edit);
    CHECK(options.getLocalReplicationFactor() == row.local);
    CHECK(options.getGlobalReplicationFactor() == row.global);
    CHECK(options.getGlobalReplicaOffset() == row.offset);
    const ReplicaTopology topology = ReplicaTopology::fromOptions(options, 2);
    CHECK(topology == ReplicaTopology{row.global, row.local, row.offset, 2});
    CHECK(topology.instances() == row.global / row.local);
    CHECK(topology.instance() == row.offset / row.local);
    CHECK(topology.distributed() == (row.local != row.global));
    CHECK(topology.consistent() == (row.offset % row.local == 0));
  }
}

TEST_CASE("a replica topology keeps its invariants") {
  struct Row {
    ReplicaTopology topology;
    bool consistent;
  };
  const std::vector<Row> rows = {
      {{1, 1, 0, 1}, true},   {{8, 2, 6, 1}, true},  {{4, 4, 0, 2}, true},  {{2, 4, 0, 1}, false},
      {{4, 3, 0, 1}, false},  {{4, 0, 0, 1}, false}, {{4, 2, 1, 1}, false}, {{4, 2, 4, 1}, false},
      {{4, 2, -2, 1}, false}, {{4, 4, 0, 0}, false},
  };
  for (const Row& row : rows) {
    CAPTURE(row.topology.globalReplicas);
    CAPTURE(row.topology.localReplicas);
    CAPTURE(row.topology.replicaOffset);
    CHECK(row.topology.consistent() == row.consistent);
  }
}

TEST_CASE("a graph built for another replica count is refused once, naming the graph") {
  const Graph graph(4);
  CHECK_NOTHROW(checkReplicationFactor(graph, ReplicaTopology{4, 2, 2, 1}));
  const auto error = test::catchError<GraphError>([&] {
    checkReplicationFactor(graph, ReplicaTopology{2, 2, 0, 1});
  });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::ReplicationFactorMismatch);
  CHECK(error->subject() == "Graph");
  CHECK(error->detail() ==
        "the graph was built for 4 replica(s) but the session options give a global replication factor of 2; "
        "build the graph with Graph(2)");
}

TEST_CASE("the accumulation factor needs accumulation enabled") {
  struct Row {
    bool enabled;
    int64_t factor;
  };
  for (const Row row : {Row{false, 1}, Row{true, 1}, Row{true, 4}}) {
    SessionOptions options;
    options.enableGradientAccumulation = row.enabled;
    options.accumulationFactor = row.factor;
    CHECK(options.getAccumulationFactor() == row.factor);
  }
  SessionOptions options;
  options.accumulationFactor = 4;
  const auto error = test::catchError<ConfigError>([&] { (void)options.getAccumulationFactor(); });
  REQUIRE(error.has_value());
  CHECK(error->code() == ErrorCode::AccumulationDisabledButFactor);
  CHECK(error->subject() == "/sessionOptions/accumulationFactor");
  CHECK(error->detail() ==
        "accumulationFactor is 4 but enableGradientAccumulation is false; set "
        "/sessionOptions/enableGradientAccumulation to true or accumulationFactor to 1");
}

TEST_CASE("location settings by category") {
  struct Row {
    TensorCategory category;
    TensorLocationSettings SessionOptions::*member;
    std::string key;
  };
  const std::vector<Row> rows = {
      {TensorCategory::Activation, &SessionOptions::activationTensorLocationSettings,
       "activationTensorLocationSettings"},
      {TensorCategory::Weight, &SessionOptions::weightTensorLocationSettings, "weightTensorLocationSettings"},
      {TensorCategory::OptimizerState, &SessionOptions::optimizerStateTensorLocationSettings,
       "optimizerStateTensorLocationSettings"},
      {TensorCategory::Accumulator, &SessionOptions::accumulatorTensorLocationSettings,
       "accumulatorTensorLocationSettings"},
  };
  REQUIRE(rows.size() == EnumNames<TensorCategory>::kNames.size());
  SessionOptions options;
  const SessionOptions& constOptions = options;
  for (const Row& row : rows) {
    CAPTURE(row.key);
    CHECK(SessionOptions::locationSettingsKey(row.category) == row.key);
    CHECK(&options.locationSettings(row.category) == &(options.*row.member));
    CHECK(&constOptions.locationSettings(row.category) == &(options.*row.member));
    options.locationSettings(row.category).minElementsForOffChip = 77;
    CHECK((options.*row.member).minElementsForOffChip == 77);
  }
}

TEST_CASE("validate rejects each rule with its code and the path of the field") {
  struct Row {
    const char* name;
    Edit edit;
    ErrorCode code;
    std::string subject;
    std::string fragment;  // part of the message
  };
  const std::vector<Row> rows = {
      // Counts.
      {"no replicas", [](SessionOptions& o) { o.replicatedGraphCount = 0; }, ErrorCode::OutOfRange,
       "/sessionOptions/replicatedGraphCount", "replicatedGraphCount is 0; it must be >= 1"},
      {"no micro-batches", [](SessionOptions& o) { o.accumulationFactor = 0; }, ErrorCode::OutOfRange,
       "/sessionOptions/accumulationFactor", "accumulationFactor is 0; it must be >= 1"},
      {"negative IO tiles", [](SessionOptions& o) { o.numIOTiles = -2; }, ErrorCode::OutOfRange,
       "/sessionOptions/numIOTiles", "numIOTiles is -2"},
      // Switches.
      {"replicas without replication", [](SessionOptions& o) { o.replicatedGraphCount = 4; },
       ErrorCode::ReplicationDisabledButCount, "/sessionOptions/replicatedGraphCount",
       "4 replicas requested but enableReplicatedGraphs is false; set /sessionOptions/enableReplicatedGraphs "
       "to "
       "true or replicatedGraphCount to 1"},
      {"micro-batches without accumulation", [](SessionOptions& o) { o.accumulationFactor = 4; },
       ErrorCode::AccumulationDisabledButFactor, "/sessionOptions/accumulationFactor",
       "accumulationFactor is 4 but enableGradientAccumulation is false"},
      // Distribution.
      {"global factor 0", [](SessionOptions& o) { distribute(o, 1, 0, 0); },
       ErrorCode::GlobalReplicationFactorTooSmall, "/sessionOptions/globalReplicationFactor",
       "globalReplicationFactor is 0; it must be >= 1"},
      {"negative offset", [](SessionOptions& o) { distribute(o, 2, 4, -2); },
       ErrorCode::GlobalReplicaOffsetNegative, "/sessionOptions/globalReplicaOffset",
       "globalReplicaOffset is -2; it must be >= 0"},
      {"local above global", [](SessionOptions& o) { distribute(o, 4, 2, 0); },
       ErrorCode::LocalLargerThanGlobal, "/sessionOptions/replicatedGraphCount",
       "the local replication factor 4 is larger than globalReplicationFactor 2"},
      {"offset past the end", [](SessionOptions& o) { distribute(o, 2, 4, 4); },
       ErrorCode::GlobalReplicaOffsetTooLarge, "/sessionOptions/globalReplicaOffset",
       "globalReplicaOffset 4 + local replication factor 2 = 6 exceeds globalReplicationFactor 4"},
      // PopART accepts offset 3 of 4 (offset <= global); the last replica
      // would be global replica 4, which does not exist.
      {"offset leaving too few replicas", [](SessionOptions& o) { distribute(o, 2, 4, 3); },
       ErrorCode::GlobalReplicaOffsetTooLarge, "/sessionOptions/globalReplicaOffset",
       "stricter than PopART, which only requires offset <= global), so set globalReplicaOffset to at most "
       "2"},
      {"replication of one in a distributed run",
       [](SessionOptions& o) {
         distribute(o, 1, 4, 0);
         replicate(o, 1);
       },
       ErrorCode::LocalReplicationFactorOne, "/sessionOptions/replicatedGraphCount",
       "enableReplicatedGraphs is true but replicatedGraphCount is 1"},
      {"global not a multiple", [](SessionOptions& o) { distribute(o, 4, 6, 0); },
       ErrorCode::GlobalNotMultipleOfLocal, "/sessionOptions/globalReplicationFactor",
       "globalReplicationFactor 6 is not a multiple of the local replication factor 4"},
      {"offset misaligned", [](SessionOptions& o) { distribute(o, 2, 4, 1); },
       ErrorCode::GlobalReplicaOffsetMisaligned, "/sessionOptions/globalReplicaOffset",
       "globalReplicaOffset 1 is not a multiple of the local replication factor 2"},
      {"global factor without distribution", [](SessionOptions& o) { o.globalReplicationFactor = 4; },
       ErrorCode::DistributedSettingsWithoutDistribution, "/sessionOptions/globalReplicationFactor",
       "globalReplicationFactor is 4 but enableDistributedReplicatedGraphs is false, so it would be ignored"},
      {"offset without distribution", [](SessionOptions& o) { o.globalReplicaOffset = 2; },
       ErrorCode::DistributedSettingsWithoutDistribution, "/sessionOptions/globalReplicaOffset",
       "globalReplicaOffset is 2 but enableDistributedReplicatedGraphs is false"},
      // IO tiles.
      {"odd IO tiles", [](SessionOptions& o) { o.numIOTiles = 33; }, ErrorCode::InvalidIOTileCount,
       "/sessionOptions/numIOTiles", "numIOTiles is 33; it must be 0 or an even number >= 32"},
      {"too few IO tiles", [](SessionOptions& o) { o.numIOTiles = 30; }, ErrorCode::InvalidIOTileCount,
       "/sessionOptions/numIOTiles", "numIOTiles is 30"},
      {"IO load without IO tiles",
       [](SessionOptions& o) { o.weightTensorLocationSettings.location.loadTileSet = TileSet::IO; },
       ErrorCode::IOTileSetWithoutIOTiles, kWeight + "/location/loadTileSet",
       "loadTileSet is IO but numIOTiles is 0; set /sessionOptions/numIOTiles to an even number >= 32"},
      {"IO storage without IO tiles",
       [](SessionOptions& o) { o.accumulatorTensorLocationSettings.location.storageTileSet = TileSet::IO; },
       ErrorCode::IOTileSetWithoutIOTiles, kAccumulator + "/location/storageTileSet", "storageTileSet is IO"},
      {"IO override without IO tiles",
       [](SessionOptions& o) {
         o.tensorLocationSettingsOverride["W1"] =
             TensorLocation(TensorStorage::OffChip, TileSet::IO, TileSet::IO);
       },
       ErrorCode::IOTileSetWithoutIOTiles, kOverride + "/W1/loadTileSet", "loadTileSet is IO"},
      {"override names are escaped",
       [](SessionOptions& o) {
         o.tensorLocationSettingsOverride["layer/1~w"] =
             TensorLocation(TensorStorage::OffChip, TileSet::Compute, TileSet::IO);
       },
       ErrorCode::IOTileSetWithoutIOTiles, kOverride + "/layer~11~0w/storageTileSet", "storageTileSet is IO"},
      {"IO storage loaded by compute tiles",
       [](SessionOptions& o) {
         o.numIOTiles = 32;
         o.activationTensorLocationSettings.location.storageTileSet = TileSet::IO;
       },
       ErrorCode::StorageTileSetWithoutIOLoad, kActivation + "/location/storageTileSet",
       "storageTileSet is IO but loadTileSet is Compute"},
      {"override with IO storage loaded by compute tiles",
       [](SessionOptions& o) {
         o.numIOTiles = 64;
         o.tensorLocationSettingsOverride["b"] =
             TensorLocation(TensorStorage::OnChip, TileSet::Compute, TileSet::IO);
       },
       ErrorCode::StorageTileSetWithoutIOLoad, kOverride + "/b/storageTileSet", "storageTileSet is IO"},
      // Sharding domains.
      {"Consecutive domain without a size",
       [](SessionOptions& o) {
         o.weightTensorLocationSettings.location.shardingDomain = {CommGroupType::Consecutive, 0};
       },
       ErrorCode::InvalidCommGroup, kWeight + "/location/shardingDomain/replicaGroupSize",
       "a sharding domain of type Consecutive needs replicaGroupSize >= 1, found 0"},
      {"All domain with a size",
       [](SessionOptions& o) {
         o.accumulatorTensorLocationSettings.location.shardingDomain = {CommGroupType::All, 2};
       },
       ErrorCode::InvalidCommGroup, kAccumulator + "/location/shardingDomain/replicaGroupSize",
       "replicaGroupSize is 2 but a sharding domain of type All has no group size"},
      {"None domain with a size",
       [](SessionOptions& o) {
         o.activationTensorLocationSettings.location.shardingDomain = {CommGroupType::None, 1};
       },
       ErrorCode::InvalidCommGroup, kActivation + "/location/shardingDomain/replicaGroupSize",
       "replicaGroupSize is 1 but a sharding domain of type None"},
      {"override domain without a size",
       [](SessionOptions& o) {
         o.tensorLocationSettingsOverride["m"].shardingDomain = {CommGroupType::Orthogonal, -1};
       },
       ErrorCode::InvalidCommGroup, kOverride + "/m/shardingDomain/replicaGroupSize",
       "a sharding domain of type Orthogonal needs replicaGroupSize >= 1, found -1"},
      {"domain that does not divide the replicas",
       [](SessionOptions& o) {
         replicate(o, 4);
         o.optimizerStateTensorLocationSettings.location.shardingDomain = {CommGroupType::Consecutive, 3};
       },
       ErrorCode::ShardingDomainDoesNotDivide, kOptimizerState + "/location/shardingDomain/replicaGroupSize",
       "groups of 3 replicas do not divide the global replication factor 4"},
      // Checked even when sharding is off: linked tensors must agree.
      {"domain larger than the replicas, RTS off",
       [](SessionOptions& o) {
         o.weightTensorLocationSettings.location.shardingDomain = {CommGroupType::Orthogonal, 2};
       },
       ErrorCode::ShardingDomainDoesNotDivide, kWeight + "/location/shardingDomain/replicaGroupSize",
       "groups of 2 replicas do not divide the global replication factor 1"},
      {"domain checked against the global factor",
       [](SessionOptions& o) {
         distribute(o, 2, 4, 0);
         o.tensorLocationSettingsOverride["x"].shardingDomain = {CommGroupType::Consecutive, 8};
       },
       ErrorCode::ShardingDomainDoesNotDivide, kOverride + "/x/shardingDomain/replicaGroupSize",
       "global replication factor 4"},
      {"weight and optimizer state sharded differently",
       [](SessionOptions& o) {
         replicate(o, 4);
         shard(o.weightTensorLocationSettings);
         shard(o.optimizerStateTensorLocationSettings, {CommGroupType::Consecutive, 2});
       },
       ErrorCode::LinkedShardingDomainsDiffer, kOptimizerState + "/location/shardingDomain",
       "this sharding domain is CommGroup(type=Consecutive, replicaGroupSize=2) but "
       "/sessionOptions/weightTensorLocationSettings/location/shardingDomain is CommGroup(type=All, "
       "replicaGroupSize=0)"},
      {"accumulator sharded differently",
       [](SessionOptions& o) {
         replicate(o, 4);
         shard(o.optimizerStateTensorLocationSettings, {CommGroupType::Consecutive, 2});
         shard(o.accumulatorTensorLocationSettings, {CommGroupType::Orthogonal, 2});
       },
       ErrorCode::LinkedShardingDomainsDiffer, kAccumulator + "/location/shardingDomain",
       "/sessionOptions/optimizerStateTensorLocationSettings/location/shardingDomain is "
       "CommGroup(type=Consecutive, replicaGroupSize=2)"},
      // Thresholds.
      {"negative off-chip threshold",
       [](SessionOptions& o) { o.weightTensorLocationSettings.minElementsForOffChip = -1; },
       ErrorCode::NegativeThreshold, kWeight + "/minElementsForOffChip", "minElementsForOffChip is -1"},
      {"negative RTS threshold",
       [](SessionOptions& o) {
         o.accumulatorTensorLocationSettings.minElementsForReplicatedTensorSharding = -5;
       },
       ErrorCode::NegativeThreshold, kAccumulator + "/minElementsForReplicatedTensorSharding",
       "minElementsForReplicatedTensorSharding is -5"},
  };
  for (const Row& row : rows) {
    CAPTURE(row.name);
    const SessionOptions options = with(row.edit);
    const auto error = test::catchError<ConfigError>([&] { validate(options); });
    REQUIRE_MESSAGE(error.has_value(), "accepted");
    CAPTURE(error->what());
    CHECK(error->code() == row.code);
    CHECK(error->subject() == row.subject);
    CHECK(error->detail().find(row.fragment) != std::string::npos);
    // A device changes nothing for rules that do not involve it.
    const auto withDevice = test::catchError<ConfigError>([&] { validate(options, DeviceSpec{}); });
    REQUIRE(withDevice.has_value());
    CHECK(withDevice->code() == row.code);
  }
}

TEST_CASE("validate with a device checks the IO tiles against the tiles") {
  SessionOptions options;
  options.numIOTiles = 64;
  DeviceSpec device;
  device.tilesPerIpu = 64;
  const auto error = test::catchError<ConfigError>([&] { validate(options, device); });
  REQUIRE(error.has_value());
  CHECK(error->code() == ErrorCode::IOTilesExceedTiles);
  CHECK(error->subject() == "/sessionOptions/numIOTiles");
  CHECK(error->detail() ==
        "numIOTiles 64 leaves no compute tiles on a device with tilesPerIpu 64; set numIOTiles "
        "below 64");
  CHECK_NOTHROW(validate(options));
  device.tilesPerIpu = 66;
  CHECK_NOTHROW(validate(options, device));
}

TEST_CASE("the first rule violated is the one reported") {
  struct Row {
    const char* name;
    Edit edit;
    ErrorCode code;
  };
  const std::vector<Row> rows = {
      {"counts before switches",
       [](SessionOptions& o) {
         o.accumulationFactor = 0;
         o.replicatedGraphCount = 4;
       },
       ErrorCode::OutOfRange},
      {"switches before distribution",
       [](SessionOptions& o) {
         o.replicatedGraphCount = 4;
         o.globalReplicationFactor = 2;
       },
       ErrorCode::ReplicationDisabledButCount},
      {"a too small global factor before the offset", [](SessionOptions& o) { distribute(o, 4, 2, 2); },
       ErrorCode::LocalLargerThanGlobal},
      {"distribution before IO tiles",
       [](SessionOptions& o) {
         o.globalReplicaOffset = 1;
         o.numIOTiles = 3;
       },
       ErrorCode::DistributedSettingsWithoutDistribution},
      {"IO tiles before tile sets",
       [](SessionOptions& o) {
         o.numIOTiles = 3;
         o.weightTensorLocationSettings.location.storageTileSet = TileSet::IO;
       },
       ErrorCode::InvalidIOTileCount},
      {"missing IO tiles before IO storage loaded by compute tiles",
       [](SessionOptions& o) {
         o.tensorLocationSettingsOverride["a"].storageTileSet = TileSet::IO;
         o.tensorLocationSettingsOverride["b"].loadTileSet = TileSet::IO;
       },
       ErrorCode::IOTileSetWithoutIOTiles},
      {"tile sets before domains",
       [](SessionOptions& o) {
         o.weightTensorLocationSettings.location.shardingDomain = {CommGroupType::Consecutive, 0};
         o.weightTensorLocationSettings.location.loadTileSet = TileSet::IO;
       },
       ErrorCode::IOTileSetWithoutIOTiles},
      {"invalid domains before divisibility",
       [](SessionOptions& o) {
         o.weightTensorLocationSettings.location.shardingDomain = {CommGroupType::Consecutive, 3};
         o.accumulatorTensorLocationSettings.location.shardingDomain = {CommGroupType::None, 3};
       },
       ErrorCode::InvalidCommGroup},
      {"domains before thresholds",
       [](SessionOptions& o) {
         replicate(o, 2);
         shard(o.weightTensorLocationSettings);
         shard(o.accumulatorTensorLocationSettings, {CommGroupType::None, 0});
         o.activationTensorLocationSettings.minElementsForOffChip = -1;
       },
       ErrorCode::LinkedShardingDomainsDiffer},
  };
  for (const Row& row : rows) {
    CAPTURE(row.name);
    const SessionOptions options = with(row.edit);
    TESSERA_CHECK_ERROR(validate(options), ConfigError, row.code);
  }
}

TEST_CASE("validate accepts the documented recipes") {
  struct Row {
    const char* name;
    Edit edit;
  };
  const std::vector<Row> rows = {
      {"defaults", [](SessionOptions&) {}},
      {"replication", [](SessionOptions& o) { replicate(o, 8); }},
      {"gradient accumulation",
       [](SessionOptions& o) {
         o.enableGradientAccumulation = true;
         o.accumulationFactor = 16;
       }},
      // Reference §2.5 and seed §10.2 with num_replicas = 4.
      {"shard weights",
       [](SessionOptions& o) {
         replicate(o, 4);
         o.weightTensorLocationSettings.minElementsForReplicatedTensorSharding = 4;
         o.weightTensorLocationSettings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
       }},
      {"shard weights and optimizer state",
       [](SessionOptions& o) {
         replicate(o, 4);
         o.weightTensorLocationSettings.minElementsForReplicatedTensorSharding = 4;
         o.weightTensorLocationSettings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
         o.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = 4;
         o.optimizerStateTensorLocationSettings.location.replicatedTensorSharding =
             ReplicatedTensorSharding::On;
       }},
      // Seed §10.3: two instances of 2 local replicas out of 4, both offsets.
      {"multi-pod optimizer state sharding, first instance",
       [](SessionOptions& o) {
         distribute(o, 2, 4, 0);
         o.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = 2;
         o.optimizerStateTensorLocationSettings.location.replicatedTensorSharding =
             ReplicatedTensorSharding::On;
         const CommGroup domain(CommGroupType::Consecutive, 2);
         o.weightTensorLocationSettings.location.shardingDomain = domain;
         o.optimizerStateTensorLocationSettings.location.shardingDomain = domain;
         o.accumulatorTensorLocationSettings.location.shardingDomain = domain;
       }},
      {"multi-pod optimizer state sharding, second instance",
       [](SessionOptions& o) {
         distribute(o, 2, 4, 2);
         o.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = 2;
         shard(o.optimizerStateTensorLocationSettings, {CommGroupType::Consecutive, 2});
         o.weightTensorLocationSettings.location.shardingDomain = {CommGroupType::Consecutive, 2};
         o.accumulatorTensorLocationSettings.location.shardingDomain = {CommGroupType::Consecutive, 2};
       }},
      {"one replica per instance", [](SessionOptions& o) { distribute(o, 1, 4, 3); }},
      {"offset of the last instance", [](SessionOptions& o) { distribute(o, 4, 16, 12); }},
      {"IO tiles",
       [](SessionOptions& o) {
         o.numIOTiles = 128;
         o.weightTensorLocationSettings.location =
             TensorLocation(TensorStorage::OffChip, TileSet::IO, TileSet::IO);
         o.tensorLocationSettingsOverride["x"] =
             TensorLocation(TensorStorage::OffChip, TileSet::IO, TileSet::Compute);
       }},
      {"the same domain written two ways",
       [](SessionOptions& o) {
         replicate(o, 4);
         shard(o.weightTensorLocationSettings, {CommGroupType::Consecutive, 4});
         shard(o.optimizerStateTensorLocationSettings);
       }},
      {"an override need not match the categories",
       [](SessionOptions& o) {
         replicate(o, 4);
         shard(o.weightTensorLocationSettings);
         o.tensorLocationSettingsOverride["w"] = TensorLocation(
             TensorStorage::OffChip, ReplicatedTensorSharding::On, {CommGroupType::Orthogonal, 2});
       }},
      {"zero thresholds",
       [](SessionOptions& o) {
         o.weightTensorLocationSettings.minElementsForOffChip = 0;
         o.weightTensorLocationSettings.minElementsForReplicatedTensorSharding = 0;
       }},
  };
  for (const Row& row : rows) {
    CAPTURE(row.name);
    const SessionOptions options = with(row.edit);
    CHECK_NOTHROW(validate(options));
    CHECK_NOTHROW(validate(options, DeviceSpec{}));
  }
}
