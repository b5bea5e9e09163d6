// importOnnx: reads a ModelProto, binds the symbolic dimensions, orders the
// nodes, folds what is known at import and maps every other node onto
// tessera's ops (node_mapping.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>
#include <onnx/version_converter/convert.h>

#include "half.hpp"
#include "importer.hpp"
#include "input_file.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/onnx/onnx.hpp"

namespace tessera {
namespace onnx_import {
namespace {

// Protocol buffers parse at most 2 GiB; a larger file (or a FIFO, a device,
// a folder) is refused before anything is read.
constexpr auto kMaxModelBytes = static_cast<uint64_t>(std::numeric_limits<int>::max());

}  // namespace

std::string readFile(const std::filesystem::path& path) {
  const detail::InputFile file(path.string());
  return file.readAll<std::string>(kMaxModelBytes, [&path](uint64_t size) {
    throw OnnxError(ErrorCode::OnnxTooLarge, path.string(),
                    fmt::format("the file has {} bytes; ONNX models (protocol buffers) hold at most {} bytes",
                                size, kMaxModelBytes));
  });
}

namespace {

// The version of the default domain (ai.onnx) the model imports, if any.
std::optional<int64_t> importedOpset(const onnx::ModelProto& model) {
  std::optional<int64_t> version;
  for (const auto& entry : model.opset_import())
    if (entry.domain().empty() || entry.domain() == "ai.onnx") version = entry.version();
  return version;
}

// A model of an opset before kMinOpset (PyTorch's exports before 1.x, the
// ONNX model zoo's older files) is upgraded to kMinOpset with ONNX's own
// version converter, after ONNX's checker has accepted it and ONNX's shape
// inference has annotated it: the converter expects a valid model, and its
// broadcasting adapters need the shapes. Any complaint is reported with the
// opset.
// OnnxImportOptions::doubleAsFloat: double tensors of the model rewritten as
// float32 before anything reads it.
void doubleToFloat(onnx::TensorProto& tensor) {
  if (tensor.data_type() != onnx::TensorProto::DOUBLE) return;
  std::vector<double> values(tensor.double_data().begin(), tensor.double_data().end());
  if (tensor.has_raw_data()) {
    const std::string& raw = tensor.raw_data();
    values.resize(raw.size() / sizeof(double));
    for (std::size_t k = 0; k < values.size(); ++k)
      std::memcpy(&values[k], raw.data() + k * sizeof(double), sizeof(double));
  }
  tensor.clear_double_data();
  tensor.clear_raw_data();
  tensor.set_data_type(onnx::TensorProto::FLOAT);
  for (double v : values) tensor.add_float_data(static_cast<float>(v));
}

void doublesAsFloats(onnx::ModelProto& model) {
  const auto retype = [](onnx::ValueInfoProto& info) {
    if (info.type().has_tensor_type() && info.type().tensor_type().elem_type() == onnx::TensorProto::DOUBLE)
      info.mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  };
  onnx::GraphProto& graph = *model.mutable_graph();
  for (auto& info : *graph.mutable_input()) retype(info);
  for (auto& info : *graph.mutable_output()) retype(info);
  for (auto& info : *graph.mutable_value_info()) retype(info);
  for (auto& tensor : *graph.mutable_initializer()) doubleToFloat(tensor);
  for (auto& node : *graph.mutable_node()) {
    for (auto& attribute : *node.mutable_attribute()) {
      if (attribute.has_t()) doubleToFloat(*attribute.mutable_t());
      if (node.op_type() == "Cast" && attribute.name() == "to" && attribute.i() == onnx::TensorProto::DOUBLE)
        attribute.set_i(onnx::TensorProto::FLOAT);
    }
  }
}

// The symbolic dimensions bound by the options are made concrete first: the
// converter's broadcasting adapters need every input's dimensions. (With
// doubleAsFloat, the double tensors are rewritten first, whatever the opset.)
onnx::ModelProto upgradeOpset(onnx::ModelProto model, const OnnxImportOptions& options,
                              const std::string& source) {
  if (options.doubleAsFloat) doublesAsFloats(model);
  const std::optional<int64_t> version = importedOpset(model);
  if (!version || *version < 1 || *version >= kMinOpset) return model;
  const auto bind = [&](onnx::ValueInfoProto& info) {
    if (!info.type().has_tensor_type() || !info.type().tensor_type().has_shape()) return;
    for (auto& dim : *info.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim()) {
      if (!dim.has_dim_param()) continue;
      const auto bound = options.dimensions.find(dim.dim_param());
      if (bound != options.dimensions.end() && bound->second >= 1) dim.set_dim_value(bound->second);
    }
  };
  onnx::GraphProto& graph = *model.mutable_graph();
  for (auto& info : *graph.mutable_input()) bind(info);
  for (auto& info : *graph.mutable_output()) bind(info);
  for (auto& info : *graph.mutable_value_info()) bind(info);
  const auto refuse = [&](std::string_view step, std::string_view said) {
    // ONNX's messages span lines ("...\n\n==> Context: ..."): one line here.
    std::string what;
    for (char ch : said) {
      const bool space = ch == '\n' || ch == '\r' || ch == ' ' || ch == '\t';
      if (!space || (!what.empty() && what.back() != ' ')) what += space ? ' ' : ch;
    }
    while (!what.empty() && what.back() == ' ') what.pop_back();
    throwOnnx(ErrorCode::OnnxUnsupportedOpset, source,
              fmt::format("opset {} of the default domain (ai.onnx) is upgraded to opset {} on import, but "
                          "{}: {}; opsets {} to {} are imported as they are",
                          *version, kMinOpset, step, what, kMinOpset, kMaxOpset));
  };
  // ONNX's converter expects a closed graph (it dereferences the producer
  // of every value; its checker does not look for them) and converts no
  // subgraphs: both are refused here, naming what is missing.
  std::unordered_set<std::string> defined;
  for (const auto& input : graph.input()) defined.insert(input.name());
  for (const auto& init : graph.initializer()) defined.insert(init.name());
  for (const auto& node : graph.node())
    for (const auto& output : node.output())
      if (!output.empty()) defined.insert(output);
  for (int k = 0; k < graph.node_size(); ++k) {
    const onnx::NodeProto& node = graph.node(k);
    const std::string subject =
        fmt::format("{}: node {} ({}, opset {})", source,
                    node.name().empty() ? fmt::format("#{}", k) : node.name(), node.op_type(), *version);
    for (const auto& input : node.input())
      if (!input.empty() && !defined.count(input))
        throwOnnx(
            ErrorCode::OnnxInvalidGraph, subject,
            fmt::format("input \"{}\" has no producer: it is neither a graph input, an initializer nor the "
                        "output of a node",
                        input));
    for (const auto& attribute : node.attribute())
      if (attribute.has_g() || attribute.graphs_size() > 0)
        refuse("its subgraphs cannot be upgraded",
               fmt::format("node {} ({}) has the subgraph attribute {}", node.name(), node.op_type(),
                           attribute.name()));
  }
  for (const auto& output : graph.output())
    if (!defined.count(output.name()))
      throwOnnx(ErrorCode::OnnxInvalidGraph, source + ": output " + output.name(),
                "no node produces it, and it is neither a graph input nor an initializer");
  try {
    onnx::checker::check_model(model);
  } catch (const std::exception& e) {
    refuse("ONNX's checker refuses the model", e.what());
  }
  try {
    onnx::shape_inference::InferShapes(model);
  } catch (const std::exception& e) {
    refuse("ONNX's shape inference fails", e.what());
  }
  try {
    return onnx::version_conversion::ConvertVersion(model, static_cast<int>(kMinOpset));
  } catch (const std::exception& e) {
    refuse("ONNX's version converter failed", e.what());
  }
  return model;  // not reached: refuse throws
}

}  // namespace

onnx::ModelProto parseModel(std::string_view bytes, const std::string& source) {
  onnx::ModelProto model;
  if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    throwOnnx(
        ErrorCode::OnnxMalformed, source,
        fmt::format("not an ONNX model: the {} bytes do not parse as a ModelProto (truncated, or another "
                    "kind of file)",
                    bytes.size()));
  if (!model.has_graph() || (model.graph().node_size() == 0 && model.graph().output_size() == 0))
    throwOnnx(ErrorCode::OnnxMalformed, source,
              "not an ONNX model: the file has no graph (a ModelProto with a graph of nodes and outputs is "
              "expected)");
  return model;
}

namespace {

int64_t defaultOpset(const onnx::ModelProto& model, const std::string& source) {
  const std::optional<int64_t> version = importedOpset(model);
  if (!version)
    throwOnnx(ErrorCode::OnnxUnsupportedOpset, source,
              fmt::format(
                  "the model imports no opset of the default domain (ai.onnx); opsets 1 to {} are supported "
                  "(those before {} upgraded on import)",
                  kMaxOpset, kMinOpset));
  if (*version < kMinOpset || *version > kMaxOpset)
    throwOnnx(
        ErrorCode::OnnxUnsupportedOpset, source,
        fmt::format("opset {} of the default domain (ai.onnx) is not supported; opsets 1 to {} are (those "
                    "before {} upgraded on import); export the model with opset_version={}",
                    *version, kMaxOpset, kMinOpset, kMaxOpset));
  return *version;
}

// "float", ..., or the kind of a value that is not a tensor.
std::string valueTypeName(const onnx::ValueInfoProto& info) {
  const auto& type = info.type();
  if (type.has_tensor_type()) return typeName(type.tensor_type().elem_type());
  if (type.has_sequence_type()) return "sequence";
  if (type.has_optional_type()) return "optional";
  if (type.has_map_type()) return "map";
  if (type.has_sparse_tensor_type()) return "sparse_tensor";
  return "undefined";
}

std::vector<std::string> dimsOf(const onnx::ValueInfoProto& info) {
  std::vector<std::string> dims;
  if (!info.type().has_tensor_type() || !info.type().tensor_type().has_shape()) return dims;
  for (const auto& dim : info.type().tensor_type().shape().dim()) {
    if (dim.has_dim_value()) {
      dims.push_back(std::to_string(dim.dim_value()));
    } else if (dim.has_dim_param() && !dim.dim_param().empty()) {
      dims.push_back(dim.dim_param());
    } else {
      dims.push_back("?");
    }
  }
  return dims;
}

}  // namespace

Importer::Importer(const onnx::ModelProto& model, const OnnxImportOptions& options, std::string source)
    // run() reports a replication factor below 1 with the model named.
    : model_(model), options_(options), source_(std::move(source)),
      graph_(std::max<int64_t>(options.replicationFactor, 1)) {}

std::string Importer::nodeSubject(const onnx::NodeProto& node) const {
  const std::string name = node.name().empty() ? fmt::format("#{}", nodeIndex_) : node.name();
  return fmt::format("{}: node {} ({}, opset {})", source_, name, node.op_type(), opset_);
}

OnnxModel Importer::run() {
  if (options_.replicationFactor < 1)
    throwOnnx(ErrorCode::OnnxInvalidGraph, source_,
              fmt::format("replicationFactor is {}; it must be >= 1", options_.replicationFactor));
  if (options_.floatType != DType::Float32 && options_.floatType != DType::Float16)
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, source_,
              fmt::format("floatType is {}; the model's float tensors import as float32 or float16",
                          toString(options_.floatType)));
  opset_ = defaultOpset(model_, source_);
  const auto& g = model_.graph();

