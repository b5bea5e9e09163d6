#include "tessera/lib/location_resolver.hpp"

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "test_support.hpp"

using namespace tessera;

namespace {

using Edit = std::function<void(SessionOptions&)>;

struct Downgrade {
  std::string setting, requested, applied, why;
};

struct Row {
  const char* name;
  Edit edit;
  TensorInfo tensor;
  TensorLocation expected;
  std::string decidedBy;
  std::vector<Downgrade> downgrades;
  std::string reason;
};

void replicate(SessionOptions& o, int64_t count) {
  o.enableReplicatedGraphs = true;
  o.replicatedGraphCount = count;
}

const TensorLocation kOnChip{};
const TensorLocation kOffChip{TensorStorage::OffChip};
const TensorLocation kSharded{TensorStorage::OnChip, ReplicatedTensorSharding::On};
const TensorLocation kOffChipSharded{TensorStorage::OffChip, ReplicatedTensorSharding::On};

const std::string kWeight = "/sessionOptions/weightTensorLocationSettings/location";
const std::string kOptimizerState = "/sessionOptions/optimizerStateTensorLocationSettings/location";
const std::string kAccumulator = "/sessionOptions/accumulatorTensorLocationSettings/location";
const std::string kActivation = "/sessionOptions/activationTensorLocationSettings/location";

void checkRow(const Row& row) {
  CAPTURE(row.name);
  SessionOptions options;
  row.edit(options);
  const ResolvedLocation resolved = resolveTensorLocation(options, row.tensor);
  CAPTURE(resolved.location.str());
  CHECK(resolved.location == row.expected);
  CHECK(resolved.decidedBy == row.decidedBy);
  REQUIRE(resolved.downgrades.size() == row.downgrades.size());
  for (std::size_t i = 0; i < row.downgrades.size(); ++i) {
    CHECK(resolved.downgrades[i].setting == row.downgrades[i].setting);
    CHECK(resolved.downgrades[i].requested == row.downgrades[i].requested);
    CHECK(resolved.downgrades[i].applied == row.downgrades[i].applied);
    CHECK(resolved.downgrades[i].why == row.downgrades[i].why);
  }
  CHECK(resolved.reason() == row.reason);
}

}  // namespace

