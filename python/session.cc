// PopART's session names over tessera's sessions: PyStepIO, PyWeightsIO,
// TrainingSession and InferenceSession over an ONNX model (their settings
// are settings.cc's). Arrays have PopART's shapes, which are the C++
// sessions' host shapes (tessera/sessions/data_flow.hpp).
#include "bindings.hpp"  // first: it declares an opaque type before pybind11/stl.h

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "settings.hpp"
#include "tessera/app/checkpoint.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/simdevice/device_spec.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/optimizers/optimizer_options.hpp"
#include "tessera/sessions/session.hpp"
#include "tessera/lib/session_options.hpp"

namespace tessera::python {

namespace {

// ONNX's element type names as PopART spells them.
std::string onnxDtypeName(const std::string& popart) {
  std::string lower = popart;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower;
}

// The symbolic dimensions of the model's inputs bound from their shapes.
std::map<std::string, int64_t, std::less<>> symbolicDimensions(const std::filesystem::path& model,
                                                               const InputShapeInfo& shapes) {
  std::map<std::string, int64_t, std::less<>> dimensions;
  const OnnxSignature signature = readOnnxSignature(model);
  for (const auto& [inputName, info] : shapes.inputs) {
    const std::string& name = inputName;  // a structured binding cannot be captured in C++20 by clang 14
    const std::string path = "/inputShapeInfo/" + name;
    const auto input = std::find_if(signature.inputs.begin(), signature.inputs.end(),
                                    [&](const OnnxValueInfo& value) { return value.name == name; });
    if (input == signature.inputs.end()) {
      throw ConfigError(ErrorCode::InvalidModel, path, "the model has no input of that name");
    }
    if (onnxDtypeName(info.dtype) != input->dtype) {
      throw ConfigError(ErrorCode::InvalidModel, path,
                        fmt::format("the model's input is {}, not {}", input->dtype, info.dtype));
    }
    if (info.shape.size() != input->dims.size()) {
      throw ConfigError(
          ErrorCode::InvalidModel, path,
          fmt::format("the model's input has {} dimensions ({}); the shape {} has {}", input->dims.size(),
                      fmt::join(input->dims, ", "), shapeStr(info.shape), info.shape.size()));
    }
    for (size_t axis = 0; axis < info.shape.size(); ++axis) {
      const std::string& dim = input->dims[axis];
      if (dim.empty() || (dim[0] >= '0' && dim[0] <= '9') || dim == "?") continue;
      const auto [bound, inserted] = dimensions.emplace(dim, info.shape[axis]);
      if (!inserted && bound->second != info.shape[axis]) {
        throw ConfigError(ErrorCode::InvalidModel, path,
                          fmt::format("dimension \"{}\" is {} here and {} in another input", dim,
                                      info.shape[axis], bound->second));
      }
    }
  }
  return dimensions;
}

// The model of fnModel (a path, or the bytes of a ModelProto), imported for
// `replicas` replicas with the dimensions of `shapes`.
OnnxModel importModel(const py::object& fnModel, const InputShapeInfo& shapes, int64_t replicas) {
  OnnxImportOptions options;
  options.replicationFactor = replicas;
  options.inputSettings = shapes.settings;
  if (py::isinstance<py::bytes>(fnModel)) {
    const auto bytes = fnModel.cast<std::string>();
    if (!shapes.inputs.empty()) {
      // The signature reader takes a file.
      const auto file =
          std::filesystem::temp_directory_path() /
          fmt::format("tessera-python-{}-{}.onnx", getpid(), reinterpret_cast<uintptr_t>(bytes.data()));
      {
        std::ofstream out(file, std::ios::binary);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      }
      try {
        options.dimensions = symbolicDimensions(file, shapes);
      } catch (...) {
        std::filesystem::remove(file);
        throw;
      }
      std::filesystem::remove(file);
    }
    return importOnnx(std::as_bytes(std::span(bytes.data(), bytes.size())), options, "fnModel");
  }
  const std::filesystem::path path = py::module_::import("os").attr("fspath")(fnModel).cast<std::string>();
  if (!shapes.inputs.empty()) options.dimensions = symbolicDimensions(path, shapes);
  return importOnnx(path, options);
}

// The serialized ModelProto of fnModel: the bytes given, or the file's.
std::string modelSource(const py::object& fnModel) {
  if (py::isinstance<py::bytes>(fnModel)) return fnModel.cast<std::string>();
  const std::filesystem::path path = py::module_::import("os").attr("fspath")(fnModel).cast<std::string>();
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in && !in.eof()) throw IoError(ErrorCode::FileUnreadable, path.string(), "reading the file failed");
  return bytes;
}

// ----- Arrays -----

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

struct PyStepIO {
  py::dict inputs;
  py::dict anchors;
};

struct PyWeightsIO {
  py::dict weights;
};

// Whether the array's elements are T's, in any equivalent dtype (a
// little-endian "<f4" view is float32 like np.float32 itself).
template <class T>
bool isArrayOf(const py::array& array) {
  return py::isinstance<py::array_t<T>>(array);
}

std::string arrayShapeStr(const py::array& array) {
  return shapeStr(Shape(array.shape(), array.shape() + array.ndim()));
}

bool hasShape(const py::array& array, const Shape& shape) {
  return std::equal(array.shape(), array.shape() + array.ndim(), shape.begin(), shape.end());
}

// Copies a host tensor into `target` (float32, or float64 for a float64
// tensor), which must have its shape.
void copyInto(const HostTensor& value, const std::string& name, py::handle target) {
  if (!py::isinstance<py::array>(target)) {
    throw GraphError(
        ErrorCode::DTypeMismatch, name,
        fmt::format("a {} cannot receive the value; give an array (initAnchorArrays() makes one)",
                    py::str(py::type::of(target)).cast<std::string>()));
  }
  auto array = py::reinterpret_borrow<py::array>(target);
  if (!hasShape(array, value.shape)) {
    throw GraphError(ErrorCode::HostShapeMismatch, name,
                     fmt::format("the array has shape {}; the value has shape {}", arrayShapeStr(array),
                                 shapeStr(value.shape)));
  }
  const bool doubles = !value.doubles.empty();
  if (!(doubles ? isArrayOf<double>(array) : isArrayOf<float>(array)) ||
      !(array.flags() & py::array::c_style) || !array.writeable()) {
    throw GraphError(
        ErrorCode::DTypeMismatch, name,
        fmt::format("the array must be a writable C-contiguous {} array (initAnchorArrays() makes "
                    "one); it is {}",
                    doubles ? "float64" : "float32", py::str(array.dtype()).cast<std::string>()));
  }
  if (doubles) {
    std::memcpy(array.mutable_data(), value.doubles.data(), value.doubles.size() * sizeof(double));
  } else {
    std::memcpy(array.mutable_data(), value.data.data(), value.data.size() * sizeof(float));
  }
}

py::array emptyArray(const Shape& shape, bool doubles) {
  if (doubles) return py::array_t<double>(shape);
  return py::array_t<float>(shape);
}

// The step inputs of `io`, viewing the arrays where their layout allows
// (C-contiguous, the stream's dtype) and converting int64 labels to the
// int32 streams they feed. `keep` holds what the spans point into.
struct StepInputs {
  std::vector<StepInput> inputs;
  std::vector<std::string> names;  // what the inputs' names view
  std::vector<py::array> keep;
  std::vector<std::vector<int32_t>> converted;
};

template <class Session>
void readInputs(const Session& session, const std::map<std::string, DType>& streams, const PyStepIO& io,
                StepInputs& out) {
  // Reserved, so that the spans and names of earlier inputs stay valid.
  out.converted.reserve(py::len(io.inputs));
  out.names.reserve(py::len(io.inputs));
  for (const auto& [key, value] : io.inputs) {
    const std::string& name = out.names.emplace_back(py::str(key).cast<std::string>());
    const Shape expected = session.inputHostShape(name);  // GraphError(UnknownStream) for a wrong name
    const auto array = py::array::ensure(value);
    if (!array) {
      throw GraphError(ErrorCode::DTypeMismatch, name,
                       fmt::format("a {} is not an array", py::str(py::type::of(value)).cast<std::string>()));
    }
    if (!hasShape(array, expected)) {
      throw GraphError(ErrorCode::HostShapeMismatch, name,
                       fmt::format("the array has shape {}; the input takes {} ([batchesPerStep, "
                                   "accumulationFactor, replicationFactor, ...shape], a dimension of 1 "
                                   "omitted)",
                                   arrayShapeStr(array), shapeStr(expected)));
    }
    const DType dtype = streams.at(name);
    const std::string given = py::str(array.dtype()).cast<std::string>();
    auto wrongType = [&](std::string_view allowed) {
      return GraphError(
          ErrorCode::DTypeMismatch, name,
          fmt::format("the array is {}; this {} input takes {}", given, toString(dtype), allowed));
    };
    if (dtype == DType::Int32) {
      if (isArrayOf<int32_t>(array)) {
        auto ints = py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(array);
        out.inputs.emplace_back(name, std::span(ints.data(), static_cast<size_t>(ints.size())));
        out.keep.push_back(std::move(ints));
      } else if (isArrayOf<int64_t>(array)) {
        const auto longs = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(array);
        std::vector<int32_t>& ints = out.converted.emplace_back(static_cast<size_t>(longs.size()));
        for (size_t i = 0; i < ints.size(); ++i) {
          const int64_t v = longs.data()[i];
          if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
            throw ConfigError(ErrorCode::OutOfRange, name,
                              fmt::format("element {} is {}, outside the int32 range of the input", i, v));
          }
          ints[i] = static_cast<int32_t>(v);
        }
        out.inputs.emplace_back(name, std::span<const int32_t>(ints));
      } else {
        throw wrongType("int32 or int64 arrays");
      }
    } else if (dtype == DType::Float64) {
      if (!isArrayOf<double>(array)) throw wrongType("float64 arrays");
      auto doubles = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(array);
      out.inputs.emplace_back(name, std::span(doubles.data(), static_cast<size_t>(doubles.size())));
      out.keep.push_back(std::move(doubles));
    } else {
      if (!isArrayOf<float>(array)) throw wrongType("float32 arrays");
      auto floats = FloatArray::ensure(array);
      out.inputs.emplace_back(name, std::span(floats.data(), static_cast<size_t>(floats.size())));
      out.keep.push_back(std::move(floats));
    }
  }
}

