#include "tessera/lib/location_resolver.hpp"

#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "option_paths.hpp"

namespace tessera {
namespace {

// Called for every tensor of a graph: strings are built only for the result,
// and only when a downgrade happens.
void addDowngrade(ResolvedLocation& result, std::string_view field, std::string_view requested,
                  std::string_view applied, std::string why) {
  LocationDowngrade& downgrade = result.downgrades.emplace_back();
  downgrade.setting.reserve(result.decidedBy.size() + 1 + field.size());
  downgrade.setting += result.decidedBy;
  downgrade.setting += '/';
  downgrade.setting += field;
  downgrade.requested = requested;
  downgrade.applied = applied;
  downgrade.why = std::move(why);
}

std::string belowThreshold(int64_t elements, std::string_view threshold, int64_t minimum) {
  return fmt::format("{} element{} < {} ({})", elements, elements == 1 ? "" : "s", threshold, minimum);
}

// Why a sharded location cannot stay sharded, or "" when it can.
std::string rtsBlocker(const SessionOptions& options, const TensorLocationSettings& settings,
                       const TensorInfo& tensor) {
  if (tensor.category == TensorCategory::Activation) return "activations are never sharded";
  if (tensor.category != TensorCategory::Accumulator &&
      tensor.elements < settings.minElementsForReplicatedTensorSharding) {
    return belowThreshold(tensor.elements, "minElementsForReplicatedTensorSharding",
                          settings.minElementsForReplicatedTensorSharding);
  }
  if (settings.location.shardingDomain.type == CommGroupType::None) {
    return "shardingDomain type None keeps a full copy on every replica";
  }
  if (options.getLocalReplicationFactor() <= 1) {
    if (!options.enableReplicatedGraphs) return "no local replication (enableReplicatedGraphs is false)";
    return fmt::format("no local replication (replicatedGraphCount {})", options.replicatedGraphCount);
  }
  return {};
}

}  // namespace

std::string ResolvedLocation::reason() const {
  std::string out = decidedBy;
  for (const LocationDowngrade& downgrade : downgrades) {
    const std::string_view setting = downgrade.setting;
    const std::string_view field = setting.substr(setting.rfind('/') + 1);
    out += fmt::format("; {} {} -> {}: {}", field, downgrade.requested, downgrade.applied, downgrade.why);
  }
  return out;
}

ResolvedLocation resolveTensorLocation(const SessionOptions& options, const TensorInfo& tensor) {
  ResolvedLocation result;
  const auto& overrides = options.tensorLocationSettingsOverride;
  if (const auto found = overrides.find(tensor.name); found != overrides.end()) {
    result.location = found->second;
    result.decidedBy = detail::overridePath(tensor.name);
    return result;
  }

  const TensorLocationSettings& settings = options.locationSettings(tensor.category);
  result.location = settings.location;
  result.decidedBy = detail::categoryLocationPath(tensor.category);
  TensorLocation& location = result.location;
  // As in PopART, accumulators skip both size thresholds.
  const bool thresholded = tensor.category != TensorCategory::Accumulator;

  if (location.storage == TensorStorage::OffChip && thresholded &&
      tensor.elements < settings.minElementsForOffChip) {
    location.storage = TensorStorage::OnChip;
    addDowngrade(result, "storage", "OffChip", "OnChip",
                 belowThreshold(tensor.elements, "minElementsForOffChip", settings.minElementsForOffChip));
  }
  if (location.replicatedTensorSharding == ReplicatedTensorSharding::On) {
    std::string why = rtsBlocker(options, settings, tensor);
    if (!why.empty()) {
      location.replicatedTensorSharding = ReplicatedTensorSharding::Off;
      addDowngrade(result, "replicatedTensorSharding", "On", "Off", std::move(why));
    }
  }
  return result;
}

}  // namespace tessera