  OnnxModel result{Graph(options_.replicationFactor), {}, {}, {}, {}, opset_, {}};
  std::unordered_set<std::string> initializerNames;
  for (const auto& init : g.initializer()) {
    if (!initializerNames.insert(init.name()).second)
      throwOnnx(ErrorCode::OnnxInvalidGraph, source_ + ": initializer " + init.name(),
                "the name is used twice");
    result.initializers.push_back(init.name());
  }
  const std::vector<int> order = topologicalOrder(initializerNames);
  const std::unordered_set<std::string> weightNames = gradientReached(initializerNames);

  for (const auto& init : g.initializer()) {
    const std::string subject = source_ + ": initializer " + init.name();
    Known value = readTensor(init, subject);
    const bool half = value.type == onnx::TensorProto::FLOAT16;
    if ((value.type == onnx::TensorProto::FLOAT || half) && weightNames.count(init.name())) {
      // float16 initializers are float16 Variables holding their halves
      // exactly; float ones follow floatType.
      const std::vector<float> data(value.f.begin(), value.f.end());
      const TensorId id = addSource(OpKind::Variable, init.name(), half ? DType::Float16 : options_.floatType,
                                    value.shape, data, subject);
      values_[init.name()] = Value{std::nullopt, id, value.type};
      result.weights.push_back(init.name());
    } else {
      values_[init.name()] = Value{std::move(value), kNoTensor, init.data_type()};
    }
  }