TEST_CASE("threshold vectors of the reference") {
  const std::vector<Row> rows = {
      {"weight of 8191 elements is not sharded",
       [](SessionOptions& o) {
         replicate(o, 4);
         o.weightTensorLocationSettings.location = kSharded;
       },
       {"w", TensorCategory::Weight, 8191},
       kOnChip,
       kWeight,
       {{kWeight + "/replicatedTensorSharding", "On", "Off",
         "8191 elements < minElementsForReplicatedTensorSharding (8192)"}},
       kWeight + "; replicatedTensorSharding On -> Off: 8191 elements < "
                 "minElementsForReplicatedTensorSharding (8192)"},
      {"weight of 8192 elements is sharded",
       [](SessionOptions& o) {
         replicate(o, 4);
         o.weightTensorLocationSettings.location = kSharded;
       },
       {"w", TensorCategory::Weight, 8192},
       kSharded,
       kWeight,
       {},
       kWeight},
      {"off-chip weight of 1 element stays on chip",
       [](SessionOptions& o) { o.weightTensorLocationSettings.location = kOffChip; },
       {"w", TensorCategory::Weight, 1},
       kOnChip,
       kWeight,
       {{kWeight + "/storage", "OffChip", "OnChip", "1 element < minElementsForOffChip (2)"}},
       kWeight + "; storage OffChip -> OnChip: 1 element < minElementsForOffChip (2)"},
      {"off-chip weight of 2 elements goes off chip",
       [](SessionOptions& o) { o.weightTensorLocationSettings.location = kOffChip; },
       {"w", TensorCategory::Weight, 2},
       kOffChip,
       kWeight,
       {},
       kWeight},
      {"accumulator of 1 element stays off chip",
       [](SessionOptions& o) { o.accumulatorTensorLocationSettings.location = kOffChip; },
       {"a", TensorCategory::Accumulator, 1},
       kOffChip,
       kAccumulator,
       {},
       kAccumulator},
      {"accumulator of 1 element stays sharded",
       [](SessionOptions& o) {
         replicate(o, 2);
         o.accumulatorTensorLocationSettings.location = kOffChipSharded;
       },
       {"a", TensorCategory::Accumulator, 1},
       kOffChipSharded,
       kAccumulator,
       {},
       kAccumulator},
      {"override of 1 element stays exactly as given",
       [](SessionOptions& o) {
         o.weightTensorLocationSettings.location = kOnChip;
         o.tensorLocationSettingsOverride["w"] =
             TensorLocation(TensorStorage::OffChip, TileSet::IO, TileSet::IO, ReplicatedTensorSharding::On,
                            {CommGroupType::None, 0});
       },
       {"w", TensorCategory::Weight, 1},
       TensorLocation(TensorStorage::OffChip, TileSet::IO, TileSet::IO, ReplicatedTensorSharding::On,
                      {CommGroupType::None, 0}),
       "/sessionOptions/tensorLocationSettingsOverride/w",
       {},
       "/sessionOptions/tensorLocationSettingsOverride/w"},
      {"activations are never sharded",
       [](SessionOptions& o) {
         replicate(o, 4);
         o.activationTensorLocationSettings.location = kSharded;
       },
       {"x", TensorCategory::Activation, 100000},
       kOnChip,
       kActivation,
       {{kActivation + "/replicatedTensorSharding", "On", "Off", "activations are never sharded"}},
       kActivation + "; replicatedTensorSharding On -> Off: activations are never sharded"},
      {"no sharding with a local replication factor of 1",
       [](SessionOptions& o) {
         replicate(o, 1);
         o.weightTensorLocationSettings.location = kSharded;
       },
       {"w", TensorCategory::Weight, 10000},
       kOnChip,
       kWeight,
       {{kWeight + "/replicatedTensorSharding", "On", "Off",
         "no local replication (replicatedGraphCount 1)"}},
       kWeight + "; replicatedTensorSharding On -> Off: no local replication (replicatedGraphCount 1)"},
      {"no sharding without replication",
       [](SessionOptions& o) { o.optimizerStateTensorLocationSettings.location = kSharded; },
       {"m", TensorCategory::OptimizerState, 10000},
       kOnChip,
       kOptimizerState,
       {{kOptimizerState + "/replicatedTensorSharding", "On", "Off",
         "no local replication (enableReplicatedGraphs is false)"}},
       kOptimizerState +
           "; replicatedTensorSharding On -> Off: no local replication (enableReplicatedGraphs is false)"},
      // As in PopART, the local factor decides: one replica per instance has
      // nothing to shard over locally.
      {"no sharding with one replica per instance",
       [](SessionOptions& o) {
         o.enableDistributedReplicatedGraphs = true;
         o.globalReplicationFactor = 4;
         o.weightTensorLocationSettings.location = kSharded;
       },
       {"w", TensorCategory::Weight, 10000},
       kOnChip,
       kWeight,
       {{kWeight + "/replicatedTensorSharding", "On", "Off",
         "no local replication (enableReplicatedGraphs is false)"}},
       kWeight +
           "; replicatedTensorSharding On -> Off: no local replication (enableReplicatedGraphs is false)"},
      {"sharding over local replicas of a distributed run",
       [](SessionOptions& o) {
         replicate(o, 2);
         o.enableDistributedReplicatedGraphs = true;
         o.globalReplicationFactor = 4;
         o.weightTensorLocationSettings.location.replicatedTensorSharding = ReplicatedTensorSharding::On;
         o.weightTensorLocationSettings.location.shardingDomain = {CommGroupType::Consecutive, 2};
       },
       {"w", TensorCategory::Weight, 10000},
       TensorLocation(TensorStorage::OnChip, ReplicatedTensorSharding::On, {CommGroupType::Consecutive, 2}),
       kWeight,
       {},
       kWeight},
      {"a None sharding domain does not shard",
       [](SessionOptions& o) {
         replicate(o, 4);
         o.weightTensorLocationSettings.location =
             TensorLocation(TensorStorage::OffChip, ReplicatedTensorSharding::On, {CommGroupType::None, 0});
       },
       {"w", TensorCategory::Weight, 10000},
       TensorLocation(TensorStorage::OffChip, ReplicatedTensorSharding::Off, {CommGroupType::None, 0}),
       kWeight,
       {{kWeight + "/replicatedTensorSharding", "On", "Off",
         "shardingDomain type None keeps a full copy on every replica"}},
       kWeight + "; replicatedTensorSharding On -> Off: shardingDomain type None keeps a full copy on every "
                 "replica"},
      {"both downgrades are reported",
       [](SessionOptions& o) {
         replicate(o, 2);
         o.optimizerStateTensorLocationSettings.location = kOffChipSharded;
         o.optimizerStateTensorLocationSettings.minElementsForOffChip = 100;
         o.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding = 64;
       },
       {"m", TensorCategory::OptimizerState, 10},
       kOnChip,
       kOptimizerState,
       {{kOptimizerState + "/storage", "OffChip", "OnChip", "10 elements < minElementsForOffChip (100)"},
        {kOptimizerState + "/replicatedTensorSharding", "On", "Off",
         "10 elements < minElementsForReplicatedTensorSharding (64)"}},
       kOptimizerState + "; storage OffChip -> OnChip: 10 elements < minElementsForOffChip (100); "
                         "replicatedTensorSharding On -> "
                         "Off: 10 elements < minElementsForReplicatedTensorSharding (64)"},
      {"nothing set keeps the tensor on chip",
       [](SessionOptions& o) { o.tensorLocationSettingsOverride["other"] = kOffChip; },
       {"w", TensorCategory::Weight, 1 << 20},
       kOnChip,
       kWeight,
       {},
       kWeight},
      {"override paths escape the name",
       [](SessionOptions& o) { o.tensorLocationSettingsOverride["layer/1~w"] = kOffChip; },
       {"layer/1~w", TensorCategory::Activation, 0},
       kOffChip,
       "/sessionOptions/tensorLocationSettingsOverride/layer~11~0w",
       {},
       "/sessionOptions/tensorLocationSettingsOverride/layer~11~0w"},
      {"a zero threshold shards every tensor",
       [](SessionOptions& o) {
         replicate(o, 2);
         o.weightTensorLocationSettings = TensorLocationSettings(kOffChipSharded, 0, 0);
       },
       {"w", TensorCategory::Weight, 0},
       kOffChipSharded,
       kWeight,
       {},
       kWeight},
  };
  for (const Row& row : rows) checkRow(row);
}