// ----- Sessions -----

// A session over an ONNX model, PopART's way: constructed from the model,
// compiled and loaded by prepareDevice(), run with PyStepIO. The weights
// have a host copy, as in PopART: weightsToHost() fills it from the device,
// readWeights() copies it into arrays, writeWeights() writes arrays into it
// and weightsFromHost() writes it to the device.
template <class Session>
class PySession {
 public:
  static constexpr bool kTraining = std::is_same_v<Session, TrainingSession>;

  PySession(const py::object& fnModel, std::string loss, std::optional<PyOptimizer> optimizer,
            DataFlow dataFlow, std::optional<SessionOptions> userOptions,
            std::optional<DeviceInfo> deviceInfo, std::optional<InputShapeInfo> inputShapeInfo)
      : loss_(std::move(loss)), optimizer_(std::move(optimizer)), dataFlow_(std::move(dataFlow)),
        options_(userOptions.value_or(SessionOptions{})), device_(deviceInfo.value_or(DeviceInfo{})) {
    // PopART's device has replicas x IPUs per replica processors.
    if (device_.numIpus) {
      const int64_t local = options_.getLocalReplicationFactor();
      const int64_t perReplica = *device_.numIpus / local;
      if (*device_.numIpus % local != 0 ||
          (device_.spec.ipusPerReplica != 1 && device_.spec.ipusPerReplica != perReplica)) {
        throw ConfigError(
            ErrorCode::InvalidDeviceSpec, "/deviceInfo/numIPUs",
            fmt::format("numIPUs is {} but the options run {} local replica(s) of {} IPU(s) each "
                        "(ipusPerReplica); numIPUs must be replicas x IPUs per replica",
                        *device_.numIpus, local, device_.spec.ipusPerReplica));
      }
      device_.spec.ipusPerReplica = perReplica;
    }
    validate(options_, device_.spec);
    model_ = importModel(fnModel, inputShapeInfo.value_or(InputShapeInfo{}),
                         options_.getGlobalReplicationFactor());
    source_ = modelSource(fnModel);
    initializers_ = model_->weights;
    initializers_.insert(initializers_.end(), model_->state.begin(), model_->state.end());
    for (const std::string& input : model_->inputs) {
      streams_[input] = model_->graph.tensor(model_->graph.find(input)).dtype;
    }
    if constexpr (kTraining)
      static_cast<void>(model_->graph.find(loss_));  // GraphError(UnknownTensor) for a wrong loss name
    for (const auto& [name, type] : dataFlow_.anchors) {
      const TensorNode& node = model_->graph.tensor(model_->graph.find(name));
      anchorShapes_[name] = {node.shape, node.dtype == DType::Float64};
    }
  }

