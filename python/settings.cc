// PopART's settings objects: DeviceManager and its devices, the optimizers,
// DataFlow with AnchorReturnType, InputShapeInfo with TensorInfo; and the
// datasets the CLI trains on (loadDataset), for the samples.
//
// What PopART's Python API takes as dicts is turned into the JSON the C++
// readers take (the device spec, the optimizer section), so that the checks,
// defaults and error ids are the C++ ones.
#include "bindings.hpp"  // first: it declares an opaque type before pybind11/stl.h

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "settings.hpp"
#include "tessera/app/dataset.hpp"
#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/optimizers/optimizer_options.hpp"

namespace tessera::python {

namespace {

// ----- Devices -----

// PopART's device keys that DeviceSpec spells otherwise.
constexpr std::pair<std::string_view, std::string_view> kDeviceKeys[] = {{"tilesPerIPU", "tilesPerIpu"}};

DeviceInfo makeDeviceInfo(const py::dict& options) {
  nlohmann::json spec = toJson(options, "/deviceInfo");
  DeviceInfo info;
  if (auto found = spec.find("numIPUs"); found != spec.end()) {
    if (!found->is_number_integer() || found->get<int64_t>() < 1) {
      throw ConfigError(ErrorCode::InvalidDeviceSpec, "/deviceInfo/numIPUs",
                        fmt::format("{} is not a positive number of processors", found->dump()));
    }
    info.numIpus = found->get<int64_t>();
    spec.erase(found);
  }
  for (const auto& [popart, own] : kDeviceKeys) {
    if (auto found = spec.find(popart); found != spec.end()) {
      spec[std::string(own)] = *found;
      spec.erase(std::string(popart));
    }
  }
  from_json(spec, info.spec);
  return info;
}

struct DeviceManager {};

// ----- Optimizers -----

// PopART's optimizer keys and the optimizer section's.
constexpr std::pair<std::string_view, std::string_view> kOptimizerKeys[] = {
    {"defaultLearningRate", "learningRate"},
    {"defaultMomentum", "momentum"},
    {"defaultDampening", "dampening"},
    {"defaultWeightDecay", "weightDecay"},
    {"defaultBeta1", "beta1"},
    {"defaultBeta2", "beta2"},
    {"defaultEps", "eps"},
    {"lossScaling", "lossScaling"},
    {"nesterov", "nesterov"},
};

// {"defaultLearningRate": (0.05, True), ...} as the optimizer section of
// `type`: each value is PopART's (value, isConst) pair or a plain value
// (tessera changes any value between steps without recompiling, so isConst
// is not needed). Keys that PopART does not have are passed on under their
// own name: the optimizer section's keys work too, others are errors.
OptimizerConfig readOptimizer(std::string_view type, const py::dict& values, nlohmann::json extra = {}) {
  nlohmann::json section = nlohmann::json::object();
  section["type"] = type;
  for (const auto& [key, value] : values) {
    const auto popart = py::str(key).cast<std::string>();
    std::string name = popart;
    for (const auto& [from, to] : kOptimizerKeys) {
      if (popart == from) name = to;
    }
    py::handle given = value;
    if (py::isinstance<py::tuple>(value) && py::len(value) == 2) given = value.cast<py::tuple>()[0];
    section[name] = toJson(given, "/optimizer/" + popart);
  }
  if (extra.is_object()) section.update(extra);
  OptimizerConfig config;
  from_json(section, config);
  return config;
}

// ----- Data flow -----

AnchorReturnType makeAnchorReturnType(const std::string& id, int64_t returnPeriod, TileSet tileSet,
                                      ExchangeStrategy exchangeStrategy) {
  if (id == "EveryN" && returnPeriod < 1) {
    throw ConfigError(ErrorCode::InvalidAnchorReturnType, "/dataFlow/anchors",
                      fmt::format("AnchorReturnType(\"EveryN\", {}): the return period must be >= 1 and "
                                  "divide batchesPerStep",
                                  returnPeriod));
  }
  return AnchorReturnType::fromName(id, returnPeriod, tileSet, exchangeStrategy);
}

DataFlow makeDataFlow(int64_t batchesPerStep, const std::map<std::string, AnchorReturnType>& anchors) {
  DataFlow flow{batchesPerStep, {anchors.begin(), anchors.end()}};
  validate(flow);
  return flow;
}

struct Sgd : PyOptimizer {};
struct ConstSgd : Sgd {};
struct Adam : PyOptimizer {};

enum class AdamMode { Adam, AdamNoBias };
enum class WeightDecayMode { Decay, L2Regularization };

// A split's images [count, rows, cols] (float32) and labels [count] (int32).
py::tuple splitArrays(DatasetSplit&& split) {
  // Each capsule owns its vector from the moment it exists (release() only
  // after it was made), so nothing leaks if a later constructor throws.
  auto imagesOwner = std::make_unique<std::vector<float>>(std::move(split.images));
  auto labelsOwner = std::make_unique<std::vector<int32_t>>(std::move(split.labels));
  const std::vector<float>* images = imagesOwner.get();
  const std::vector<int32_t>* labels = labelsOwner.get();
  py::capsule ownImages(images, [](void* p) { delete static_cast<std::vector<float>*>(p); });
  static_cast<void>(imagesOwner.release());
  py::capsule ownLabels(labels, [](void* p) { delete static_cast<std::vector<int32_t>*>(p); });
  static_cast<void>(labelsOwner.release());
  return py::make_tuple(py::array_t<float>({split.count, split.rows, split.cols}, images->data(), ownImages),
                        py::array_t<int32_t>(std::vector<py::ssize_t>{static_cast<py::ssize_t>(split.count)}, labels->data(), ownLabels));
}

}  // namespace

void bindDatasets(py::module_& module) {
  module.def(
      "loadDataset",
      [](const std::string& dataset, const std::string& path, int64_t limitTrainSamples, int64_t limitTestSamples,
         int64_t seed) {
        DataConfig config;
        const auto kind = enumFromString<DatasetKind>(dataset);
        if (!kind || *kind == DatasetKind::Tensors) {
          // The run config's spelling; an old one ("fashion-mnist") names the new.
          const auto folded = enumFromFoldedString<DatasetKind>(dataset);
          const std::string hint = folded && *folded != DatasetKind::Tensors
                                       ? fmt::format(" (did you mean \"{}\"?)", toString(*folded))
                                       : std::string();
          throw ConfigError(ErrorCode::InvalidEnumValue, "dataset",
                            fmt::format("\"{}\"; expected \"FashionMnist\", \"Mnist\" or \"Synthetic\"{}",
                                        boundedText(dataset), hint));
        }
        config.dataset = *kind;
        config.path = path;
        config.limitTrainSamples = limitTrainSamples;
        config.limitTestSamples = limitTestSamples;
        config.seed = seed;
        Dataset data = loadDataset(config);
        py::dict result;
        result["train"] = splitArrays(std::move(data.train));
        result["test"] = splitArrays(std::move(data.test));
        result["source"] = data.source;
        result["notice"] = data.notice;
        return result;
      },
      py::arg("dataset") = "FashionMnist", py::arg("path") = "", py::arg("limitTrainSamples") = 0,
      py::arg("limitTestSamples") = 0, py::arg("seed") = 0,
      "The dataset the CLI's run configs train on (tessera/app/dataset.hpp): a dict with 'train' and 'test' "
      "(images [N, 28, 28] float32 in [0, 1], labels [N] int32), 'source' and 'notice' (non-empty when the "
      "synthetic stand-in replaced a dataset that is not installed).");
}

void bindSettings(py::module_& module) {
  py::class_<DeviceInfo>(module, "DeviceInfo", "A simulated device for a session (tessera/simdevice/device_spec.hpp).")
      .def_property_readonly("numIpus",
                             [](const DeviceInfo& info) -> py::object {
                               return info.numIpus ? py::cast(*info.numIpus) : py::none();
                             })
      .def("__repr__", [](const DeviceInfo& info) {
        nlohmann::json spec;
        to_json(spec, info.spec);
        return "DeviceInfo(" + spec.dump() + ")";
      });

  py::class_<DeviceManager>(module, "DeviceManager", "PopART's DeviceManager: makes simulated devices.")
      .def(py::init<>())
      .def_static(
          "createSimDevice", &makeDeviceInfo, py::arg("options") = py::dict(),
          "A simulated device: the DeviceSpec fields as keys (tilesPerIpu, bytesPerTile, ...; PopART's "
          "tilesPerIPU too), and numIPUs, which must be the session's replicas.")
      .def_static("createIpuModelDevice", &makeDeviceInfo, py::arg("options") = py::dict(),
                  "The same as createSimDevice, for ported scripts.");

  py::class_<PyOptimizer>(module, "Optimizer", "An optimizer: the run config's optimizer section.")
      .def_property_readonly("learningRate", [](const PyOptimizer& o) { return o.config.learningRate(); })
      .def("__repr__", [](const PyOptimizer& o) {
        nlohmann::json section;
        to_json(section, o.config);
        return section.dump();
      });
  py::class_<Sgd, PyOptimizer>(module, "SGD", "PopART's SGD.")
      .def(py::init([](const py::dict& values) { return Sgd{{readOptimizer(toString(OptimizerType::Sgd), values)}}; }),
           py::arg("values"),
           "SGD from PopART's keys: defaultLearningRate, defaultMomentum, defaultDampening, "
           "defaultWeightDecay, "
           "lossScaling, nesterov; each a (value, isConst) pair or a value.");
  py::class_<ConstSgd, Sgd>(module, "ConstSGD", "PopART's ConstSGD.")
      .def(py::init([](const py::object& learningRate, const py::object& weightDecay,
                       const py::object& lossScaling) {
             py::dict values;
             values["defaultLearningRate"] = learningRate;
             if (!weightDecay.is_none()) values["defaultWeightDecay"] = weightDecay;
             if (!lossScaling.is_none()) values["lossScaling"] = lossScaling;
             return ConstSgd{{{readOptimizer(toString(OptimizerType::Sgd), values)}}};
           }),
           py::arg("learning_rate"), py::arg("weight_decay") = py::none(),
           py::arg("loss_scaling") = py::none());

  py::enum_<AdamMode>(module, "AdamMode", "PopART's Adam modes that tessera has.")
      .value("Adam", AdamMode::Adam)
      .value("AdamNoBias", AdamMode::AdamNoBias);
  py::enum_<WeightDecayMode>(module, "WeightDecayMode",
                             "Decay: decoupled (AdamW); L2Regularization: added to "
                             "the gradient.")
      .value("Decay", WeightDecayMode::Decay)
      .value("L2Regularization", WeightDecayMode::L2Regularization);
  py::class_<Adam, PyOptimizer>(module, "Adam", "PopART's Adam.")
      .def(py::init([](const py::dict& values, AdamMode mode, WeightDecayMode decay) {
             const std::string_view type = decay == WeightDecayMode::Decay ? toString(OptimizerType::AdamW) : toString(OptimizerType::Adam);
             return Adam{{readOptimizer(type, values, {{"biasCorrection", mode == AdamMode::Adam}})}};
           }),
           py::arg("values"), py::arg("mode") = AdamMode::Adam,
           py::arg("weight_decay_mode") = WeightDecayMode::Decay,
           "Adam from PopART's keys: defaultLearningRate, defaultBeta1, defaultBeta2, defaultEps, "
           "defaultWeightDecay, lossScaling. PopART's defaults: mode Adam (bias correction), weight decay "
           "mode Decay (AdamW).");

  bindEnum<ExchangeStrategy>(module,
                             "When a host stream's transfers run: JustInTime, OverlapInnerLoop, OverlapLoops "
                             "(OverlapStep is not supported, as in PopART).");
  py::class_<InputSettings>(module, "InputSettings", "The tile set and exchange strategy of an input stream.")
      .def(py::init([](TileSet tileSet, ExchangeStrategy strategy) { return InputSettings{tileSet, strategy}; }),
           py::arg("tileSet") = TileSet::Compute, py::arg("exchangeStrategy") = ExchangeStrategy::JustInTime)
      .def("tileSet", [](const InputSettings& s) { return s.tileSet; })
      .def("exchangeStrategy", [](const InputSettings& s) { return s.exchangeStrategy; });
  py::class_<AnchorReturnType>(module, "AnchorReturnType",
                               "Which values of an anchor run() returns: \"All\", \"EveryN\" with a "
                               "return period, \"Final\" or \"Sum\"; and, as in PopART, the tile set and "
                               "exchange strategy of its host stream.")
      .def(py::init(&makeAnchorReturnType), py::arg("id"), py::arg("returnPeriod") = 0,
           py::arg("tileSet") = TileSet::Compute, py::arg("exchangeStrategy") = ExchangeStrategy::JustInTime)
      .def(py::init([](const std::string& id, TileSet tileSet, ExchangeStrategy strategy) {
             return makeAnchorReturnType(id, 0, tileSet, strategy);
           }),
           py::arg("id"), py::arg("tileSet"), py::arg("exchangeStrategy"))
      .def("tileSet", [](const AnchorReturnType& a) { return a.tileSet; })
      .def("exchangeStrategy", [](const AnchorReturnType& a) { return a.exchangeStrategy; })
      .def("id", [](const AnchorReturnType& a) { return std::string(toString(a.id)); })
      .def("rp", [](const AnchorReturnType& a) { return a.returnPeriod; });
  py::class_<DataFlow>(module, "DataFlow", "Batches per step and the anchors run() returns.")
      .def(py::init(&makeDataFlow), py::arg("batchesPerStep"), py::arg("anchorTensors"))
      .def("batchesPerStep", [](const DataFlow& d) { return d.batchesPerStep; })
      .def("anchors", [](const DataFlow& d) {
        std::vector<std::string> names;
        for (const auto& [name, type] : d.anchors) names.push_back(name);
        return names;
      });

  py::class_<TensorInfo>(module, "TensorInfo",
                         "An ONNX element type (PopART's name: \"FLOAT\", ...) and a shape.")
      .def(py::init([](std::string dtype, Shape shape) {
             return TensorInfo{std::move(dtype), std::move(shape)};
           }),
           py::arg("dtype"), py::arg("shape"))
      .def("data_type", [](const TensorInfo& t) { return t.dtype; })
      .def("shape", [](const TensorInfo& t) { return t.shape; });
  py::class_<InputShapeInfo>(
      module, "InputShapeInfo",
      "Shapes of the model's inputs (per replica and micro-batch), which bind its symbolic "
      "dimensions.")
      .def(py::init<>())
      .def(
          "add",
          [](InputShapeInfo& s, const std::string& name, const TensorInfo& info) { s.inputs[name] = info; },
          py::arg("name"), py::arg("info"))
      .def(
          "add",
          [](InputShapeInfo& s, const std::string& name, const TensorInfo& info, const InputSettings& settings) {
            s.inputs[name] = info;
            s.settings[name] = settings;
          },
          py::arg("name"), py::arg("info"), py::arg("settings"),
          "The input's shape and its InputSettings (PopART's addInputTensor(info, settings)).");
}

}  // namespace tessera::python
