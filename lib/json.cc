// Field tables of lib's option types and their public to_json / from_json.
// The docs repeat the header comments of the fields; they become the
// descriptions of the JSON Schema.
#include "tessera/lib/json.hpp"

#include <array>

#include <nlohmann/json.hpp>

#include "json_reader.hpp"
#include "option_paths.hpp"
#include "tessera/lib/replica_grouping.hpp"
#include "tessera/lib/shard_layout.hpp"

namespace tessera {

std::string jsonPointerToken(std::string_view token) {
  std::string out;
  detail::appendPointerToken(out, token);
  return out;
}

template <class V>
void visitFields(V& v, CommGroup& value) {
  v.field("type", value.type,
          {.doc = "How replicas are grouped: All (one group of every replica), Consecutive (groups {0..k-1}, "
                  "{k..2k-1}, ...), Orthogonal (groups {0, m, 2m, ...}, ... with m = R/k) or None (every "
                  "replica alone)."});
  v.field(
      "replicaGroupSize", value.replicaGroupSize,
      {.min = 0,
       .rangeCode = ErrorCode::InvalidCommGroup,
       .doc =
           "Group size k for Consecutive and Orthogonal; ignored (and 0 by convention) for All and None."});
}

template <class V>
void visitFields(V& v, TensorLocation& value) {
  v.field("storage", value.storage,
          {.doc = "OnChip: in the processor's SRAM for the whole step. OffChip: in streaming memory; loaded "
                  "before use, stored after update."});
  v.field("loadTileSet", value.loadTileSet,
          {.doc = "The tiles that move the tensor between streaming memory and the chip."});
  v.field("storageTileSet", value.storageTileSet,
          {.doc = "The tiles the tensor lives on while on chip. IO here needs loadTileSet IO as well."});
  v.field("replicatedTensorSharding", value.replicatedTensorSharding,
          {.doc = "On: each replica of the sharding domain holds ceil(n/k) elements; the full tensor is "
                  "all-gathered where it is used."});
  v.field("shardingDomain", value.shardingDomain,
          {.doc = "The replicas a sharded tensor is split over. Default: all replicas."});
}

template <class V>
void visitFields(V& v, TensorLocationSettings& value) {
  v.field("location", value.location,
          {.doc = "The location every tensor of the category gets, subject to the thresholds below."});
  v.field("minElementsForOffChip", value.minElementsForOffChip,
          {.min = 0,
           .rangeCode = ErrorCode::NegativeThreshold,
           .doc = "Tensors with fewer elements stay OnChip even when location says OffChip (not applied to "
                  "accumulators). Must be >= 0."});
  v.field(
      "minElementsForReplicatedTensorSharding", value.minElementsForReplicatedTensorSharding,
      {.min = 0,
       .rangeCode = ErrorCode::NegativeThreshold,
       .doc = "Tensors with fewer elements are not sharded even when location says RTS On (not applied to "
              "accumulators). Must be >= 0."});
}

template <class V>
void visitFields(V& v, AutomaticLossScalingSettings& value) {
  v.field("enabled", value.enabled,
          {.doc = "Adjust the loss scale during training and skip the steps whose gradients overflow. The "
                  "initial scale is the optimizer's lossScaling."});
  v.field("updatePeriod", value.updatePeriod,
          {.min = 1, .doc = "Clean steps in a row before the scale grows. Must be >= 1."});
  v.field("growthFactor", value.growthFactor,
          {.exclusiveMin = 1, .doc = "The scale is multiplied by it after updatePeriod clean steps. > 1."});
  v.field("backoffFactor", value.backoffFactor,
          {.exclusiveMin = 0,
           .exclusiveMax = 1,
           .doc = "The scale is multiplied by it after an overflow (the step is skipped). In (0, 1)."});
  v.field("minLossScale", value.minLossScale,
          {.exclusiveMin = 0, .max = 0x1p127, .doc = "The scale never goes below it. In (0, 2^127]."});
  v.field(
      "maxLossScale", value.maxLossScale,
      {.exclusiveMin = 0, .max = 0x1p127, .doc = "The scale never goes above it. In [minLossScale, 2^127]."});
}

template <class V>
void visitFields(V& v, ExecutionPhaseSettings& value) {
  v.field("phases", value.phases,
          {.min = 0,
           .doc = "Forward execution phases (PopART's executionPhaseSettings.phases); the backward ops of phase p "
                  "run in phase 2 phases - 2 - p. virtualGraphMode ExecutionPhases needs >= 2, any other mode 0 "
                  "or 1."});
  v.field("stages", value.stages,
          {.min = 1,
           .max = 2,
           .rangeCode = ErrorCode::InvalidExecutionPhaseStages,
           .doc = "IPUs the phases take turns on, phase p on IPU p % stages: 1 (one IPU, streaming memory "
                  "between phases) or 2 (ping-pong between two IPUs). /device/ipusPerReplica must equal it."});
  v.field("weightIOSchedule", value.weightIOSchedule,
          {.doc = "When OffChip weights are loaded for a phase: Preload (during the phase before) or OnDemand."});
  v.field("activationIOSchedule", value.activationIOSchedule,
          {.doc = "When OffChip activations are loaded for a phase: Preload or OnDemand."});
  v.field("optimizerStateIOSchedule", value.optimizerStateIOSchedule,
          {.doc = "When OffChip optimizer state is loaded for a phase: Preload or OnDemand."});
  v.field("accumulatorIOSchedule", value.accumulatorIOSchedule,
          {.doc = "When OffChip accumulators are loaded for a phase: Preload or OnDemand."});
  v.field("schedule", value.schedule,
          {.doc = "The order of the optimizer's steps within a phase: Interleaving, Batch or BatchClusteredIO "
                  "(the numbers are the same)."});
}

namespace {

// The description of each category's settings, in TensorCategory order.
constexpr std::array<std::string_view, 4> kCategoryDocs = {
    "Where activations and their gradients live.",
    "Where trainable variables (weights) live.",
    "Where optimizer state (e.g. SGD momentum, Adam moments) lives.",
    "Where gradient accumulators live.",
};
static_assert(kCategoryDocs.size() == EnumNames<TensorCategory>::kNames.size());

}  // namespace

template <class V>
void visitFields(V& v, SessionOptions& value) {
  v.field("enableReplicatedGraphs", value.enableReplicatedGraphs,
          {.doc = "Run replicatedGraphCount copies (replicas) of the program in data parallel. When false, "
                  "replicatedGraphCount must be 1."});
  v.field(
      "replicatedGraphCount", value.replicatedGraphCount,
      {.min = 1,
       .doc = "Local replication factor: the number of replicas this instance runs. Must be >= 1; > 1 only "
              "with enableReplicatedGraphs."});
  v.field(
      "enableDistributedReplicatedGraphs", value.enableDistributedReplicatedGraphs,
      {.doc = "Replicas are spread over several instances. Usually filled in by configureSessionOptions() "
              "from the launcher's environment."});
  // The ranges of the two global values are validate()'s: it checks them
  // only for distributed runs.
  v.field(
      "globalReplicationFactor", value.globalReplicationFactor,
      {.doc = "Total replicas over all instances, this instance's included. Must be >= 1 and a multiple of "
              "the local replication factor."});
  v.field(
      "globalReplicaOffset", value.globalReplicaOffset,
      {.doc = "Global index of this instance's first replica: a multiple of the local replication factor, "
              "with offset + local <= global."});
  v.field(
      "enableGradientAccumulation", value.enableGradientAccumulation,
      {.doc = "Accumulate gradients over accumulationFactor micro-batches before each weight update. When "
              "false, accumulationFactor must be 1."});
  v.field("accumulationFactor", value.accumulationFactor,
          {.min = 1, .doc = "Micro-batches per weight update. Must be >= 1."});
  v.field("accumulationAndReplicationReductionType", value.accumulationAndReplicationReductionType,
          {.doc = "How gradients are reduced over micro-batches and replicas: Sum adds them, Mean averages "
                  "them."});
  v.field("meanAccumulationAndReplicationReductionStrategy",
          value.meanAccumulationAndReplicationReductionStrategy,
          {.doc = "With Mean reduction: average as a running mean (Running) or sum then divide (Post)."});
  v.field("autoRecomputation", value.autoRecomputation,
          {.doc = "Which forward ops are recomputed in the backward pass instead of keeping their outputs: "
                  "None, Standard (checkpoints where few activations are live), NormOnly, Pipeline (needs "
                  "pipelining) or RecomputeAll."});
  v.field("virtualGraphMode", value.virtualGraphMode,
          {.doc = "How ops are placed on the IPUs of a replica (/device/ipusPerReplica): Off (one IPU), Manual "
                  "(each op names its IPU: __ipu_number), Auto (the forward pass split by memory) or "
                  "ExecutionPhases (ops by execution phase: executionPhaseSettings)."});
  v.field("enablePipelining", value.enablePipelining,
          {.doc = "Run the IPUs of a replica as a pipeline over the micro-batches of a step (PopART's "
                  "enablePipelining): needs virtualGraphMode Manual or Auto over >= 2 IPUs and, in training, "
                  "accumulationFactor >= 2 x forward stages - 1. Stages: __pipeline_stage, else each op's IPU."});
  v.field("executionPhaseSettings", value.executionPhaseSettings,
          {.doc = "Phased execution (virtualGraphMode ExecutionPhases): the phases, the IPUs they take turns on "
                  "and when each category's OffChip tensors are loaded."});
  v.field(
      "numIOTiles", value.numIOTiles,
      {.min = 0,
       .doc = "Tiles per processor set aside to stage transfers with streaming memory (TileSet IO). 0, or an "
              "even number >= 32 and below the device's tilesPerIpu. Any TileSet IO setting needs it > 0."});
  for (const auto& [category, name] : EnumNames<TensorCategory>::kNames) {
    v.field(SessionOptions::locationSettingsKey(category), value.locationSettings(category),
            {.doc = kCategoryDocs[static_cast<std::size_t>(category)]});
  }
  v.field("tensorLocationSettingsOverride", value.tensorLocationSettingsOverride,
          {.doc = "Per-tensor locations, by tensor name. Applied verbatim: thresholds and downgrades do not "
                  "apply to them."});
  v.field("automaticLossScalingSettings", value.automaticLossScalingSettings,
          {.doc = "Automatic loss scaling: grow the scale after clean steps, shrink it and skip the step on "
                  "an overflow."});
}

TESSERA_INSTANTIATE_VISIT_FIELDS(CommGroup);
TESSERA_INSTANTIATE_VISIT_FIELDS(TensorLocation);
TESSERA_INSTANTIATE_VISIT_FIELDS(TensorLocationSettings);
TESSERA_INSTANTIATE_VISIT_FIELDS(AutomaticLossScalingSettings);
TESSERA_INSTANTIATE_VISIT_FIELDS(ExecutionPhaseSettings);
TESSERA_INSTANTIATE_VISIT_FIELDS(SessionOptions);

namespace {

// The JSON form of a ReplicaGrouping, read like any other table.
struct GroupingFields {
  int64_t numReplicas = 0;
  int64_t stride = 1;
  int64_t groupSize = 0;  // 0: numReplicas
};

template <class V>
void visitFields(V& v, GroupingFields& value) {
  v.field("numReplicas", value.numReplicas, {.min = 1, .rangeCode = ErrorCode::InvalidReplicaGrouping});
  v.field("stride", value.stride, {.min = 1, .rangeCode = ErrorCode::InvalidReplicaGrouping});
  v.field("groupSize", value.groupSize, {.min = 1, .rangeCode = ErrorCode::InvalidReplicaGrouping});
}

ReplicaGrouping readGrouping(const nlohmann::json& j) {
  const jsonio::SourceMap sources;
  jsonio::JsonReader reader(j, {}, sources);
  GroupingFields fields;
  visitFields(reader, fields);
  reader.finish();
  if (!j.contains("numReplicas")) {
    throw ConfigError(
        ErrorCode::InvalidReplicaGrouping, "/numReplicas",
        "numReplicas is missing; a ReplicaGrouping needs it (stride defaults to 1, groupSize to "
        "numReplicas)");
  }
  return ReplicaGrouping(fields.numReplicas, fields.stride,
                         fields.groupSize == 0 ? fields.numReplicas : fields.groupSize);
}

}  // namespace

#define TESSERA_ENUM_JSON(Enum)                                                  \
  void to_json(nlohmann::json& j, Enum value) { j = jsonio::enumToJson(value); } \
  void from_json(const nlohmann::json& j, Enum& value) { value = jsonio::enumFromJson<Enum>(j); }

TESSERA_ENUM_JSON(TensorStorage)
TESSERA_ENUM_JSON(TileSet)
TESSERA_ENUM_JSON(ReplicatedTensorSharding)
TESSERA_ENUM_JSON(CommGroupType)
TESSERA_ENUM_JSON(TensorCategory)
TESSERA_ENUM_JSON(ReductionType)
TESSERA_ENUM_JSON(MeanReductionStrategy)
TESSERA_ENUM_JSON(RecomputationType)
TESSERA_ENUM_JSON(VirtualGraphMode)
TESSERA_ENUM_JSON(ExecutionPhaseIOSchedule)
TESSERA_ENUM_JSON(ExecutionPhaseSchedule)
#undef TESSERA_ENUM_JSON

#define TESSERA_STRUCT_JSON(Type)                                                       \
  void to_json(nlohmann::json& j, const Type& value) { j = jsonio::writeValue(value); } \
  void from_json(const nlohmann::json& j, Type& value) {                                \
    value = jsonio::readValue<Type>(j, {}, jsonio::SourceMap{});                        \
  }

TESSERA_STRUCT_JSON(CommGroup)
TESSERA_STRUCT_JSON(TensorLocation)
TESSERA_STRUCT_JSON(TensorLocationSettings)
TESSERA_STRUCT_JSON(AutomaticLossScalingSettings)
TESSERA_STRUCT_JSON(ExecutionPhaseSettings)
TESSERA_STRUCT_JSON(SessionOptions)
#undef TESSERA_STRUCT_JSON

void to_json(nlohmann::json& j, const ShardLayout& layout) {
  j = {
      {"elements", layout.elements()},
      {"shards", layout.shards()},
      {"shardElements", layout.shardElements()},
      {"padding", layout.padding()},
      {"realElements", layout.realElementsPerShard()},
      {"version", layout.version()},
  };
}

}  // namespace tessera

tessera::ReplicaGrouping nlohmann::adl_serializer<tessera::ReplicaGrouping>::from_json(
    const nlohmann::json& j) {
  return tessera::readGrouping(j);
}

void nlohmann::adl_serializer<tessera::ReplicaGrouping>::to_json(nlohmann::json& j,
                                                                 const tessera::ReplicaGrouping& grouping) {
  j = {{"numReplicas", grouping.numReplicas()},
       {"stride", grouping.stride()},
       {"groupSize", grouping.groupSize()}};
}
