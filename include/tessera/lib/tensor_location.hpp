// Where a tensor lives: on chip or in streaming memory, on compute or IO
// tiles, whole or sharded over a group of replicas. Names, values and
// defaults follow PopART so that its option code ports line by line.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/lib/enum_names.hpp"

namespace tessera {

class ReplicaGrouping;

enum class TensorStorage {
  OnChip,   // in the processor's SRAM for the whole step
  OffChip,  // in streaming memory; loaded before use, stored after update
};

enum class TileSet {
  Compute,  // the tiles that run the program
  IO,       // tiles set aside (SessionOptions::numIOTiles) to stage transfers
};

enum class ReplicatedTensorSharding { Off, On };

// How replicas are grouped for a sharding domain or a collective.
enum class CommGroupType {
  All,          // one group of every replica; replicaGroupSize is ignored
  Consecutive,  // groups {0..k-1}, {k..2k-1}, ... of replicaGroupSize k
  Orthogonal,   // groups {0, m, 2m, ...}, {1, m+1, ...} of size k, m = R/k
  None,         // every replica alone; replicaGroupSize is ignored
};

// Tensor categories. Each has its own TensorLocationSettings in
// SessionOptions; one resolver treats them all alike.
enum class TensorCategory {
  Activation,      // activations and their gradients
  Weight,          // trainable variables
  OptimizerState,  // e.g. SGD momentum, Adam moments
  Accumulator,     // gradient accumulators
};

template <>
struct EnumNames<TensorStorage> {
  static constexpr std::string_view kTypeName = "TensorStorage";
  static constexpr std::array kNames = {std::pair{TensorStorage::OnChip, std::string_view{"OnChip"}},
                                        std::pair{TensorStorage::OffChip, std::string_view{"OffChip"}}};
};
template <>
struct EnumNames<TileSet> {
  static constexpr std::string_view kTypeName = "TileSet";
  static constexpr std::array kNames = {std::pair{TileSet::Compute, std::string_view{"Compute"}},
                                        std::pair{TileSet::IO, std::string_view{"IO"}}};
};
template <>
struct EnumNames<ReplicatedTensorSharding> {
  static constexpr std::string_view kTypeName = "ReplicatedTensorSharding";
  static constexpr std::array kNames = {std::pair{ReplicatedTensorSharding::Off, std::string_view{"Off"}},
                                        std::pair{ReplicatedTensorSharding::On, std::string_view{"On"}}};
};
template <>
struct EnumNames<CommGroupType> {
  static constexpr std::string_view kTypeName = "CommGroupType";
  static constexpr std::array kNames = {
      std::pair{CommGroupType::All, std::string_view{"All"}},
      std::pair{CommGroupType::Consecutive, std::string_view{"Consecutive"}},
      std::pair{CommGroupType::Orthogonal, std::string_view{"Orthogonal"}},
      std::pair{CommGroupType::None, std::string_view{"None"}}};
};
template <>
struct EnumNames<TensorCategory> {
  static constexpr std::string_view kTypeName = "TensorCategory";
  static constexpr std::array kNames = {
      std::pair{TensorCategory::Activation, std::string_view{"Activation"}},
      std::pair{TensorCategory::Weight, std::string_view{"Weight"}},
      std::pair{TensorCategory::OptimizerState, std::string_view{"OptimizerState"}},
      std::pair{TensorCategory::Accumulator, std::string_view{"Accumulator"}}};
};

// A group of replicas described PopART's way. Convert to a ReplicaGrouping
// for the arithmetic; that conversion needs the replication factor.
struct CommGroup {
  CommGroupType type = CommGroupType::All;
  // Group size for Consecutive and Orthogonal; ignored (and 0 by convention)
  // for All and None.
  int64_t replicaGroupSize = 0;

  constexpr CommGroup() = default;
  constexpr CommGroup(CommGroupType t, int64_t size) : type(t), replicaGroupSize(size) {}