TEST_CASE("every category goes through the same rules") {
  struct Expect {
    TensorCategory category;
    bool offChipThreshold;  // a 1-element OffChip tensor comes back on chip
    bool rtsThreshold;      // a 100-element sharded tensor is not sharded
    bool neverSharded;
  };
  const std::vector<Expect> expectations = {
      {TensorCategory::Activation, true, false, true},
      {TensorCategory::Weight, true, true, false},
      {TensorCategory::OptimizerState, true, true, false},
      {TensorCategory::Accumulator, false, false, false},
  };
  for (const Expect& expect : expectations) {
    CAPTURE(toString(expect.category));
    SessionOptions options;
    replicate(options, 4);
    options.locationSettings(expect.category).location = kOffChipSharded;
    const std::string path =
        "/sessionOptions/" + std::string(SessionOptions::locationSettingsKey(expect.category)) + "/location";

    const ResolvedLocation tiny = resolveTensorLocation(options, {"t", expect.category, 1});
    CHECK(tiny.decidedBy == path);
    CHECK((tiny.location.storage == TensorStorage::OnChip) == expect.offChipThreshold);

    const ResolvedLocation small = resolveTensorLocation(options, {"t", expect.category, 100});
    CHECK((small.location.replicatedTensorSharding == ReplicatedTensorSharding::Off) ==
          (expect.rtsThreshold || expect.neverSharded));

    const ResolvedLocation large = resolveTensorLocation(options, {"t", expect.category, 100000});
    CHECK(toString(large.location.storage) == "OffChip");
    CHECK((large.location.replicatedTensorSharding == ReplicatedTensorSharding::On) == !expect.neverSharded);
  }
}