  for (const auto& input : g.input()) {
    if (initializerNames.count(input.name())) continue;
    if (addInput(input)) result.inputs.push_back(input.name());
  }
  for (const auto& [name, tensor] : options_.constantInputs) {
    if (!values_.count(name))
      throwOnnx(ErrorCode::OnnxInvalidGraph, source_ + ": input " + name,
                "constantInputs names an input the graph does not have");
  }
  for (const auto& [name, settings] : options_.inputSettings) {
    const auto found = values_.find(name);
    if (std::find(result.inputs.begin(), result.inputs.end(), name) == result.inputs.end() ||
        found == values_.end() || found->second.id == kNoTensor) {
      throw GraphError(ErrorCode::InvalidInputSettings, source_ + ": input " + name,
                       fmt::format("inputSettings names no host stream of the graph; its inputs are {}",
                                   fmt::join(result.inputs, ", ")));
    }
    graph_.tensor(found->second.id).inputSettings = settings;
  }

  for (const int n : order) {
    nodeIndex_ = n;
    importNode(g.node(n));
  }

  std::unordered_set<std::string> outputNames;
  for (const auto& output : g.output()) {
    if (!outputNames.insert(output.name()).second)
      throwOnnx(ErrorCode::OnnxInvalidGraph, source_ + ": output " + output.name(),
                "the graph lists the output twice");
    bindOutput(output.name());
    result.outputs.push_back(output.name());
  }
  result.state = state_;
  result.graph = std::move(graph_);
  return result;
}

std::vector<int> Importer::topologicalOrder(const std::unordered_set<std::string>& initializers) {
  const auto& g = model_.graph();
  std::unordered_map<std::string, int> producer;  // value name -> node index
  std::unordered_set<std::string> available(initializers.begin(), initializers.end());
  for (const auto& input : g.input()) available.insert(input.name());
  for (int n = 0; n < g.node_size(); ++n) {
    for (const auto& out : g.node(n).output()) {
      if (out.empty()) continue;
      if (available.count(out) || !producer.emplace(out, n).second)
        throwOnnx(ErrorCode::OnnxInvalidGraph, source_ + ": value " + out,
                  "the value has more than one producer (ONNX graphs assign every value once)");
    }
  }
  // Kahn's algorithm, taking ready nodes in file order.
  std::vector<int> missing(static_cast<std::size_t>(g.node_size()), 0);
  std::unordered_map<std::string, std::vector<int>> consumers;
  for (int n = 0; n < g.node_size(); ++n) {
    nodeIndex_ = n;
    const auto& node = g.node(n);
    if (!node.domain().empty() && node.domain() != "ai.onnx")
      throwOnnx(
          ErrorCode::OnnxUnsupportedOpset, nodeSubject(node),
          fmt::format("domain \"{}\" is not supported; only the default domain (ai.onnx), opsets 1 to {}",
                      node.domain(), kMaxOpset));
    for (const auto& in : node.input()) {
      if (in.empty() || available.count(in)) continue;
      if (!producer.count(in))
        throwOnnx(
            ErrorCode::OnnxInvalidGraph, nodeSubject(node),
            fmt::format("input \"{}\" has no producer: it is neither a graph input, an initializer nor the "
                        "output of a node",
                        in));
      ++missing[static_cast<std::size_t>(n)];
      consumers[in].push_back(n);
    }
  }
  std::set<int> ready;
  for (int n = 0; n < g.node_size(); ++n)
    if (missing[static_cast<std::size_t>(n)] == 0) ready.insert(n);
  std::vector<int> order;
  while (!ready.empty()) {
    const int n = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(n);
    for (const auto& out : g.node(n).output()) {
      const auto it = consumers.find(out);
      if (out.empty() || it == consumers.end()) continue;
      for (int c : it->second)
        if (--missing[static_cast<std::size_t>(c)] == 0) ready.insert(c);
    }
  }
  if (order.size() != static_cast<std::size_t>(g.node_size())) {
    for (int n = 0; n < g.node_size(); ++n) {
      if (missing[static_cast<std::size_t>(n)] == 0) continue;
      nodeIndex_ = n;
      throwOnnx(ErrorCode::OnnxInvalidGraph, nodeSubject(g.node(n)),
                "the node is on a cycle: one of its inputs depends on its own output");
    }
  }
  return order;
}

std::unordered_set<std::string> Importer::gradientReached(
    const std::unordered_set<std::string>& initializers) const {
  const auto& g = model_.graph();
  std::unordered_map<std::string, const onnx::NodeProto*> producer;
  for (const auto& node : g.node())
    for (const auto& out : node.output())
      if (!out.empty()) producer[out] = &node;
  std::unordered_set<std::string> reached;
  std::vector<std::string> work;
  for (const auto& output : g.output()) {
    // An output whose type the model does not declare counts as float.
    const int32_t type = output.type().tensor_type().elem_type();
    const bool isFloat = type == onnx::TensorProto::FLOAT || type == onnx::TensorProto::FLOAT16 ||
                         type == onnx::TensorProto::UNDEFINED;
    if (isFloat && reached.insert(output.name()).second) work.push_back(output.name());
  }
  while (!work.empty()) {
    const std::string value = work.back();
    work.pop_back();
    const auto it = producer.find(value);
    if (it == producer.end()) continue;
    const auto& node = *it->second;
    for (int k : differentiableInputs(node, opset_)) {
      if (k >= node.input_size() || node.input(k).empty()) continue;
      if (reached.insert(node.input(k)).second) work.push_back(node.input(k));
    }
  }
  std::unordered_set<std::string> weights;
  for (const auto& name : initializers)
    if (reached.count(name)) weights.insert(name);
  return weights;
}

TensorId Importer::addSource(OpKind kind, const std::string& name, DType dtype, const Shape& shape,
                             const std::vector<float>& data, const std::string& subject) {
  try {
    TensorNode node;
    node.name = graph_.tryFind(name) ? graph_.uniqueName(name) : name;
    node.dtype = dtype;
    node.shape = shape;
    // Float16 sources hold their values as halves (rounded to nearest even).
    std::vector<float> values = data;
    if (dtype == DType::Float16) roundToHalves(values.data(), values.size());
    if (kind == OpKind::Variable) {
      node.initial = InitialValues(values);
      node.category = TensorCategory::Weight;
    } else {
      node.data = std::move(values);
    }
    return graph_.addSource(kind, std::move(node));
  } catch (const GraphError& e) {
    throwOnnx(ErrorCode::OnnxNodeShape, subject, e.what());
  }
}

bool Importer::addInput(const onnx::ValueInfoProto& input) {
  const std::string subject = source_ + ": input " + input.name();
  if (!input.type().has_tensor_type())
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
              "the input is not a tensor (sequences and maps are not supported)");
  const auto& type = input.type().tensor_type();
  // A bool input is a float32 0/1 mask; a float one has the import's float
  // type, a float16 one is a float16 stream.
  DType dtype = type.elem_type() == onnx::TensorProto::FLOAT ? options_.floatType : DType::Float32;
  if (type.elem_type() == onnx::TensorProto::INT64 || type.elem_type() == onnx::TensorProto::INT32) {
    dtype = DType::Int32;
  } else if (type.elem_type() == onnx::TensorProto::DOUBLE) {
    dtype = DType::Float64;
  } else if (type.elem_type() == onnx::TensorProto::FLOAT16) {
    dtype = DType::Float16;
  } else if (type.elem_type() != onnx::TensorProto::FLOAT && type.elem_type() != onnx::TensorProto::BOOL) {
    throwOnnx(
        ErrorCode::OnnxUnsupportedFeature, subject,
        fmt::format("element type {} is not supported; graph inputs may be float, float16, double, bool "
                    "(a float32 0/1 mask), int64 or int32{}",
                    typeName(type.elem_type()),
                    type.elem_type() == onnx::TensorProto::BFLOAT16
                        ? " (bfloat16 has no device dtype: convert the model to float16 or float)"
                        : ""));
  }
  const auto frozen = options_.constantInputs.find(input.name());
  if (!type.has_shape() && frozen == options_.constantInputs.end())
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
              "the input has no shape; export the model with input shapes");
  if (frozen != options_.constantInputs.end()) {
    addConstantInput(input, frozen->second, subject);
    return false;
  }
  Shape shape;
  for (int axis = 0; axis < type.shape().dim_size(); ++axis) {
    const auto& dim = type.shape().dim(axis);
    if (dim.has_dim_value()) {
      if (dim.dim_value() < 0)
        throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
                  fmt::format("axis {} has size {}; dimensions must be >= 0", axis, dim.dim_value()));
      if (dim.dim_value() == 0)
        throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
                  fmt::format("axis {} has size 0; tensors of zero elements are not supported", axis));
      shape.push_back(dim.dim_value());
      continue;
    }
    if (!dim.has_dim_param() || dim.dim_param().empty())
      throwOnnx(
          ErrorCode::OnnxUnboundDimension, subject,
          fmt::format("axis {} has neither a size nor a name; the model must name or size every input axis",
                      axis));
    const auto it = options_.dimensions.find(dim.dim_param());
    if (it == options_.dimensions.end())
      throwOnnx(ErrorCode::OnnxUnboundDimension, subject,
                fmt::format("axis {} is the symbolic dimension \"{}\", which has no value; set "
                            "OnnxImportOptions::dimensions[\"{}\"] (per replica)",
                            axis, dim.dim_param(), dim.dim_param()));
    if (it->second == 0)
      throwOnnx(
          ErrorCode::OnnxUnsupportedFeature, subject,
          fmt::format("axis {}: dimension \"{}\" is bound to 0; tensors of zero elements are not supported",
                      axis, dim.dim_param()));
    if (it->second < 1)
      throwOnnx(ErrorCode::OnnxUnboundDimension, subject,
                fmt::format("axis {}: dimension \"{}\" is bound to {}; it must be >= 1", axis,
                            dim.dim_param(), it->second));
    shape.push_back(it->second);
  }
  checkedElements(shape, subject, std::numeric_limits<int64_t>::max());
  const TensorId id = addSource(OpKind::Input, input.name(), dtype, shape, {}, subject);
  values_[input.name()] = Value{std::nullopt, id, type.elem_type()};
  return true;
}

