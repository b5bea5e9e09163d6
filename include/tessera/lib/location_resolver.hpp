// The one place a tensor's location is decided. Every category goes through
// the same code, in this order:
//   1. tensorLocationSettingsOverride[name], verbatim;
//   2. else the category's TensorLocationSettings, then
//      - OffChip with elements < minElementsForOffChip -> OnChip
//        (not for accumulators);
//      - RTS On for an activation -> Off (activations are never sharded);
//      - RTS On with elements < minElementsForReplicatedTensorSharding -> Off
//        (not for accumulators);
//      - RTS On with sharding domain type None -> Off;
//      - RTS On without local replication (local factor <= 1) -> Off.
// Thresholds compare with a strict "<": a tensor of exactly 8192 elements is
// sharded by default.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/lib/session_options.hpp"
#include "tessera/lib/tensor_location.hpp"

namespace tessera {

struct TensorInfo {
  std::string name;
  TensorCategory category = TensorCategory::Activation;
  int64_t elements = 0;
};

// A part of the requested location that was not applied.
struct LocationDowngrade {
  std::string setting;    // JSON path of the request, e.g. ".../location/replicatedTensorSharding"
  std::string requested;  // "On"
  std::string applied;    // "Off"
  std::string why;        // "100 elements < minElementsForReplicatedTensorSharding (8192)"
};

struct ResolvedLocation {
  TensorLocation location;
  // JSON path of the setting that decided the location, e.g.
  // "/sessionOptions/tensorLocationSettingsOverride/W1" or
  // "/sessionOptions/weightTensorLocationSettings/location".
  std::string decidedBy;
  std::vector<LocationDowngrade> downgrades;

  // decidedBy, followed by each downgrade: "<decidedBy>; replicatedTensorSharding
  // On -> Off: 100 elements < .../minElementsForReplicatedTensorSharding (8192)".
  std::string reason() const;
};

ResolvedLocation resolveTensorLocation(const SessionOptions& options, const TensorInfo& tensor);

}  // namespace tessera