  // Compiles the program and loads it on a new simulated device.
  void prepareDevice() {
    if (!model_) throw notAgain("prepareDevice");
    OnnxModel model = std::move(*model_);
    model_.reset();
    py::gil_scoped_release release;
    if constexpr (kTraining) {
      const TensorId loss = model.graph.find(loss_);
      session_.emplace(std::move(model.graph), loss, makeOptimizer(optimizer_->config), options_,
                       makeSimDevice(device_.spec), dataFlow_);
    } else {
      session_.emplace(std::move(model.graph), dataFlow_, options_, makeSimDevice(device_.spec));
    }
    hostWeights_ = session_->readWeights();
  }

  // The model's weights (as written by writeWeights()) to the device.
  void weightsFromHost() { session().writeWeights(hostWeights_); }
  // The device's weights to the host copy.
  void weightsToHost() { hostWeights_ = session().readWeights(); }

  void readWeights(const PyWeightsIO& io) const {
    for (const auto& [key, target] : io.weights) {
      const auto name = py::str(key).cast<std::string>();
      copyInto(hostWeight(name), name, target);
    }
  }

  void writeWeights(const PyWeightsIO& io) {
    for (const auto& [key, value] : io.weights) {
      const auto name = py::str(key).cast<std::string>();
      HostTensor& weight = hostWeight(name);
      const auto array = FloatArray::ensure(value);
      if (!array || !hasShape(array, weight.shape)) {
        throw GraphError(ErrorCode::HostShapeMismatch, name,
                         fmt::format("the weight has shape {}; the array is not a float array of that shape",
                                     shapeStr(weight.shape)));
      }
      weight.data.assign(array.data(), array.data() + array.size());
    }
  }