void Importer::addConstantInput(const onnx::ValueInfoProto& input, const OnnxTensor& tensor,
                                const std::string& subject) {
  const int32_t type = input.type().tensor_type().elem_type();
  if (tensor.dtype != typeName(type))
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
              fmt::format("constantInputs gives a {} tensor for an input of type {}", tensor.dtype,
                          typeName(type)));
  const int64_t n = checkedElements(tensor.shape, subject, kMaxFoldedElements);
  if (n != static_cast<int64_t>(tensor.values.size()))
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
              fmt::format("constantInputs gives shape {} with {} values", shapeStr(tensor.shape),
                          tensor.values.size()));
  if (input.type().tensor_type().has_shape()) {
    const auto& dims = input.type().tensor_type().shape().dim();
    bool fits = dims.size() == static_cast<int>(tensor.shape.size());
    for (int axis = 0; fits && axis < dims.size(); ++axis)
      fits = !dims.Get(axis).has_dim_value() ||
             dims.Get(axis).dim_value() == tensor.shape[static_cast<std::size_t>(axis)];
    if (!fits)
      throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
                fmt::format("constantInputs gives shape {}; the input is declared [{}]",
                            shapeStr(tensor.shape), fmt::join(dimsOf(input), ", ")));
  }
  Known known = makeKnown(type, tensor.shape, subject);
  for (std::size_t e = 0; e < tensor.values.size(); ++e) {
    const double v = tensor.values[e];
    if (known.isFloat()) {
      known.f[e] = v;
    } else {
      if (v != std::floor(v) || std::fabs(v) > 9.0e15)
        throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
                  fmt::format("value {} of an integer input is not an integer", v));
      known.i[e] = static_cast<int64_t>(v);
    }
  }
  values_[input.name()] = Value{std::move(known), kNoTensor, type};
}

