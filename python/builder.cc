// tessera.Builder: PopART's Builder (aiOnnx, aiGraphcore, the annotations)
// over tessera::OnnxBuilder, which checks every node against ONNX's schemas.
#include "bindings.hpp"  // first: it declares an opaque type before pybind11/stl.h

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "tessera/lib/error.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/onnx/onnx_builder.hpp"
#include "tessera/lib/session_options.hpp"
#include "settings.hpp"

namespace tessera::python {
namespace {

constexpr std::string_view kIpuAttribute = "__ipu_number";
constexpr std::string_view kPipelineStageAttribute = "__pipeline_stage";
constexpr std::string_view kExecutionPhaseAttribute = "__execution_phase";
constexpr std::string_view kRecomputeAttribute = "__recompute_output_in_backward_pass";

[[noreturn]] void badArgument(const std::string& subject, const std::string& message) {
  throw OnnxError(ErrorCode::OnnxBuilderInvalid, subject, message);
}

// A Python attribute value as ONNX's: bool and int as INT, float as FLOAT,
// str as STRING, a list or tuple of them as INTS, FLOATS or STRINGS.
OnnxAttribute toAttribute(const py::handle value, const std::string& subject) {
  if (py::isinstance<py::bool_>(value)) return int64_t{value.cast<bool>()};
  if (py::isinstance<py::int_>(value) || (py::hasattr(value, "__index__") && !py::isinstance<py::float_>(value)))
    return py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr())).cast<int64_t>();
  if (py::isinstance<py::float_>(value) || py::hasattr(value, "__float__"))
    return py::float_(py::reinterpret_borrow<py::object>(value)).cast<double>();
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value) || py::isinstance<py::array>(value)) {
    std::vector<OnnxAttribute> items;
    for (const auto& item : value) items.push_back(toAttribute(item, subject));
    bool allInts = true, allNumbers = true, allStrings = true;
    for (const OnnxAttribute& item : items) {
      allInts = allInts && std::holds_alternative<int64_t>(item);
      allNumbers = allNumbers && (std::holds_alternative<int64_t>(item) || std::holds_alternative<double>(item));
      allStrings = allStrings && std::holds_alternative<std::string>(item);
    }
    if (items.empty() || allInts) {
      std::vector<int64_t> ints;
      for (const OnnxAttribute& item : items) ints.push_back(std::get<int64_t>(item));
      return ints;
    }
    if (allNumbers) {
      std::vector<double> floats;
      for (const OnnxAttribute& item : items)
        floats.push_back(std::holds_alternative<int64_t>(item) ? static_cast<double>(std::get<int64_t>(item))
                                                               : std::get<double>(item));
      return floats;
    }
    if (allStrings) {
      std::vector<std::string> strings;
      for (const OnnxAttribute& item : items) strings.push_back(std::get<std::string>(item));
      return strings;
    }
    badArgument(subject, "a list attribute must hold only numbers or only strings");
  }
  badArgument(subject, fmt::format("a {} is no attribute value; give an int, a float, a str or a list of them",
                                   py::type::of(value).attr("__name__").cast<std::string>()));
}

// A numpy array as the values of an initializer.
OnnxTensor toTensor(const py::array& array) {
  static const std::vector<std::pair<char, std::pair<int, const char*>>> kTypes = {
      {'f', {4, "float"}}, {'f', {2, "float16"}}, {'f', {8, "double"}},
      {'i', {4, "int32"}}, {'i', {8, "int64"}},   {'b', {1, "bool"}}};
  const py::dtype dtype = array.dtype();
  std::string name;
  for (const auto& [kind, size] : kTypes)
    if (dtype.kind() == kind && dtype.itemsize() == size.first) name = size.second;
  if (name.empty())
    badArgument("addInitializedInputTensor",
                fmt::format("a numpy array of dtype {} cannot be an initializer; use float32, float16, float64, "
                            "int32, int64 or bool",
                            py::repr(dtype).cast<std::string>()));
  OnnxTensor tensor;
  tensor.dtype = name;
  tensor.shape.assign(array.shape(), array.shape() + array.ndim());
  // Every element as a double, in row-major order, whatever the array's strides.
  const py::array_t<double, py::array::c_style | py::array::forcecast> values(array);
  tensor.values.assign(values.data(), values.data() + values.size());
  return tensor;
}

std::string reductionName(const py::handle reduction) {
  if (py::isinstance<ReductionType>(reduction))
    return std::string(toString(reduction.cast<ReductionType>()));
  if (py::isinstance<py::str>(reduction)) return reduction.cast<std::string>();
  badArgument("reduction", "give a tessera.ReductionType or one of \"Sum\", \"Mean\", \"NoReduction\"");
}

