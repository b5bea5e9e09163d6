#include "tessera/config_notes.hpp"

#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tessera {

std::string noteId(NoteCode code) { return fmt::format("tessera.note.{}", static_cast<int>(code)); }

std::string ConfigNote::text() const { return fmt::format("[{}] {}: {}", noteId(code), path, message); }

std::vector<ConfigNote> configNotes(const RunConfig& config) {
  std::vector<ConfigNote> notes;
  const OptimizerConfig& optimizer = config.optimizer;
  const bool sgd = optimizer.type == OptimizerType::Sgd;
  const bool masterWeights = sgd ? optimizer.sgd.masterWeights : optimizer.adam.masterWeights;
  const double lossScaling = sgd ? optimizer.sgd.lossScaling : optimizer.adam.lossScaling;
  const bool automatic = config.sessionOptions.automaticLossScalingSettings.enabled;
  if (config.model.dtype == DType::Float16 && !masterWeights) {
    // The state kept in half beside the weights, by PopART's names.
    std::vector<std::string> halves;
    const auto add = [&halves](std::string_view name, DType dtype) {
      if (dtype == DType::Float16) halves.push_back(fmt::format("{} float16", name));
    };
    if (sgd) {
      add("accl1Type", optimizer.sgd.accl1Type);
      add("accumType", optimizer.sgd.accumType);
    } else {
      add("accl1Type", optimizer.adam.accl1Type);
      add("accl2Type", optimizer.adam.accl2Type);
      add("accumType", optimizer.adam.accumType);
    }
    const std::string state = halves.empty()
                                  ? std::string("; the rest of the optimizer state is float32")
                                  : fmt::format(
                                        ", and {} keep(s) the optimizer state in half too, so no copy of the "
                                        "model is float32",
                                        fmt::join(halves, ", "));
    notes.push_back(
        {NoteCode::Float16WeightsWithoutMasterWeights, "/optimizer/masterWeights",
         fmt::format("masterWeights is false on a float16 model: the {} update writes the float16 weights "
                     "directly, and an update below half a float16 ulp of a weight (2^-11 of its value) is "
                     "lost{}; set masterWeights to true to keep float32 master weights as optimizer state",
                     toString(optimizer.type), state)});
  }
  if (config.model.dtype == DType::Float32 && (lossScaling != 1.0 || automatic)) {
    const std::string what =
        automatic ? fmt::format("automatic loss scaling is enabled (initial scale {})", lossScaling)
                  : fmt::format("lossScaling is {}", lossScaling);
    notes.push_back(
        {NoteCode::LossScalingWithoutFloat16,
         automatic ? "/sessionOptions/automaticLossScalingSettings/enabled" : "/optimizer/lossScaling",
         fmt::format("{} on a float32 model: it runs as asked, but float32 gradients do not "
                     "underflow where float16 ones would, so the scale only costs a "
                     "multiplication and a division per gradient{}; set /model/dtype to "
                     "\"float16\", or {}",
                     what, automatic ? " and the overflow checks" : "",
                     automatic ? "automaticLossScalingSettings/enabled to false and lossScaling to 1"
                               : "lossScaling to 1")});
  }
  if (config.sessionOptions.virtualGraphMode == VirtualGraphMode::Auto && config.device.ipusPerReplica == 1) {
    // PopART warns the same: Auto with one IPU creates no virtual graphs.
    notes.push_back({NoteCode::AutoVirtualGraphsOnOneIpu, "/sessionOptions/virtualGraphMode",
                     "virtualGraphMode is Auto but /device/ipusPerReplica is 1, so every op runs on IPU 0 as with "
                     "virtualGraphMode Off; set ipusPerReplica to the IPUs a replica should span (tessera launch "
                     "--ipus-per-replica sets it too), or virtualGraphMode to Off"});
  }
  return notes;
}

}  // namespace tessera