TensorId Importer::materialize(const std::string& name, const std::string& subject) {
  Value& value = values_.at(name);
  if (value.id != kNoTensor) return value.id;
  const Known& known = *value.known;
  std::vector<float> data;
  DType dtype = DType::Float32;
  if (known.type == onnx::TensorProto::BOOL) {
    // Masks are float32 0/1 (the mask ops of lib/ops/masks.cc).
    data.reserve(known.i.size());
    for (int64_t v : known.i) data.push_back(v != 0 ? 1.0F : 0.0F);
  } else if (known.isFloat()) {
    if (known.type == onnx::TensorProto::DOUBLE) {
      // float64: each double's bytes in two floats.
      dtype = DType::Float64;
      data = packDoubles(known.f);
    } else if (known.type == onnx::TensorProto::FLOAT16) {
      // The halves as they are (exact in float slots).
      dtype = DType::Float16;
      data.assign(known.f.begin(), known.f.end());
    } else if (known.type != onnx::TensorProto::FLOAT) {
      throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
                fmt::format("value \"{}\" has element type {}; the device computes in float32, float16 and "
                            "float64{}",
                            name, typeName(known.type),
                            known.type == onnx::TensorProto::BFLOAT16
                                ? " (bfloat16 has no device dtype: convert the model to float16 or float)"
                                : ""));
    } else {
      dtype = options_.floatType;
      data.assign(known.f.begin(), known.f.end());
    }
  } else {
    dtype = DType::Int32;
    data.reserve(known.i.size());
    for (int64_t v : known.i) {
      // Int32 values are held exactly as floats up to 2^24.
      if (v < -(int64_t{1} << 24) || v > (int64_t{1} << 24))
        throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
                  fmt::format(
                      "value \"{}\" holds the integer {}, which the device cannot hold exactly (|v| <= 2^24)",
                      name, v));
      data.push_back(static_cast<float>(v));
    }
  }
  value.id = addSource(OpKind::Constant, name, dtype, known.shape, data, subject);
  return value.id;
}