  // A dict of arrays, one per anchor, in the shape run() writes them:
  // [batches returned, accumulationFactor, replicationFactor, ...shape], dims
  // of 1 omitted, where the return type gives the batches (All:
  // batchesPerStep, EveryN(n): batchesPerStep / n) and Final and Sum have
  // neither the batch nor the accumulation dimension.
  py::dict initAnchorArrays() const {
    py::dict arrays;
    for (const auto& [name, type] : dataFlow_.anchors) {
      const auto& [shape, doubles] = anchorShapes_.at(name);
      const bool reduced = type.id == AnchorReturnTypeId::Final || type.id == AnchorReturnTypeId::Sum;
      Shape full;
      const int64_t batches = returnedBatches(type, dataFlow_.batchesPerStep);
      if (batches > 1) full.push_back(batches);
      // Only the training loss is returned per micro-batch.
      if (kTraining && !reduced && name == loss_ && options_.getAccumulationFactor() > 1)
        full.push_back(options_.getAccumulationFactor());
      if (options_.getLocalReplicationFactor() > 1) full.push_back(options_.getLocalReplicationFactor());
      full.insert(full.end(), shape.begin(), shape.end());
      arrays[py::str(name)] = emptyArray(full, doubles);
    }
    return arrays;
  }

  void run(const PyStepIO& io) {
    Session& running = session();
    StepInputs inputs;
    readInputs(running, streams_, io, inputs);
    {
      py::gil_scoped_release release;
      running.run(std::span<const StepInput>(inputs.inputs));
    }
    for (const auto& [name, type] : dataFlow_.anchors) {
      if (!io.anchors.contains(name)) continue;
      if constexpr (kTraining) {
        copyInto(name == loss_ ? running.loss() : running.output(name), name, io.anchors[py::str(name)]);
      } else {
        copyInto(running.output(name), name, io.anchors[py::str(name)]);
      }
    }
    // A Ctrl-C that came while the device ran is raised here, at the step
    // boundary, with the step done and its anchors written.
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }

  // A new optimizer between steps: tessera changes the learning rate
  // without recompiling; any other change is refused.
  void updateOptimizerFromHost(const PyOptimizer& optimizer) {
    OptimizerConfig changed = optimizer.config;
    changed.learningRate() = optimizer_->config.learningRate();
    if (!(changed == optimizer_->config)) {
      throw ConfigError(ErrorCode::UnsupportedCombination, "/optimizer",
                        "only the learning rate can change after prepareDevice(); make a new session for "
                        "other changes");
    }
    session().setLearningRate(optimizer.config.learningRate());
    optimizer_->config.learningRate() = optimizer.config.learningRate();
  }

  // The weights and optimizer state in a .safetensors checkpoint
  // (tessera/app/checkpoint.hpp), and back: training continues as if it had
  // never stopped. Loading writes the device; weightsToHost() then updates
  // the host copy.
  void saveCheckpoint(const std::string& path) {
    Session& saving = session();
    py::gil_scoped_release release;
    tessera::saveCheckpoint(saving, path);
  }
  py::dict loadCheckpoint(const std::string& path) {
    Session& loading = session();
    CheckpointLoadReport report;
    {
      py::gil_scoped_release release;
      report = tessera::loadCheckpoint(loading, path);
    }
    py::dict result;
    result["step"] = report.step;
    result["learningRate"] = report.learningRate;
    std::vector<std::string> warnings;
    std::vector<std::string> kinds;
    for (const CheckpointWarning& warning : report.warnings) {
      warnings.push_back(warning.text);
      kinds.emplace_back(toString(warning.kind));
    }
    result["warnings"] = warnings;
    result["warningKinds"] = kinds;
    return result;
  }

  // PopART's modelToHost: the ONNX model the session was made from, with
  // its initializers holding the device's weights (a float16 weight's
  // float32 master where the session keeps one) and BatchNormalization's
  // running statistics (writeOnnx, tessera/onnx/onnx.hpp).
  void modelToHost(const py::object& path) {
    const std::filesystem::path destination =
        py::module_::import("os").attr("fspath")(path).cast<std::string>();
    Session& reading = session();
    py::gil_scoped_release release;
    std::vector<OnnxTensorValues> values;
    values.reserve(initializers_.size());
    for (const std::string& name : initializers_) {
      const std::string master = name + ".master";
      HostTensor value = reading.readVariable(reading.graph().tryFind(master) ? master : name,
                                              RetrievalMode::OnePerGroup);
      values.push_back({name, std::move(value.shape), std::move(value.data)});
    }
    writeOnnx(std::as_bytes(std::span(source_.data(), source_.size())), source_name_, values, destination);
  }

  Session& session() {
    if (!session_) {
      throw ConfigError(ErrorCode::UnsupportedCombination, "session",
                        "the session has no device yet; call prepareDevice() first");
    }
    return *session_;
  }

 private:
  static ConfigError notAgain(std::string_view what) {
    return ConfigError(ErrorCode::UnsupportedCombination, "session",
                       fmt::format("{}() was called already; a session is prepared once", what));
  }

  HostTensor& hostWeight(const std::string& name) {
    session();
    for (auto& [weight, value] : hostWeights_) {
      if (weight == name) return value;
    }
    throw GraphError(ErrorCode::UnknownTensor, name, "the model has no weight of that name");
  }
  const HostTensor& hostWeight(const std::string& name) const {
    return const_cast<PySession*>(this)->hostWeight(name);
  }

  std::string loss_;
  std::optional<PyOptimizer> optimizer_;
  DataFlow dataFlow_;
  SessionOptions options_;
  DeviceInfo device_;
  std::optional<OnnxModel> model_;
  // The serialized model and the initializers that are variables, for modelToHost().
  std::string source_;
  std::string source_name_ = "fnModel";
  std::vector<std::string> initializers_;
  std::map<std::string, DType> streams_;
  std::map<std::string, std::pair<Shape, bool>> anchorShapes_;
  std::optional<Session> session_;
  std::vector<std::pair<std::string, HostTensor>> hostWeights_;
};

using PyTrainingSession = PySession<TrainingSession>;
using PyInferenceSession = PySession<InferenceSession>;

