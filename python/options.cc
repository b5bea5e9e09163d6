// tessera.SessionOptions and what it holds: every field of the C++ structs
// under its C++ (PopART's) name, nested settings writable in place, enums
// with PopART's names. Setting a field never fails, as in C++; validation is
// the C++ validate(), reached through SessionOptions.validate() or a
// session, with the JSON path's error ids.
#include "bindings.hpp"  // first: it declares an opaque type before pybind11/stl.h

#include <deque>
#include <string_view>

#include <pybind11/stl.h>
#include <pybind11/stl_bind.h>

#include "tessera/lib/error.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/lib/loss_scaling.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/lib/session_options.hpp"
#include "tessera/lib/tensor_location.hpp"

namespace tessera::python {

namespace {

// The canonical JSON dump of a value (tessera/lib/json.hpp), as text.
template <class T>
std::string jsonText(const T& value) {
  nlohmann::json j;
  to_json(j, value);
  return j.dump(2);
}

template <class T>
T fromJsonText(const std::string& text) {
  T value;
  from_json(parseJsonDocument(text, "<python>"), value);
  return value;
}

// The docstring of a field: its description in the run config's JSON
// Schema, which the C++ field tables generate, so that help() says what
// the headers and `tessera schema` say. `object` is the schema of the struct.
const char* fieldDoc(const nlohmann::json& object, std::string_view field) {
  static std::deque<std::string> docs;  // pybind11 keeps the pointer
  const auto& properties = object.at("properties");
  const auto found = properties.find(std::string(field));
  if (found == properties.end() || !found->contains("description")) {
    throw InternalError(ErrorCode::Internal, std::string(field),
                        "the run config schema has no description of it");
  }
  return docs.emplace_back(found->at("description").get<std::string>()).c_str();
}

}  // namespace

void bindOptions(py::module_& module) {
  const nlohmann::json schema = runConfigSchema();
  const nlohmann::json& sessionOptions = schema.at("properties").at("sessionOptions");
  const nlohmann::json& locationSettings = sessionOptions.at("properties").at("weightTensorLocationSettings");
  const nlohmann::json& location = locationSettings.at("properties").at("location");
  const nlohmann::json& commGroup = location.at("properties").at("shardingDomain");
  const nlohmann::json& lossScaling = sessionOptions.at("properties").at("automaticLossScalingSettings");
  const nlohmann::json& phaseSettings = sessionOptions.at("properties").at("executionPhaseSettings");

  bindEnum<TensorStorage>(module, "Where a tensor lives: OnChip (SRAM) or OffChip (streaming memory).");
  bindEnum<TileSet>(module, "The tiles that load or hold a tensor: Compute or IO.");
  bindEnum<ReplicatedTensorSharding>(module, "Replicated tensor sharding: Off or On.");
  bindEnum<CommGroupType>(module,
                          "How replicas are grouped. `None` is a Python keyword: reach it as "
                          "CommGroupType.Ungrouped (PopART's Python name) or getattr(CommGroupType, 'None').")
      .value("Ungrouped", CommGroupType::None);
  bindEnum<TensorCategory>(module, "The kinds of tensor that have their own location settings.");
  bindEnum<ReductionType>(module, "How gradients are combined over micro-batches and replicas.");
  bindEnum<MeanReductionStrategy>(module, "How a Mean reduction over micro-batches is computed.");
  bindEnum<RecomputationType>(module,
                              "Which forward ops are recomputed in the backward pass. `None` is a Python "
                              "keyword: reach it as RecomputationType.NoRecompute (PopART's Python name) or "
                              "getattr(RecomputationType, 'None').")
      .value("NoRecompute", RecomputationType::None);
  bindEnum<VirtualGraphMode>(module,
                             "How the ops of a replica are placed on its IPUs: Off, Manual (__ipu_number), Auto or "
                             "ExecutionPhases (ops by execution phase: executionPhaseSettings).");
  bindEnum<ExecutionPhaseIOSchedule>(module, "When a phase's OffChip tensors are loaded: Preload or OnDemand.");
  bindEnum<ExecutionPhaseSchedule>(module,
                                   "The order of the optimizer's steps within a phase: Interleaving, Batch or "
                                   "BatchClusteredIO.");

  py::class_<CommGroup>(module, "CommGroup",
                        "A grouping of replicas by type and group size (PopART's CommGroup).")
      .def(py::init<>())
      .def(py::init<CommGroupType, int64_t>(), py::arg("type"), py::arg("replicaGroupSize"))
      .def_readwrite("type", &CommGroup::type, fieldDoc(commGroup, "type"))
      .def_readwrite("replicaGroupSize", &CommGroup::replicaGroupSize,
                     fieldDoc(commGroup, "replicaGroupSize"))
      .def("toReplicaGrouping", &CommGroup::toReplicaGrouping, py::arg("numReplicas"))
      .def("__eq__", [](const CommGroup& a, const CommGroup& b) { return a == b; })
      .def("__repr__", &CommGroup::str);

  py::class_<TensorLocation>(module, "TensorLocation", "Where one tensor lives (PopART's TensorLocation).")
      .def(py::init<>())
      .def(py::init<TensorStorage>(), py::arg("storage"))
      .def(py::init<TensorStorage, ReplicatedTensorSharding>(), py::arg("storage"),
           py::arg("replicatedTensorSharding"))
      .def(py::init<TensorStorage, ReplicatedTensorSharding, CommGroup>(), py::arg("storage"),
           py::arg("replicatedTensorSharding"), py::arg("shardingDomain"))
      .def(py::init<TensorStorage, TileSet, TileSet>(), py::arg("storage"), py::arg("loadTileSet"),
           py::arg("storageTileSet"))
      .def(py::init<TensorStorage, TileSet, TileSet, ReplicatedTensorSharding>(), py::arg("storage"),
           py::arg("loadTileSet"), py::arg("storageTileSet"), py::arg("replicatedTensorSharding"))
      .def(py::init<TensorStorage, TileSet, TileSet, ReplicatedTensorSharding, CommGroup>(),
           py::arg("storage"), py::arg("loadTileSet"), py::arg("storageTileSet"),
           py::arg("replicatedTensorSharding"), py::arg("shardingDomain"))
      .def_readwrite("storage", &TensorLocation::storage, fieldDoc(location, "storage"))
      .def_readwrite("loadTileSet", &TensorLocation::loadTileSet, fieldDoc(location, "loadTileSet"))
      .def_readwrite("storageTileSet", &TensorLocation::storageTileSet, fieldDoc(location, "storageTileSet"))
      .def_readwrite("replicatedTensorSharding", &TensorLocation::replicatedTensorSharding,
                     fieldDoc(location, "replicatedTensorSharding"))
      .def_readwrite("shardingDomain", &TensorLocation::shardingDomain, fieldDoc(location, "shardingDomain"))
      .def("isRemote", &TensorLocation::isRemote)
      .def("__eq__", [](const TensorLocation& a, const TensorLocation& b) { return a == b; })
      .def("__repr__", &TensorLocation::str);

  py::class_<TensorLocationSettings>(module, "TensorLocationSettings",
                                     "The location of one category of tensors and its thresholds.")
      .def(py::init<>())
      .def(py::init<TensorLocation>(), py::arg("location"))
      .def(py::init<TensorLocation, int64_t>(), py::arg("location"), py::arg("minElementsForOffChip"))
      .def(py::init<TensorLocation, int64_t, int64_t>(), py::arg("location"),
           py::arg("minElementsForOffChip"), py::arg("minElementsForReplicatedTensorSharding"))
      .def(py::init<TensorStorage>(), py::arg("storage"))
      .def(py::init<TensorStorage, int64_t>(), py::arg("storage"), py::arg("minElementsForOffChip"))
      .def(py::init<TensorStorage, int64_t, int64_t>(), py::arg("storage"), py::arg("minElementsForOffChip"),
           py::arg("minElementsForReplicatedTensorSharding"))
      .def_readwrite("location", &TensorLocationSettings::location, fieldDoc(locationSettings, "location"))
      .def_readwrite("minElementsForOffChip", &TensorLocationSettings::minElementsForOffChip,
                     fieldDoc(locationSettings, "minElementsForOffChip"))
      .def_readwrite("minElementsForReplicatedTensorSharding",
                     &TensorLocationSettings::minElementsForReplicatedTensorSharding,
                     fieldDoc(locationSettings, "minElementsForReplicatedTensorSharding"))
      .def("__eq__", [](const TensorLocationSettings& a, const TensorLocationSettings& b) { return a == b; })
      .def("__repr__", &jsonText<TensorLocationSettings>);

  py::class_<AutomaticLossScalingSettings>(module, "AutomaticLossScalingSettings",
                                           "Automatic loss scaling (tessera/lib/loss_scaling.hpp).")
      .def(py::init<>())
      .def_readwrite("enabled", &AutomaticLossScalingSettings::enabled, fieldDoc(lossScaling, "enabled"))
      .def_readwrite("updatePeriod", &AutomaticLossScalingSettings::updatePeriod,
                     fieldDoc(lossScaling, "updatePeriod"))
      .def_readwrite("growthFactor", &AutomaticLossScalingSettings::growthFactor,
                     fieldDoc(lossScaling, "growthFactor"))
      .def_readwrite("backoffFactor", &AutomaticLossScalingSettings::backoffFactor,
                     fieldDoc(lossScaling, "backoffFactor"))
      .def_readwrite("minLossScale", &AutomaticLossScalingSettings::minLossScale,
                     fieldDoc(lossScaling, "minLossScale"))
      .def_readwrite("maxLossScale", &AutomaticLossScalingSettings::maxLossScale,
                     fieldDoc(lossScaling, "maxLossScale"))
      .def("__eq__", [](const AutomaticLossScalingSettings& a,
                        const AutomaticLossScalingSettings& b) { return a == b; })
      .def("__repr__", &jsonText<AutomaticLossScalingSettings>);

  py::class_<ExecutionPhaseSettings>(module, "ExecutionPhaseSettings",
                                     "Phased execution (PopART's ExecutionPhaseSettings).")
      .def(py::init<>())
      .def_readwrite("phases", &ExecutionPhaseSettings::phases, fieldDoc(phaseSettings, "phases"))
      .def_readwrite("stages", &ExecutionPhaseSettings::stages, fieldDoc(phaseSettings, "stages"))
      .def_readwrite("weightIOSchedule", &ExecutionPhaseSettings::weightIOSchedule,
                     fieldDoc(phaseSettings, "weightIOSchedule"))
      .def_readwrite("activationIOSchedule", &ExecutionPhaseSettings::activationIOSchedule,
                     fieldDoc(phaseSettings, "activationIOSchedule"))
      .def_readwrite("optimizerStateIOSchedule", &ExecutionPhaseSettings::optimizerStateIOSchedule,
                     fieldDoc(phaseSettings, "optimizerStateIOSchedule"))
      .def_readwrite("accumulatorIOSchedule", &ExecutionPhaseSettings::accumulatorIOSchedule,
                     fieldDoc(phaseSettings, "accumulatorIOSchedule"))
      .def_readwrite("schedule", &ExecutionPhaseSettings::schedule, fieldDoc(phaseSettings, "schedule"))
      .def("__eq__", [](const ExecutionPhaseSettings& a, const ExecutionPhaseSettings& b) { return a == b; })
      .def("__repr__", &jsonText<ExecutionPhaseSettings>);

  py::bind_map<std::map<std::string, TensorLocation>>(module, "TensorLocationOverrides");

  py::class_<SessionOptions>(
      module, "SessionOptions",
      "Replication, gradient accumulation and tensor locations: PopART's SessionOptions "
      "fields with their names, meanings and defaults (tessera/lib/session_options.hpp). "
      "Setting a field never fails; validate() and the sessions check the rules.")
      .def(py::init<>())
      .def_readwrite("enableReplicatedGraphs", &SessionOptions::enableReplicatedGraphs,
                     fieldDoc(sessionOptions, "enableReplicatedGraphs"))
      .def_readwrite("replicatedGraphCount", &SessionOptions::replicatedGraphCount,
                     fieldDoc(sessionOptions, "replicatedGraphCount"))
      .def_readwrite("enableDistributedReplicatedGraphs", &SessionOptions::enableDistributedReplicatedGraphs,
                     fieldDoc(sessionOptions, "enableDistributedReplicatedGraphs"))
      .def_readwrite("globalReplicationFactor", &SessionOptions::globalReplicationFactor,
                     fieldDoc(sessionOptions, "globalReplicationFactor"))
      .def_readwrite("globalReplicaOffset", &SessionOptions::globalReplicaOffset,
                     fieldDoc(sessionOptions, "globalReplicaOffset"))
      .def_readwrite("enableGradientAccumulation", &SessionOptions::enableGradientAccumulation,
                     fieldDoc(sessionOptions, "enableGradientAccumulation"))
      .def_readwrite("accumulationFactor", &SessionOptions::accumulationFactor,
                     fieldDoc(sessionOptions, "accumulationFactor"))
      .def_readwrite("accumulationAndReplicationReductionType",
                     &SessionOptions::accumulationAndReplicationReductionType,
                     fieldDoc(sessionOptions, "accumulationAndReplicationReductionType"))
      .def_readwrite("meanAccumulationAndReplicationReductionStrategy",
                     &SessionOptions::meanAccumulationAndReplicationReductionStrategy,
                     fieldDoc(sessionOptions, "meanAccumulationAndReplicationReductionStrategy"))
      .def_readwrite("autoRecomputation", &SessionOptions::autoRecomputation,
                     fieldDoc(sessionOptions, "autoRecomputation"))
      .def_readwrite("virtualGraphMode", &SessionOptions::virtualGraphMode,
                     fieldDoc(sessionOptions, "virtualGraphMode"))
      .def_readwrite("enablePipelining", &SessionOptions::enablePipelining,
                     fieldDoc(sessionOptions, "enablePipelining"))
      .def_readwrite("executionPhaseSettings", &SessionOptions::executionPhaseSettings,
                     fieldDoc(sessionOptions, "executionPhaseSettings"))
      .def_readwrite("numIOTiles", &SessionOptions::numIOTiles, fieldDoc(sessionOptions, "numIOTiles"))
      .def_readwrite("activationTensorLocationSettings", &SessionOptions::activationTensorLocationSettings,
                     fieldDoc(sessionOptions, "activationTensorLocationSettings"))
      .def_readwrite("weightTensorLocationSettings", &SessionOptions::weightTensorLocationSettings,
                     fieldDoc(sessionOptions, "weightTensorLocationSettings"))
      .def_readwrite("optimizerStateTensorLocationSettings",
                     &SessionOptions::optimizerStateTensorLocationSettings,
                     fieldDoc(sessionOptions, "optimizerStateTensorLocationSettings"))
      .def_readwrite("accumulatorTensorLocationSettings", &SessionOptions::accumulatorTensorLocationSettings,
                     fieldDoc(sessionOptions, "accumulatorTensorLocationSettings"))
      .def_readwrite("tensorLocationSettingsOverride", &SessionOptions::tensorLocationSettingsOverride,
                     fieldDoc(sessionOptions, "tensorLocationSettingsOverride"))
      .def_readwrite("automaticLossScalingSettings", &SessionOptions::automaticLossScalingSettings,
                     fieldDoc(sessionOptions, "automaticLossScalingSettings"))
      .def("getLocalReplicationFactor", &SessionOptions::getLocalReplicationFactor)
      .def("getGlobalReplicationFactor", &SessionOptions::getGlobalReplicationFactor)
      .def("getGlobalReplicaOffset", &SessionOptions::getGlobalReplicaOffset)
      .def("getAccumulationFactor", &SessionOptions::getAccumulationFactor)
      .def(
          "validate", [](const SessionOptions& options) { validate(options); },
          "Checks every cross-field rule as the JSON path does; raises tessera.Error whose path is under "
          "/sessionOptions.")
      .def("toJson", &jsonText<SessionOptions>, "The options as the run config's sessionOptions JSON.")
      .def_static("fromJson", &fromJsonText<SessionOptions>, py::arg("text"),
                  "Options read from sessionOptions JSON, strictly (unknown keys and bad values are errors).")
      .def("__eq__", [](const SessionOptions& a, const SessionOptions& b) { return a == b; })
      .def("__repr__", &jsonText<SessionOptions>);
}

}  // namespace tessera::python