void Importer::bindOutput(const std::string& name) {
  const std::string subject = source_ + ": output " + name;
  if (!values_.count(name))
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject, "no node produces the graph output");
  TensorId id = materialize(name, subject);
  // A graph output is a tensor of its own, named as in the model: a source
  // (an input passed through, a folded value) is copied, and so is a value
  // that an earlier graph output is already (an identity cast between them).
  const OpKind producerKind = graph_.op(graph_.tensor(id).producer).kind;
  bool boundAlready = false;
  for (const auto& earlier : model_.graph().output()) {
    if (earlier.name() == name) break;
    boundAlready = boundAlready || graph_.tensor(id).name == earlier.name();
  }
  if (producerKind == OpKind::Input || producerKind == OpKind::Variable || producerKind == OpKind::Constant ||
      boundAlready) {
    const OpId copy = graph_.addOp(OpKind::Copy, {id}, {}, name);
    // The copy has no node of its own: with __ipu_number annotations it runs
    // on the last annotated node's IPU, so that Manual placement covers it.
    graph_.setVirtualGraph(copy, lastIpuNumber_);
    graph_.setPipelineStage(copy, lastPipelineStage_);
    graph_.setExecutionPhase(copy, lastExecutionPhase_);
    id = graph_.op(copy).outputs.at(0);
  }
  if (graph_.tensor(id).name != name) {
    if (const auto taken = graph_.tryFind(name)) graph_.rename(*taken, graph_.uniqueName(name + ".value"));
    graph_.rename(id, name);
  }
  values_[name].id = id;
}

