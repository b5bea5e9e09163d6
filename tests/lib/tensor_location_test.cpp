#include "tessera/lib/tensor_location.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "tessera/lib/error.hpp"
#include "tessera/lib/replica_grouping.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

// doctest cannot print a NamedEnum in a comparison (its enum printer and
// tessera::toString are equally good overloads), so compare names.
template <NamedEnum E>
std::string name(E value) {
  return std::string(toString(value));
}

}  // namespace

TEST_CASE("defaults are PopART's") {
  const TensorLocation location;
  CHECK(name(location.storage) == "OnChip");
  CHECK(name(location.loadTileSet) == "Compute");
  CHECK(name(location.storageTileSet) == "Compute");
  CHECK(name(location.replicatedTensorSharding) == "Off");
  CHECK(location.shardingDomain == CommGroup(CommGroupType::All, 0));
  CHECK_FALSE(location.isRemote());

  const TensorLocationSettings settings;
  CHECK(settings.location == TensorLocation());
  CHECK(settings.minElementsForOffChip == 2);
  CHECK(settings.minElementsForReplicatedTensorSharding == 8192);
}

TEST_CASE("a tensor is remote when off chip or sharded") {
  CHECK(TensorLocation(TensorStorage::OffChip).isRemote());
  CHECK(TensorLocation(TensorStorage::OnChip, ReplicatedTensorSharding::On).isRemote());
  CHECK_FALSE(TensorLocation(TensorStorage::OnChip, TileSet::IO, TileSet::IO).isRemote());
}

TEST_CASE("CommGroup and TensorLocation print their fields") {
  struct Row {
    std::string printed, expected;
  };
  const std::vector<Row> rows = {
      {CommGroup().str(), "CommGroup(type=All, replicaGroupSize=0)"},
      {CommGroup(CommGroupType::Consecutive, 2).str(), "CommGroup(type=Consecutive, replicaGroupSize=2)"},
      {CommGroup(CommGroupType::Orthogonal, 4).str(), "CommGroup(type=Orthogonal, replicaGroupSize=4)"},
      {CommGroup(CommGroupType::None, 0).str(), "CommGroup(type=None, replicaGroupSize=0)"},
      {TensorLocation().str(), "(OnChip, loadTileSet=Compute, storageTileSet=Compute, RTS=Off)"},
      // The domain matters only to sharded tensors, so only they print it.
      {TensorLocation(TensorStorage::OffChip, ReplicatedTensorSharding::Off, {CommGroupType::Consecutive, 2})
           .str(),
       "(OffChip, loadTileSet=Compute, storageTileSet=Compute, RTS=Off)"},
      {TensorLocation(TensorStorage::OffChip, TileSet::IO, TileSet::IO, ReplicatedTensorSharding::On,
                      {CommGroupType::Consecutive, 2})
           .str(),
       "(OffChip, loadTileSet=IO, storageTileSet=IO, RTS=On, shardingDomain=CommGroup(type=Consecutive, "
       "replicaGroupSize=2))"},
      {TensorLocation(TensorStorage::OnChip, ReplicatedTensorSharding::On).str(),
       "(OnChip, loadTileSet=Compute, storageTileSet=Compute, RTS=On, shardingDomain=CommGroup(type=All, "
       "replicaGroupSize=0))"},
      {fmt::format("{} {} {} {} {}", TensorStorage::OffChip, TileSet::IO, ReplicatedTensorSharding::On,
                   CommGroupType::Orthogonal, TensorCategory::OptimizerState),
       "OffChip IO On Orthogonal OptimizerState"},
  };
  for (const Row& row : rows) CHECK(row.printed == row.expected);
}

TEST_CASE("Consecutive and Orthogonal CommGroups need a group size") {
  for (const CommGroup group :
       {CommGroup(CommGroupType::Consecutive, 0), CommGroup(CommGroupType::Orthogonal, -1)}) {
    CAPTURE(group.str());
    const auto error = test::catchError<ConfigError>([&] { (void)group.toReplicaGrouping(4); });
    REQUIRE(error.has_value());
    CHECK(error->code() == ErrorCode::InvalidCommGroup);
    CHECK(error->subject() == group.str());
    CHECK(error->detail().find(fmt::format("needs replicaGroupSize >= 1, found {}",
                                           group.replicaGroupSize)) != std::string::npos);
  }
  // All and None ignore the size, as in PopART; validate() rejects it in options.
  CHECK(CommGroup(CommGroupType::All, 3).groupSize(4) == 4);
  CHECK(CommGroup(CommGroupType::None, 3).groupSize(4) == 1);
}

TEST_CASE("equality compares every field") {
  CHECK(CommGroup(CommGroupType::Consecutive, 2) != CommGroup(CommGroupType::Consecutive, 4));
  CHECK(CommGroup(CommGroupType::Consecutive, 2) != CommGroup(CommGroupType::Orthogonal, 2));
  TensorLocation a(TensorStorage::OffChip, ReplicatedTensorSharding::On, {CommGroupType::Consecutive, 2});
  TensorLocation b = a;
  CHECK(a == b);
  b.shardingDomain.replicaGroupSize = 4;
  CHECK(a != b);
  CHECK(TensorLocationSettings(TensorStorage::OffChip, 2, 16) !=
        TensorLocationSettings(TensorStorage::OffChip));
}
