// JSON of the core's option types: to_json / from_json in namespace tessera,
// found by nlohmann::json through argument-dependent lookup:
//
//   nlohmann::json j = options;                  // the canonical dump
//   auto options = j.get<tessera::SessionOptions>();   // strict reading
//
// The dump has every field, keys sorted, enums as their names, so
// from_json(to_json(x)) == x. Reading is strict: an unknown key, a wrong type,
// a float where an integer belongs, a number outside the field's range or a
// string that names no enumerator is a ConfigError whose subject is the JSON
// pointer of the value within `j` ("" for `j` itself). Missing keys take the
// C++ default; from_json starts from a default-constructed value.
//
// Types of the other folders follow the same conventions and declare their
// JSON beside them: the run config and its sections in
// tessera/app/run_config.hpp, the optimizer options in
// tessera/optimizers/optimizer_options.hpp, the device spec in tessera/simdevice/device_spec.hpp.
//
// Include <nlohmann/json.hpp> to use these; this header only declares them.
#pragma once

#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "tessera/lib/replica_grouping.hpp"
#include "tessera/lib/session_options.hpp"
#include "tessera/lib/shard_layout.hpp"
#include "tessera/lib/tensor_location.hpp"

namespace tessera {

// Parses one JSON document strictly: a syntax error, trailing characters or
// invalid UTF-8 is ConfigError(JsonSyntax) with subject "SOURCE:LINE:COLUMN";
// a key that appears twice in an object is DuplicateKey at its JSON pointer;
// nesting deeper than 64 or a text over 64 MiB is DocumentLimit. `source`
// names the text in errors (a file name; may be empty).
nlohmann::json parseJsonDocument(std::string_view text, std::string_view source);

// `token` as one JSON pointer segment (RFC 6901: "~" -> "~0", "/" -> "~1"),
// e.g. a tensor name under /sessionOptions/tensorLocationSettingsOverride.
std::string jsonPointerToken(std::string_view token);

// Enums, as their names ("OnChip"); reading an unknown name is
// InvalidEnumValue.
void to_json(nlohmann::json& j, TensorStorage value);
void from_json(const nlohmann::json& j, TensorStorage& value);
void to_json(nlohmann::json& j, TileSet value);
void from_json(const nlohmann::json& j, TileSet& value);
void to_json(nlohmann::json& j, ReplicatedTensorSharding value);
void from_json(const nlohmann::json& j, ReplicatedTensorSharding& value);
void to_json(nlohmann::json& j, CommGroupType value);
void from_json(const nlohmann::json& j, CommGroupType& value);
void to_json(nlohmann::json& j, TensorCategory value);
void from_json(const nlohmann::json& j, TensorCategory& value);
void to_json(nlohmann::json& j, ReductionType value);
void from_json(const nlohmann::json& j, ReductionType& value);
void to_json(nlohmann::json& j, MeanReductionStrategy value);
void from_json(const nlohmann::json& j, MeanReductionStrategy& value);
void to_json(nlohmann::json& j, RecomputationType value);
void from_json(const nlohmann::json& j, RecomputationType& value);
void to_json(nlohmann::json& j, VirtualGraphMode value);
void from_json(const nlohmann::json& j, VirtualGraphMode& value);
void to_json(nlohmann::json& j, ExecutionPhaseIOSchedule value);
void from_json(const nlohmann::json& j, ExecutionPhaseIOSchedule& value);
void to_json(nlohmann::json& j, ExecutionPhaseSchedule value);
void from_json(const nlohmann::json& j, ExecutionPhaseSchedule& value);

// Option structs.
void to_json(nlohmann::json& j, const CommGroup& value);
void from_json(const nlohmann::json& j, CommGroup& value);
void to_json(nlohmann::json& j, const TensorLocation& value);
void from_json(const nlohmann::json& j, TensorLocation& value);
void to_json(nlohmann::json& j, const TensorLocationSettings& value);
void from_json(const nlohmann::json& j, TensorLocationSettings& value);
void to_json(nlohmann::json& j, const AutomaticLossScalingSettings& value);
void from_json(const nlohmann::json& j, AutomaticLossScalingSettings& value);
void to_json(nlohmann::json& j, const ExecutionPhaseSettings& value);
void from_json(const nlohmann::json& j, ExecutionPhaseSettings& value);
void to_json(nlohmann::json& j, const SessionOptions& value);
void from_json(const nlohmann::json& j, SessionOptions& value);

// {"elements", "shards", "shardElements", "padding", "realElements" (one per
// shard), "version"}; written for reports and checkpoints, never read back
// (a layout is rebuilt from elements and shards).
void to_json(nlohmann::json& j, const ShardLayout& layout);

}  // namespace tessera

// ReplicaGrouping has no default constructor, so its JSON goes through an
// adl_serializer: {"numReplicas": 8, "stride": 2, "groupSize": 2}. Reading
// needs numReplicas; stride defaults to 1 and groupSize to numReplicas (one
// group), as in the constructors. The constructor's checks apply.
template <>
struct nlohmann::adl_serializer<tessera::ReplicaGrouping> {
  static tessera::ReplicaGrouping from_json(const nlohmann::json& j);
  static void to_json(nlohmann::json& j, const tessera::ReplicaGrouping& grouping);
};