// PopART's annotations on the ops a node became: normalisations (what
// RecomputationType::NormOnly recomputes) and the builder's
// recomputeOutputInBackwardPass, an int attribute holding a RecomputeType.
void Importer::markRecompute(const onnx::NodeProto& node, OpId first, const std::string& subject) {
  const std::string& op = node.op_type();
  if (op == "BatchNormalization" || op == "InstanceNormalization" || op == "LayerNormalization")
    graph_.markNormalisation(first);
  const onnx::AttributeProto* attribute = findAttribute(node, kRecomputeAttribute);
  if (attribute == nullptr) return;
  if (attribute->type() != onnx::AttributeProto::INT)
    throwOnnx(ErrorCode::OnnxInvalidRecompute, subject,
              fmt::format("attribute {} must be an int (0 Undefined, 1 Checkpoint, 2 Recompute)",
                          kRecomputeAttribute));
  const int64_t value = attribute->i();
  if (value < 0 || value > 2)
    throwOnnx(ErrorCode::OnnxInvalidRecompute, subject,
              fmt::format("attribute {} is {}; it must be 0 (Undefined), 1 (Checkpoint) or 2 (Recompute)",
                          kRecomputeAttribute, value));
  const auto type = static_cast<RecomputeType>(value);
  for (auto id = first; id < static_cast<OpId>(graph_.ops().size()); ++id)
    if (type != RecomputeType::Recompute || graph_.canRecompute(id)) graph_.setRecompute(id, type);
}

void Importer::markVirtualGraph(const onnx::NodeProto& node, OpId first, const std::string& subject) {
  const onnx::AttributeProto* attribute = findAttribute(node, kIpuNumberAttribute);
  if (attribute == nullptr) return;
  if (attribute->type() != onnx::AttributeProto::INT)
    throwOnnx(ErrorCode::OnnxInvalidIpuNumber, subject,
              fmt::format("attribute {} must be an int, the IPU of the replica the node runs on (from 0)",
                          kIpuNumberAttribute));
  const int64_t ipu = attribute->i();
  if (ipu < 0)
    throwOnnx(ErrorCode::OnnxInvalidIpuNumber, subject,
              fmt::format("attribute {} is {}; an IPU is numbered from 0", kIpuNumberAttribute, ipu));
  for (auto id = first; id < static_cast<OpId>(graph_.ops().size()); ++id) graph_.setVirtualGraph(id, ipu);
  lastIpuNumber_ = ipu;
}

void Importer::markPipelineStage(const onnx::NodeProto& node, OpId first, const std::string& subject) {
  const onnx::AttributeProto* attribute = findAttribute(node, kPipelineStageAttribute);
  if (attribute == nullptr) return;
  if (attribute->type() != onnx::AttributeProto::INT || attribute->i() < 0)
    throw GraphError(ErrorCode::InvalidPipelineStage, subject,
                     fmt::format("attribute {} must be a non-negative int, the pipeline stage of the node (from 0)",
                                 kPipelineStageAttribute));
  for (auto id = first; id < static_cast<OpId>(graph_.ops().size()); ++id) graph_.setPipelineStage(id, attribute->i());
  lastPipelineStage_ = attribute->i();
}

void Importer::markExecutionPhase(const onnx::NodeProto& node, OpId first, const std::string& subject) {
  const onnx::AttributeProto* attribute = findAttribute(node, kExecutionPhaseAttribute);
  if (attribute == nullptr) return;
  if (attribute->type() != onnx::AttributeProto::INT || attribute->i() < 0)
    throw GraphError(ErrorCode::InvalidExecutionPhase, subject,
                     fmt::format("attribute {} must be a non-negative int, the execution phase of the node (from 0)",
                                 kExecutionPhaseAttribute));
  for (auto id = first; id < static_cast<OpId>(graph_.ops().size()); ++id) graph_.setExecutionPhase(id, attribute->i());
  lastExecutionPhase_ = attribute->i();
}

