// validate(SessionOptions): the cross-field rules. Each rule rejects with its
// own ErrorCode and the JSON path of the offending field; nothing is adjusted.
// Rules run in a fixed order and the first violation is thrown.
#include "validate_options.hpp"

#include <array>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "option_paths.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/replica_grouping.hpp"
#include "tessera/lib/session_options.hpp"

namespace tessera {
namespace {

constexpr int64_t kMinIOTiles = 32;

std::string fieldPath(std::string_view field) { return fmt::format("{}/{}", kSessionOptionsPath, field); }

template <class... Args>
[[noreturn]] void fail(ErrorCode code, std::string subject, fmt::format_string<Args...> format,
                       Args&&... args) {
  throw ConfigError(code, std::move(subject), fmt::format(format, std::forward<Args>(args)...));
}

// Calls fn(location, path) for every category setting, in TensorCategory
// order, then for every override, in name order; `path` is the JSON path of
// the TensorLocation.
template <class Fn>
void forEachLocation(const SessionOptions& options, Fn&& fn) {
  for (const auto& [category, name] : EnumNames<TensorCategory>::kNames) {
    fn(options.locationSettings(category).location, detail::categoryLocationPath(category));
  }
  for (const auto& [name, location] : options.tensorLocationSettingsOverride) {
    fn(location, detail::overridePath(name));
  }
}

bool hasGroupSize(CommGroupType type) noexcept {
  return type == CommGroupType::Consecutive || type == CommGroupType::Orthogonal;
}

void checkCounts(const SessionOptions& o) {
  if (o.replicatedGraphCount < 1) {
    fail(ErrorCode::OutOfRange, fieldPath("replicatedGraphCount"),
         "replicatedGraphCount is {}; it must be >= 1 (1 runs a single replica)", o.replicatedGraphCount);
  }
  if (o.accumulationFactor < 1) {
    fail(ErrorCode::OutOfRange, fieldPath("accumulationFactor"),
         "accumulationFactor is {}; it must be >= 1 (1 updates the weights after every micro-batch)",
         o.accumulationFactor);
  }
  if (o.numIOTiles < 0) {
    fail(ErrorCode::OutOfRange, fieldPath("numIOTiles"),
         "numIOTiles is {}; it must be 0 (no IO tiles) or an even number >= {}", o.numIOTiles, kMinIOTiles);
  }
}

void checkSwitches(const SessionOptions& o) {
  if (!o.enableReplicatedGraphs && o.replicatedGraphCount > 1) {
    fail(ErrorCode::ReplicationDisabledButCount, fieldPath("replicatedGraphCount"),
         "{} replicas requested but enableReplicatedGraphs is false; set {} to true or replicatedGraphCount "
         "to 1",
         o.replicatedGraphCount, fieldPath("enableReplicatedGraphs"));
  }
  // The getter throws the error of this rule.
  (void)o.getAccumulationFactor();
  // PopART recomputes each forward pipeline stage under Pipeline and
  // refuses the type without pipelining.
  if (o.autoRecomputation == RecomputationType::Pipeline && !o.enablePipelining) {
    fail(ErrorCode::RecomputationNeedsPipelining, fieldPath("autoRecomputation"),
         "autoRecomputation is Pipeline, which recomputes each forward pipeline stage, but pipelining is "
         "not enabled; use Standard, NormOnly, RecomputeAll or None");
  }
}

// PopART's rules for phased execution: the mode and phases >= 2 go together.
void checkExecutionPhases(const SessionOptions& o) {
  const ExecutionPhaseSettings& e = o.executionPhaseSettings;
  const std::string phasesPath = fieldPath("executionPhaseSettings") + "/phases";
  const bool phased = o.virtualGraphMode == VirtualGraphMode::ExecutionPhases;
  if (phased && e.phases < 2) {
    fail(ErrorCode::ExecutionPhasesWithoutPhases, phasesPath,
         "virtualGraphMode is ExecutionPhases but executionPhaseSettings.phases is {}; phased execution needs at "
         "least 2 phases, so set phases >= 2, or virtualGraphMode to Off, Manual or Auto",
         e.phases);
  }
  if (!phased && e.phases >= 2) {
    fail(ErrorCode::PhasesWithoutExecutionPhases, phasesPath,
         "executionPhaseSettings.phases is {} but {} is {}; phases are run only with virtualGraphMode "
         "ExecutionPhases, so set it to ExecutionPhases, or phases to 0",
         e.phases, fieldPath("virtualGraphMode"), o.virtualGraphMode);
  }
  if (phased && o.enablePipelining) {
    fail(ErrorCode::ExecutionPhasesWithPipelining, fieldPath("enablePipelining"),
         "enablePipelining is true with virtualGraphMode ExecutionPhases; a replica's IPUs run either pipeline "
         "stages or execution phases, not both: set enablePipelining to false, or virtualGraphMode to Manual or "
         "Auto");
  }
}

void checkPipelining(const SessionOptions& o) {
  if (o.enablePipelining && o.virtualGraphMode == VirtualGraphMode::Off) {
    fail(ErrorCode::PipeliningWithoutVirtualGraphs, fieldPath("enablePipelining"),
         "enablePipelining is true but {} is Off; pipelining runs the stages of a replica on its IPUs, so set "
         "virtualGraphMode to Manual or Auto (with /device/ipusPerReplica >= 2), or enablePipelining to false",
         fieldPath("virtualGraphMode"));
  }
}

void checkDistribution(const SessionOptions& o) {
  if (!o.enableDistributedReplicatedGraphs) {
    // Without distribution these fields are not read; accepting other values
    // would ignore them silently.
    if (o.globalReplicationFactor != 1) {
      fail(ErrorCode::DistributedSettingsWithoutDistribution, fieldPath("globalReplicationFactor"),
           "globalReplicationFactor is {} but enableDistributedReplicatedGraphs is false, so it would be "
           "ignored; set {} to true or globalReplicationFactor to 1",
           o.globalReplicationFactor, fieldPath("enableDistributedReplicatedGraphs"));
    }
    if (o.globalReplicaOffset != 0) {
      fail(
          ErrorCode::DistributedSettingsWithoutDistribution, fieldPath("globalReplicaOffset"),
          "globalReplicaOffset is {} but enableDistributedReplicatedGraphs is false, so it would be ignored; "
          "set {} to true or globalReplicaOffset to 0",
          o.globalReplicaOffset, fieldPath("enableDistributedReplicatedGraphs"));
    }
    return;
  }
  const int64_t global = o.globalReplicationFactor;
  const int64_t offset = o.globalReplicaOffset;
  const int64_t local = o.getLocalReplicationFactor();
  if (global < 1) {
    fail(ErrorCode::GlobalReplicationFactorTooSmall, fieldPath("globalReplicationFactor"),
         "globalReplicationFactor is {}; it must be >= 1 (the replicas of all instances together)", global);
  }
  if (offset < 0) {
    fail(ErrorCode::GlobalReplicaOffsetNegative, fieldPath("globalReplicaOffset"),
         "globalReplicaOffset is {}; it must be >= 0 (the global index of this instance's first replica)",
         offset);
  }
  // Checked before the offset so that a too-small global factor is reported
  // as such rather than as a bad offset.
  if (local > global) {
    fail(
        ErrorCode::LocalLargerThanGlobal, fieldPath("replicatedGraphCount"),
        "the local replication factor {} is larger than globalReplicationFactor {}; the global factor counts "
        "the replicas of every instance, so set it to a multiple of {}",
        local, global, local);
  }
  if (offset > global - local) {
    fail(ErrorCode::GlobalReplicaOffsetTooLarge, fieldPath("globalReplicaOffset"),
         "globalReplicaOffset {} + local replication factor {} = {} exceeds globalReplicationFactor {}; this "
         "instance's replicas must lie within 0..{} (stricter than PopART, which only requires offset <= "
         "global), so set globalReplicaOffset to at most {}",
         // Both are >= 0 here, so their sum fits in 64 unsigned bits.
         offset, local, static_cast<uint64_t>(offset) + static_cast<uint64_t>(local), global, global - 1,
         global - local);
  }
  if (o.enableReplicatedGraphs && local == 1) {
    fail(ErrorCode::LocalReplicationFactorOne, fieldPath("replicatedGraphCount"),
         "enableReplicatedGraphs is true but replicatedGraphCount is 1 in a distributed run; set "
         "replicatedGraphCount to the replicas per instance, or {} to false for one replica per instance",
         fieldPath("enableReplicatedGraphs"));
  }
  if (global % local != 0) {
    fail(ErrorCode::GlobalNotMultipleOfLocal, fieldPath("globalReplicationFactor"),
         "globalReplicationFactor {} is not a multiple of the local replication factor {}; every instance "
         "runs "
         "the same number of replicas, so use a multiple of {}",
         global, local, local);
  }
  if (offset % local != 0) {
    fail(ErrorCode::GlobalReplicaOffsetMisaligned, fieldPath("globalReplicaOffset"),
         "globalReplicaOffset {} is not a multiple of the local replication factor {}; instance i starts at "
         "replica i * {}",
         offset, local, local);
  }
}

void checkIOTiles(const SessionOptions& o, std::optional<int64_t> tilesPerIpu) {
  if (o.numIOTiles > 0 && (o.numIOTiles % 2 != 0 || o.numIOTiles < kMinIOTiles)) {
    fail(ErrorCode::InvalidIOTileCount, fieldPath("numIOTiles"),
         "numIOTiles is {}; it must be 0 or an even number >= {}", o.numIOTiles, kMinIOTiles);
  }
  if (tilesPerIpu && o.numIOTiles > 0 && o.numIOTiles >= *tilesPerIpu) {
    fail(ErrorCode::IOTilesExceedTiles, fieldPath("numIOTiles"),
         "numIOTiles {} leaves no compute tiles on a device with tilesPerIpu {}; set numIOTiles below {}",
         o.numIOTiles, *tilesPerIpu, *tilesPerIpu);
  }
}

void checkTileSets(const SessionOptions& o) {
  if (o.numIOTiles == 0) {
    forEachLocation(o, [&](const TensorLocation& location, const std::string& path) {
      const auto check = [&](TileSet tileSet, std::string_view field) {
        if (tileSet != TileSet::IO) return;
        fail(ErrorCode::IOTileSetWithoutIOTiles, path + "/" + std::string(field),
             "{} is IO but numIOTiles is 0; set {} to an even number >= {} (e.g. 128) or {} to Compute",
             field, fieldPath("numIOTiles"), kMinIOTiles, field);
      };
      check(location.loadTileSet, "loadTileSet");
      check(location.storageTileSet, "storageTileSet");
    });
  }
  forEachLocation(o, [](const TensorLocation& location, const std::string& path) {
    if (location.storageTileSet == TileSet::IO && location.loadTileSet == TileSet::Compute) {
      fail(
          ErrorCode::StorageTileSetWithoutIOLoad, path + "/storageTileSet",
          "storageTileSet is IO but loadTileSet is Compute, so the tensor would never be staged on IO tiles; "
          "set loadTileSet to IO as well, or storageTileSet to Compute");
    }
  });
}

void checkShardingDomains(const SessionOptions& o) {
  forEachLocation(o, [](const TensorLocation& location, const std::string& path) {
    const CommGroup& domain = location.shardingDomain;
    if (hasGroupSize(domain.type) && domain.replicaGroupSize < 1) {
      fail(ErrorCode::InvalidCommGroup, path + "/shardingDomain/replicaGroupSize",
           "a sharding domain of type {} needs replicaGroupSize >= 1, found {}; set it to the number of "
           "replicas a tensor is sharded over (e.g. the local replication factor)",
           domain.type, domain.replicaGroupSize);
    }
    if (!hasGroupSize(domain.type) && domain.replicaGroupSize != 0) {
      fail(ErrorCode::InvalidCommGroup, path + "/shardingDomain/replicaGroupSize",
           "replicaGroupSize is {} but a sharding domain of type {} has no group size; set it to 0, or use "
           "type Consecutive or Orthogonal for groups of {} replicas",
           domain.replicaGroupSize, domain.type, domain.replicaGroupSize);
    }
  });
  const int64_t replicas = o.getGlobalReplicationFactor();
  forEachLocation(o, [replicas](const TensorLocation& location, const std::string& path) {
    const CommGroup& domain = location.shardingDomain;
    if (hasGroupSize(domain.type) && replicas % domain.replicaGroupSize != 0) {
      fail(ErrorCode::ShardingDomainDoesNotDivide, path + "/shardingDomain/replicaGroupSize",
           "groups of {} replicas do not divide the global replication factor {}; use a divisor of {}",
           domain.replicaGroupSize, replicas, replicas);
    }
  });
}

// Weights, their optimizer state and their accumulators are updated together
// and must be split the same way. Domains are compared as groupings, so
// Consecutive(R) of R replicas matches All.
void checkLinkedDomains(const SessionOptions& o) {
  constexpr std::array kLinked = {TensorCategory::Weight, TensorCategory::OptimizerState,
                                  TensorCategory::Accumulator};
  const int64_t replicas = o.getGlobalReplicationFactor();
  const TensorLocation* first = nullptr;
  TensorCategory firstCategory = TensorCategory::Weight;
  for (const TensorCategory category : kLinked) {
    const TensorLocation& location = o.locationSettings(category).location;
    if (location.replicatedTensorSharding != ReplicatedTensorSharding::On) continue;
    if (first == nullptr) {
      first = &location;
      firstCategory = category;
      continue;
    }
    if (first->shardingDomain.toReplicaGrouping(replicas) ==
        location.shardingDomain.toReplicaGrouping(replicas)) {
      continue;
    }
    const std::string firstPath = detail::categoryLocationPath(firstCategory) + "/shardingDomain";
    fail(ErrorCode::LinkedShardingDomainsDiffer, detail::categoryLocationPath(category) + "/shardingDomain",
         "this sharding domain is {} but {} is {}; sharded weights, optimizer state and accumulators are "
         "updated together, so give "
         "every category with replicatedTensorSharding On the same sharding domain",
         location.shardingDomain.str(), firstPath, first->shardingDomain.str());
  }
}

void checkThresholds(const SessionOptions& o) {
  for (const auto& [category, name] : EnumNames<TensorCategory>::kNames) {
    const TensorLocationSettings& settings = o.locationSettings(category);
    const std::string_view key = SessionOptions::locationSettingsKey(category);
    const auto check = [&](int64_t value, std::string_view field) {
      if (value >= 0) return;
      fail(ErrorCode::NegativeThreshold, fmt::format("{}/{}/{}", kSessionOptionsPath, key, field),
           "{} is {}; an element count threshold must be >= 0 (0 applies the location to every tensor)",
           field, value);
    };
    check(settings.minElementsForOffChip, "minElementsForOffChip");
    check(settings.minElementsForReplicatedTensorSharding, "minElementsForReplicatedTensorSharding");
  }
}

void checkLossScaling(const SessionOptions& o) {
  const AutomaticLossScalingSettings& s = o.automaticLossScalingSettings;
  const auto path = [](std::string_view field) {
    return fmt::format("{}/automaticLossScalingSettings/{}", kSessionOptionsPath, field);
  };
  if (s.updatePeriod < 1) {
    fail(ErrorCode::OutOfRange, path("updatePeriod"),
         "updatePeriod is {}; it must be >= 1 (the clean steps in a row before the scale grows)",
         s.updatePeriod);
  }
  if (!(s.growthFactor > 1)) {
    fail(ErrorCode::OutOfRange, path("growthFactor"), "growthFactor is {}; it must be > 1", s.growthFactor);
  }
  if (!(s.backoffFactor > 0 && s.backoffFactor < 1)) {
    fail(ErrorCode::OutOfRange, path("backoffFactor"), "backoffFactor is {}; it must be in (0, 1)",
         s.backoffFactor);
  }
  // 2^127 keeps the scale and its growth within float32.
  constexpr double kLargest = 0x1p127;
  if (!(s.minLossScale > 0 && s.minLossScale <= kLargest)) {
    fail(ErrorCode::OutOfRange, path("minLossScale"), "minLossScale is {}; it must be in (0, 2^127]",
         s.minLossScale);
  }
  if (!(s.maxLossScale > 0 && s.maxLossScale <= kLargest)) {
    fail(ErrorCode::OutOfRange, path("maxLossScale"), "maxLossScale is {}; it must be in (0, 2^127]",
         s.maxLossScale);
  }
  if (s.maxLossScale < s.minLossScale) {
    fail(ErrorCode::InvalidLossScaling, path("maxLossScale"),
         "maxLossScale is {} but minLossScale is {}; the scale could not lie between them, so raise "
         "maxLossScale or lower minLossScale",
         s.maxLossScale, s.minLossScale);
  }
}

}  // namespace

namespace detail {

void validateOptions(const SessionOptions& options, std::optional<int64_t> tilesPerIpu) {
  checkCounts(options);
  checkSwitches(options);
  checkPipelining(options);
  checkExecutionPhases(options);
  checkDistribution(options);
  checkIOTiles(options, tilesPerIpu);
  checkTileSets(options);
  checkShardingDomains(options);
  checkLinkedDomains(options);
  checkThresholds(options);
  checkLossScaling(options);
}

}  // namespace detail

void validate(const SessionOptions& options) { detail::validateOptions(options, std::nullopt); }

}  // namespace tessera
