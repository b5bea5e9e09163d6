#include "tessera/lib/session_options.hpp"

#include <array>

#include <fmt/format.h>

#include "tessera/lib/error.hpp"
#include "tessera/lib/replica_topology.hpp"

namespace tessera {
namespace {

// One row per TensorCategory, in enumerator order: the member that holds
// its settings and the JSON key that names it.
struct CategorySettings {
  TensorCategory category;
  TensorLocationSettings SessionOptions::*member;
  std::string_view key;
  ExecutionPhaseIOSchedule ExecutionPhaseSettings::*ioSchedule;
};

constexpr std::array kCategorySettings = {
    CategorySettings{TensorCategory::Activation, &SessionOptions::activationTensorLocationSettings,
                     "activationTensorLocationSettings", &ExecutionPhaseSettings::activationIOSchedule},
    CategorySettings{TensorCategory::Weight, &SessionOptions::weightTensorLocationSettings,
                     "weightTensorLocationSettings", &ExecutionPhaseSettings::weightIOSchedule},
    CategorySettings{TensorCategory::OptimizerState, &SessionOptions::optimizerStateTensorLocationSettings,
                     "optimizerStateTensorLocationSettings", &ExecutionPhaseSettings::optimizerStateIOSchedule},
    CategorySettings{TensorCategory::Accumulator, &SessionOptions::accumulatorTensorLocationSettings,
                     "accumulatorTensorLocationSettings", &ExecutionPhaseSettings::accumulatorIOSchedule},
};

static_assert(
    [] {
      for (std::size_t i = 0; i < kCategorySettings.size(); ++i) {
        if (static_cast<std::size_t>(kCategorySettings[i].category) != i) return false;
      }
      return kCategorySettings.size() == EnumNames<TensorCategory>::kNames.size();
    }(),
    "kCategorySettings must list every TensorCategory in enumerator order");

// Out-of-range values (a cast from a bad integer) fall back to the first
// row rather than reading past the table.
const CategorySettings& row(TensorCategory category) noexcept {
  const auto index = static_cast<std::size_t>(category);
  return kCategorySettings[index < kCategorySettings.size() ? index : 0];
}

}  // namespace

int64_t SessionOptions::getLocalReplicationFactor() const noexcept {
  return ReplicaTopology::fromOptions(*this).localReplicas;
}

int64_t SessionOptions::getGlobalReplicationFactor() const noexcept {
  return ReplicaTopology::fromOptions(*this).globalReplicas;
}

int64_t SessionOptions::getGlobalReplicaOffset() const noexcept {
  return ReplicaTopology::fromOptions(*this).replicaOffset;
}

int64_t SessionOptions::getAccumulationFactor() const {
  if (!enableGradientAccumulation && accumulationFactor > 1) {
    throw ConfigError(ErrorCode::AccumulationDisabledButFactor,
                      fmt::format("{}/accumulationFactor", kSessionOptionsPath),
                      fmt::format("accumulationFactor is {} but enableGradientAccumulation is false; set "
                                  "{}/enableGradientAccumulation to true or accumulationFactor to 1",
                                  accumulationFactor, kSessionOptionsPath));
  }
  return accumulationFactor;
}

const TensorLocationSettings& SessionOptions::locationSettings(TensorCategory category) const noexcept {
  return this->*row(category).member;
}

TensorLocationSettings& SessionOptions::locationSettings(TensorCategory category) noexcept {
  return this->*row(category).member;
}

ExecutionPhaseIOSchedule ExecutionPhaseSettings::ioSchedule(TensorCategory category) const noexcept {
  return this->*row(category).ioSchedule;
}

std::string_view SessionOptions::locationSettingsKey(TensorCategory category) noexcept {
  return row(category).key;
}

}  // namespace tessera