std::vector<std::string> tensorIds(const py::handle ids, const std::string& subject) {
  if (py::isinstance<py::str>(ids)) return {ids.cast<std::string>()};
  if (!(py::isinstance<py::list>(ids) || py::isinstance<py::tuple>(ids)))
    badArgument(subject, "the inputs are a list of tensor ids");
  std::vector<std::string> names;
  for (const auto& id : ids) {
    if (!py::isinstance<py::str>(id)) badArgument(subject, "every input is a tensor id (a str)");
    names.push_back(id.cast<std::string>());
  }
  return names;
}

// An attribute set on every node made inside a `with` block.
struct AttributeScope {
  OnnxBuilder* builder;
  std::string name;
  OnnxAttribute value;
};

// builder.aiOnnx.<op>(args, [debugContext | num_outputs], **attributes).
py::object callOp(OnnxBuilder& builder, const std::string& opType, const py::args& positional,
                  const py::kwargs& keywords) {
  const std::string subject = fmt::format("aiOnnx.{}", opType);
  if (positional.empty()) badArgument(subject, "the first argument is the list of input tensor ids");
  const std::vector<std::string> inputs = tensorIds(positional[0], subject);
  const bool several = builder.hasSeveralOutputs(opType);
  int64_t numOutputs = 0;
  std::string debugName;
  // PopART's methods take num_outputs first for ops of several outputs, and a
  // debug name (debugContext) last; attributes are given by keyword.
  for (std::size_t k = 1; k < positional.size(); ++k) {
    const py::handle item = positional[k];
    if (py::isinstance<py::str>(item)) {
      debugName = item.cast<std::string>();
    } else if (several && k == 1 && py::isinstance<py::int_>(item)) {
      numOutputs = item.cast<int64_t>();
    } else {
      badArgument(subject, fmt::format("positional argument {} is not the debug name{}; give attributes by "
                                       "keyword (e.g. axis=1)",
                                       k, several ? " or num_outputs" : ""));
    }
  }
  OnnxAttributes attributes;
  for (const auto& [key, value] : keywords) {
    const auto name = key.cast<std::string>();
    if (name == "debugContext" || name == "debugPrefix" || name == "debugName") {
      debugName = value.cast<std::string>();
    } else if (name == "num_outputs") {
      numOutputs = value.cast<int64_t>();
    } else {
      attributes[name] = toAttribute(value, fmt::format("{}: attribute {}", subject, name));
    }
  }
  std::vector<std::string> outputs = builder.addNode(opType, inputs, attributes, numOutputs, debugName);
  if (several) return py::cast(outputs);
  return py::cast(outputs.front());
}

struct OnnxOps {
  OnnxBuilder* builder;
  py::object owner;  // keeps the Builder alive
};
struct GraphcoreOps {
  OnnxBuilder* builder;
  py::object owner;
};

void annotate(OnnxBuilder& builder, const py::handle ids, std::string_view name, const OnnxAttribute& value) {
  for (const std::string& id : tensorIds(ids, std::string(name))) builder.setNodeAttribute(id, name, value);
}

}  // namespace