void Importer::importNode(const onnx::NodeProto& node) {
  const std::string subject = nodeSubject(node);
  checkArity(node, opset_, subject);
  std::vector<std::optional<Known>> known;
  bool allKnown = true;
  for (const auto& in : node.input()) {
    if (in.empty()) {
      known.emplace_back();
      continue;
    }
    const Value& value = values_.at(in);
    if (value.known) {
      known.push_back(value.known);
    } else {
      allKnown = false;
      known.emplace_back();
    }
  }
  // Shape and Size need only the (static) shape of their input.
  if ((node.op_type() == "Shape" || node.op_type() == "Size") && !known[0]) {
    Known shapeOnly;
    shapeOnly.shape = graph_.tensor(values_.at(node.input(0)).id).shape;
    known[0] = shapeOnly;
    allKnown = true;
  }
  if (allKnown && node.op_type() != "Constant") {
    if (auto folded = foldNode(node, opset_, known, subject)) {
      for (int k = 0; k < node.output_size() && k < static_cast<int>(folded->size()); ++k) {
        if (node.output(k).empty()) continue;
        const int32_t type = (*folded)[static_cast<std::size_t>(k)].type;
        values_[node.output(k)] = Value{std::move((*folded)[static_cast<std::size_t>(k)]), kNoTensor, type};
      }
      for (int k = static_cast<int>(folded->size()); k < node.output_size(); ++k)
        if (!node.output(k).empty())
          throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
                    fmt::format("output {} (\"{}\") is not supported", k, node.output(k)));
      return;
    }
  }
  const auto first = static_cast<OpId>(graph_.ops().size());
  try {
    mapNode(node, subject);
  } catch (const GraphError& e) {
    throwOnnx(ErrorCode::OnnxNodeShape, subject, e.what());
  }
  markRecompute(node, first, subject);
  markVirtualGraph(node, first, subject);
  markPipelineStage(node, first, subject);
  markExecutionPhase(node, first, subject);
  for (const auto& out : node.output())
    if (!out.empty() && !values_.count(out))
      throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
                fmt::format("output \"{}\" is not supported", out));
}

}  // namespace onnx_import

bool onnxSupported() noexcept { return true; }

OnnxModel importOnnx(std::span<const std::byte> bytes, const OnnxImportOptions& options,
                     std::string_view source) {
  const std::string name(source);
  const onnx::ModelProto model = onnx_import::upgradeOpset(
      onnx_import::parseModel(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                              name),
      options, name);
  return onnx_import::Importer(model, options, name).run();
}

OnnxModel importOnnx(const std::filesystem::path& path, const OnnxImportOptions& options) {
  const std::string bytes = onnx_import::readFile(path);
  const onnx::ModelProto model =
      onnx_import::upgradeOpset(onnx_import::parseModel(bytes, path.string()), options, path.string());
  return onnx_import::Importer(model, options, path.string()).run();
}

OnnxTensor readOnnxTensor(const std::filesystem::path& path) {
  const std::string bytes = onnx_import::readFile(path);
  onnx::TensorProto proto;
  if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    onnx_import::throwOnnx(ErrorCode::OnnxMalformed, path.string(),
                           "not a TensorProto: the bytes do not parse");
  const onnx_import::Known known = onnx_import::readTensor(proto, path.string());
  OnnxTensor tensor{proto.name(), onnx_import::typeName(known.type), known.shape, {}};
  if (known.isFloat()) {
    tensor.values = known.f;
  } else {
    tensor.values.reserve(known.i.size());
    for (int64_t v : known.i) {
      if (v > (int64_t{1} << 53) || v < -(int64_t{1} << 53))
        onnx_import::throwOnnx(ErrorCode::OnnxUnsupportedFeature, path.string(),
                               fmt::format("the integer {} is beyond 2^53", v));
      tensor.values.push_back(static_cast<double>(v));
    }
  }
  return tensor;
}

OnnxSignature readOnnxSignature(const std::filesystem::path& path) {
  const std::string bytes = onnx_import::readFile(path);
  const onnx::ModelProto model = onnx_import::parseModel(bytes, path.string());
  std::unordered_set<std::string> initializers;
  for (const auto& init : model.graph().initializer()) initializers.insert(init.name());
  OnnxSignature signature;
  for (const auto& input : model.graph().input()) {
    if (initializers.count(input.name())) continue;
    signature.inputs.push_back({input.name(), onnx_import::valueTypeName(input), onnx_import::dimsOf(input)});
  }
  for (const auto& output : model.graph().output())
    signature.outputs.push_back(
        {output.name(), onnx_import::valueTypeName(output), onnx_import::dimsOf(output)});
  return signature;
}

}  // namespace tessera