template <class S, class Class>
void bindSessionMethods(Class& bound) {
  bound.def("prepareDevice", &S::prepareDevice, "Compiles the program and loads it on the device.")
      .def("weightsFromHost", &S::weightsFromHost,
           "Writes the host copy of the weights (the model's, or what writeWeights() wrote) to the device.")
      .def("weightsToHost", &S::weightsToHost, "Reads the device's weights into the host copy.")
      .def("readWeights", &S::readWeights, py::arg("weightsIo"),
           "Copies the host copy of the named weights into the PyWeightsIO's arrays.")
      .def("writeWeights", &S::writeWeights, py::arg("weightsIo"),
           "Copies the PyWeightsIO's arrays into the host copy (weightsFromHost() then writes them).")
      .def("initAnchorArrays", &S::initAnchorArrays,
           "A dict of arrays, one per anchor of the DataFlow, in the shape run() fills.")
      .def("run", &S::run, py::arg("stepio"),
           "One step on the PyStepIO's inputs; fills its anchor arrays. The GIL is released while the "
           "device runs.");
}

}  // namespace

void bindSessions(py::module_& module) {
  py::class_<PyStepIO>(module, "PyStepIO",
                       "The inputs (dict of arrays) and anchors (dict of arrays) of a step.")
      .def(py::init([](py::dict inputs, py::dict anchors) {
             return PyStepIO{std::move(inputs), std::move(anchors)};
           }),
           py::arg("inputs"), py::arg("outputs"));
  py::class_<PyWeightsIO>(module, "PyWeightsIO", "Weights by name, as a dict of arrays.")
      .def(py::init([](py::dict weights) { return PyWeightsIO{std::move(weights)}; }), py::arg("weights"));

  py::class_<PyTrainingSession> training(module, "TrainingSession",
                                         "PopART's TrainingSession over an ONNX model with its loss inside.");
  training.def(
      py::init([](const py::object& fnModel, std::string loss, const PyOptimizer& optimizer,
                  DataFlow dataFlow, std::optional<SessionOptions> userOptions,
                  std::optional<DeviceInfo> deviceInfo, std::optional<InputShapeInfo> inputShapeInfo) {
        return std::make_unique<PyTrainingSession>(fnModel, std::move(loss), optimizer, std::move(dataFlow),
                                                   std::move(userOptions), std::move(deviceInfo),
                                                   std::move(inputShapeInfo));
      }),
      py::arg("fnModel"), py::arg("loss"), py::arg("optimizer"), py::arg("dataFlow"),
      py::arg("userOptions") = py::none(), py::arg("deviceInfo") = py::none(),
      py::arg("inputShapeInfo") = py::none(),
      "Imports the model (a path or the bytes of an ONNX ModelProto) for the options' replicas; "
      "`loss` names its scalar loss tensor.");
  bindSessionMethods<PyTrainingSession>(training);
  training
      .def("modelToHost", &PyTrainingSession::modelToHost, py::arg("path"),
           "Writes the ONNX model the session was made from, with the device's weights (float32 master "
           "weights of float16 ones) and BatchNormalization's running statistics in its initializers.")
      .def("updateOptimizerFromHost", &PyTrainingSession::updateOptimizerFromHost, py::arg("optimizer"),
           "A new learning rate from the next step; other changes are refused.")
      .def("saveCheckpoint", &PyTrainingSession::saveCheckpoint, py::arg("path"),
           "Writes the weights, the optimizer state and the step to a .safetensors checkpoint.")
      .def("loadCheckpoint", &PyTrainingSession::loadCheckpoint, py::arg("path"),
           "Restores a checkpoint into the device, so that training continues where it stopped; returns "
           "{'step', 'learningRate', 'warnings', 'warningKinds'}. weightsToHost() then updates the host copy.");

  py::class_<PyInferenceSession> inference(module, "InferenceSession",
                                           "PopART's InferenceSession over an ONNX model.");
  inference.def(
      py::init([](const py::object& fnModel, DataFlow dataFlow, std::optional<SessionOptions> userOptions,
                  std::optional<DeviceInfo> deviceInfo, std::optional<InputShapeInfo> inputShapeInfo) {
        return std::make_unique<PyInferenceSession>(fnModel, std::string(), std::nullopt, std::move(dataFlow),
                                                    std::move(userOptions), std::move(deviceInfo),
                                                    std::move(inputShapeInfo));
      }),
      py::arg("fnModel"), py::arg("dataFlow"), py::arg("userOptions") = py::none(),
      py::arg("deviceInfo") = py::none(), py::arg("inputShapeInfo") = py::none());
  bindSessionMethods<PyInferenceSession>(inference);
}

}  // namespace tessera::python