void bindBuilder(py::module_& module) {
  bindEnum<RecomputeType>(module, "PopART's RecomputeType: whether an op's output is kept for the backward pass "
                                  "(Checkpoint) or recomputed there (Recompute).");

  py::class_<AttributeScope>(module, "_AttributeScope", "A `with` block whose nodes carry an annotation.")
      .def("__enter__",
           [](AttributeScope& scope) {
             scope.builder->setScopeAttribute(scope.name, scope.value);
             return &scope;
           })
      .def("__exit__", [](AttributeScope& scope, const py::args&) {
        scope.builder->clearScopeAttribute(scope.name);
        return false;
      });

  py::class_<OnnxOps>(module, "_AiOnnx",
                      "The ops of ONNX's default domain: builder.aiOnnx.matmul([a, b]), "
                      "builder.aiOnnx.softmax([x], axis=1), ... (any op type, any case).")
      .def("__getattr__", [](const OnnxOps& ops, const std::string& name) -> py::object {
        if (name.starts_with("__")) throw py::attribute_error(name);
        const auto type = ops.builder->opType(name);
        if (!type) {
          // Raises tessera.Error naming the nearest op.
          ops.builder->addNode(name, {});
          throw py::attribute_error(name);
        }
        OnnxBuilder* builder = ops.builder;
        const std::string opType = *type;
        return py::cpp_function(
            [builder, opType, owner = ops.owner](const py::args& positional, const py::kwargs& keywords) {
              return callOp(*builder, opType, positional, keywords);
            },
            py::name(name.c_str()));
      });

  py::class_<GraphcoreOps>(module, "_AiGraphcore", "PopART's ops beyond ONNX (losses, gelu), written as standard ONNX nodes.")
      .def(
          "nllloss",
          [](const GraphcoreOps& ops, const py::handle args, const py::handle reduction,
             std::optional<int64_t> ignoreIndex, bool inputIsLogProbability, const std::string& debugContext) {
            const auto inputs = tensorIds(args, "aiGraphcore.nllloss");
            if (inputs.size() != 2) badArgument("aiGraphcore.nllloss", "takes [probabilities, labels]");
            return ops.builder->nllLoss(inputs[0], inputs[1], reductionName(reduction), ignoreIndex,
                                        inputIsLogProbability, debugContext);
          },
          py::arg("args"), py::arg("reduction") = ReductionType::Mean, py::arg("ignoreIndex") = py::none(),
          py::arg("inputIsLogProbability") = false, py::arg("debugContext") = "",
          "Negative log likelihood of the labels under the probabilities (log probabilities when "
          "inputIsLogProbability); reduction Sum, Mean or \"NoReduction\".")
      .def(
          "l1loss",
          [](const GraphcoreOps& ops, const py::handle args, double lambda, const py::handle reduction,
             const std::string& debugContext) {
            const auto inputs = tensorIds(args, "aiGraphcore.l1loss");
            if (inputs.size() != 1) badArgument("aiGraphcore.l1loss", "takes [input]");
            return ops.builder->l1Loss(inputs[0], lambda, reductionName(reduction), debugContext);
          },
          py::arg("args"), py::arg("lambda"), py::arg("reduction") = ReductionType::Mean,
          py::arg("debugContext") = "", "lambda x |input|, summed, averaged over every element, or elementwise.")
      .def(
          "identityloss",
          [](const GraphcoreOps& ops, const py::handle args, const py::handle reduction,
             const std::string& debugContext) {
            const auto inputs = tensorIds(args, "aiGraphcore.identityloss");
            if (inputs.size() != 1) badArgument("aiGraphcore.identityloss", "takes [input]");
            return ops.builder->identityLoss(inputs[0], reductionName(reduction), debugContext);
          },
          py::arg("args"), py::arg("reduction") = ReductionType::Mean, py::arg("debugContext") = "",
          "The input as the loss: summed, averaged over every element, or as it is.")
      .def(
          "gelu",
          [](const GraphcoreOps& ops, const py::handle args, const std::string& debugContext) {
            const auto inputs = tensorIds(args, "aiGraphcore.gelu");
            if (inputs.size() != 1) badArgument("aiGraphcore.gelu", "takes [input]");
            return ops.builder->gelu(inputs[0], debugContext);
          },
          py::arg("args"), py::arg("debugContext") = "", "GELU, x * (1 + erf(x / sqrt 2)) / 2.");

  py::class_<OnnxBuilder>(
      module, "Builder",
      "PopART's Builder: an ONNX model built node by node (tessera/onnx/onnx_builder.hpp). Every node is checked "
      "against ONNX's schema of its op; getModelProto() gives the bytes a TrainingSession or "
      "InferenceSession takes as fnModel.")
      .def(py::init<int64_t>(), py::arg("opsetVersion") = 14)
      .def(
          "addInputTensor",
          [](OnnxBuilder& builder, const py::object& info, const py::object& shape, const std::string& debugContext) {
            if (py::isinstance<TensorInfo>(info)) {
              const auto& tensorInfo = info.cast<const TensorInfo&>();
              const std::string name = shape.is_none() ? debugContext : shape.cast<std::string>();
              return builder.addInputTensor(tensorInfo.dtype, tensorInfo.shape, name);
            }
            if (shape.is_none()) badArgument("addInputTensor", "give a TensorInfo, or a dtype and a shape");
            return builder.addInputTensor(info.cast<std::string>(), shape.cast<Shape>(), debugContext);
          },
          py::arg("tensorInfo"), py::arg("shape") = py::none(), py::arg("debugContext") = "",
          "A graph input: addInputTensor(TensorInfo(\"FLOAT\", [8, 784]), \"x\") or addInputTensor(\"FLOAT\", "
          "[8, 784], \"x\"). Returns its tensor id.")
      .def(
          "addInitializedInputTensor",
          [](OnnxBuilder& builder, const py::array& values, const std::string& debugContext) {
            return builder.addInitializedInputTensor(toTensor(values), debugContext);
          },
          py::arg("initVal"), py::arg("debugContext") = "",
          "An initializer holding the numpy array (a trainable weight once imported). Returns its tensor id.")
      .def("addOutputTensor", &OnnxBuilder::addOutputTensor, py::arg("outputName"))
      .def(
          "getModelProto",
          [](const OnnxBuilder& builder) {
            const std::string bytes = builder.modelProto();
            return py::bytes(bytes);
          },
          "The model as serialized ONNX (a ModelProto ONNX's checker accepts).")
      .def("getTensorShape", &OnnxBuilder::tensorShape, py::arg("id"),
           "The tensor's shape, by ONNX's shape inference.")
      .def(
          "getTensorDtypeString",
          [](const OnnxBuilder& builder, const std::string& id) { return builder.tensorDtype(id); }, py::arg("id"),
          "The tensor's element type, ONNX's name (\"float\", \"int64\", ...).")
      .def_property_readonly(
          "aiOnnx", [](py::object self) { return OnnxOps{&self.cast<OnnxBuilder&>(), self}; },
          "ONNX's ops at the builder's opset.")
      .def_property_readonly(
          "aiGraphcore", [](py::object self) { return GraphcoreOps{&self.cast<OnnxBuilder&>(), self}; },
          "PopART's ops beyond ONNX: nllloss, l1loss, identityloss, gelu.")
      .def(
          "virtualGraph",
          [](OnnxBuilder& builder, const py::object& first, const py::object& ipu) -> py::object {
            if (ipu.is_none())
              return py::cast(AttributeScope{&builder, std::string(kIpuAttribute), first.cast<int64_t>()});
            annotate(builder, first, kIpuAttribute, ipu.cast<int64_t>());
            return py::none();
          },
          py::arg("tensorIds"), py::arg("value") = py::none(), py::keep_alive<0, 1>(),
          "virtualGraph(ids, ipu) sets the IPU (attribute __ipu_number) of the nodes that made the tensors; "
          "`with builder.virtualGraph(ipu):` of every node made inside.")
      .def(
          "pipelineStage",
          [](OnnxBuilder& builder, const py::object& first, const py::object& stage) -> py::object {
            if (stage.is_none())
              return py::cast(
                  AttributeScope{&builder, std::string(kPipelineStageAttribute), first.cast<int64_t>()});
            annotate(builder, first, kPipelineStageAttribute, stage.cast<int64_t>());
            return py::none();
          },
          py::arg("tensorIds"), py::arg("value") = py::none(), py::keep_alive<0, 1>(),
          "pipelineStage(ids, stage) sets the pipeline stage (attribute __pipeline_stage) of the nodes that "
          "made the tensors; `with builder.pipelineStage(stage):` of every node made inside.")
      .def(
          "executionPhase",
          [](OnnxBuilder& builder, const py::object& first, const py::object& phase) -> py::object {
            if (phase.is_none())
              return py::cast(
                  AttributeScope{&builder, std::string(kExecutionPhaseAttribute), first.cast<int64_t>()});
            annotate(builder, first, kExecutionPhaseAttribute, phase.cast<int64_t>());
            return py::none();
          },
          py::arg("tensorIds"), py::arg("value") = py::none(), py::keep_alive<0, 1>(),
          "executionPhase(ids, phase) sets the execution phase (attribute __execution_phase) of the nodes that "
          "made the tensors; `with builder.executionPhase(phase):` of every node made inside.")
      .def(
          "recomputeOutputInBackwardPass",
          [](OnnxBuilder& builder, const py::object& ids, RecomputeType value) {
            if (value == RecomputeType::Recomputed)
              badArgument("recomputeOutputInBackwardPass", "Recomputed is not a value a model may hold; give "
                                                           "Undefined, Checkpoint or Recompute");
            annotate(builder, ids, kRecomputeAttribute, static_cast<int64_t>(value));
          },
          py::arg("tensorIds"), py::arg("value") = RecomputeType::Recompute,
          "Whether the nodes that made the tensors are recomputed in the backward pass (attribute "
          "__recompute_output_in_backward_pass).")
      .def(
          "recomputeOutput",
          [](OnnxBuilder& builder, RecomputeType value) {
            return AttributeScope{&builder, std::string(kRecomputeAttribute), static_cast<int64_t>(value)};
          },
          py::arg("value"), py::keep_alive<0, 1>(),
          "`with builder.recomputeOutput(RecomputeType.Recompute):` annotates every node made inside.");
}

}  // namespace tessera::python