  // The replicas of each group among `numReplicas`. Throws ConfigError
  // (InvalidCommGroup / ReplicaGroupingNotDivisible) when the size does not
  // fit the replication factor.
  ReplicaGrouping toReplicaGrouping(int64_t numReplicas) const;
  // Group size among `numReplicas` replicas (All: numReplicas, None: 1).
  int64_t groupSize(int64_t numReplicas) const;
  // The CommGroup that names `grouping`; throws ConfigError(NotACommGroup)
  // when there is none (e.g. stride 2, group size 2 of 8 replicas).
  static CommGroup fromReplicaGrouping(const ReplicaGrouping& grouping);

  std::string str() const;  // "CommGroup(type=Consecutive, replicaGroupSize=2)"
  bool operator==(const CommGroup&) const = default;
};

struct TensorLocation {
  TensorStorage storage = TensorStorage::OnChip;
  // The tiles that move the tensor between streaming memory and the chip.
  TileSet loadTileSet = TileSet::Compute;
  // The tiles the tensor lives on while on chip. IO here needs loadTileSet IO
  // as well (validate() rejects IO storage loaded through compute tiles).
  TileSet storageTileSet = TileSet::Compute;
  // On: each replica of the sharding domain holds ceil(n/k) elements (see
  // ShardLayout); the full tensor is all-gathered where it is used.
  ReplicatedTensorSharding replicatedTensorSharding = ReplicatedTensorSharding::Off;
  // The replicas a sharded tensor is split over. Default: all replicas.
  CommGroup shardingDomain{};

  constexpr TensorLocation() = default;
  constexpr explicit TensorLocation(TensorStorage s) : storage(s) {}
  constexpr TensorLocation(TensorStorage s, ReplicatedTensorSharding rts)
      : storage(s), replicatedTensorSharding(rts) {}
  constexpr TensorLocation(TensorStorage s, ReplicatedTensorSharding rts, CommGroup domain)
      : storage(s), replicatedTensorSharding(rts), shardingDomain(domain) {}
  constexpr TensorLocation(TensorStorage s, TileSet load, TileSet store,
                           ReplicatedTensorSharding rts = ReplicatedTensorSharding::Off,
                           CommGroup domain = {})
      : storage(s), loadTileSet(load), storageTileSet(store), replicatedTensorSharding(rts),
        shardingDomain(domain) {}

  bool isRemote() const noexcept {
    return storage == TensorStorage::OffChip || replicatedTensorSharding == ReplicatedTensorSharding::On;
  }
  // "(OffChip, loadTileSet=IO, storageTileSet=IO, RTS=On, shardingDomain=CommGroup(...))";
  // the domain is printed only when RTS is On.
  std::string str() const;
  bool operator==(const TensorLocation&) const = default;
};

struct TensorLocationSettings {
  // The location every tensor of the category gets, subject to the
  // thresholds below.
  TensorLocation location{};
  // Tensors with fewer elements stay OnChip even when location says OffChip
  // (not applied to accumulators, as in PopART). Must be >= 0.
  int64_t minElementsForOffChip = 2;
  // Tensors with fewer elements are not sharded even when location says RTS
  // On (not applied to accumulators). Must be >= 0.
  int64_t minElementsForReplicatedTensorSharding = 8192;

  constexpr TensorLocationSettings() = default;
  constexpr explicit TensorLocationSettings(TensorLocation loc, int64_t minOffChip = 2, int64_t minRts = 8192)
      : location(loc), minElementsForOffChip(minOffChip), minElementsForReplicatedTensorSharding(minRts) {}
  constexpr explicit TensorLocationSettings(TensorStorage storage, int64_t minOffChip = 2,
                                            int64_t minRts = 8192)
      : location(storage), minElementsForOffChip(minOffChip), minElementsForReplicatedTensorSharding(minRts) {
  }

  bool operator==(const TensorLocationSettings&) const = default;
};

}  // namespace tessera
