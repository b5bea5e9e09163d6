// OnnxBuilder: an ONNX model built node by node, every node checked against
// ONNX's schema of its op at the builder's opset (tessera/onnx/onnx_builder.hpp).
#include "tessera/onnx/onnx_builder.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include "half.hpp"
#include "json_reader.hpp"
#include "onnx_internal.hpp"

namespace tessera {
namespace {

using onnx::AttributeProto;
using onnx::TensorProto;

constexpr int64_t kMinOpset = 11;
constexpr int64_t kMaxOpset = 17;

[[noreturn]] void unknown(const std::string& subject, std::string_view message) {
  onnx_import::throwOnnx(ErrorCode::OnnxBuilderUnknown, subject, message);
}

[[noreturn]] void invalid(const std::string& subject, std::string_view message) {
  onnx_import::throwOnnx(ErrorCode::OnnxBuilderInvalid, subject, message);
}

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string suggestion(std::string_view word, const std::vector<std::string>& candidates) {
  std::vector<std::string_view> views(candidates.begin(), candidates.end());
  const auto match = jsonio::closestMatch(word, views);
  return match ? fmt::format(" (did you mean \"{}\"?)", *match) : std::string();
}

// ONNX element types by the names PopART's TensorInfo and numpy use.
int32_t elementType(std::string_view dtype, const std::string& subject) {
  static const std::unordered_map<std::string, int32_t> kTypes = {
      {"float", TensorProto::FLOAT},     {"float32", TensorProto::FLOAT}, {"float16", TensorProto::FLOAT16},
      {"half", TensorProto::FLOAT16},    {"double", TensorProto::DOUBLE}, {"float64", TensorProto::DOUBLE},
      {"int32", TensorProto::INT32},     {"int64", TensorProto::INT64},   {"bool", TensorProto::BOOL},
  };
  const auto found = kTypes.find(lower(dtype));
  if (found == kTypes.end())
    invalid(subject, fmt::format("element type \"{}\" is not one the builder writes; it takes FLOAT, FLOAT16, "
                                 "DOUBLE, INT32, INT64 or BOOL",
                                 boundedText(dtype)));
  return found->second;
}

// Lower-case op type -> ONNX's spelling, for every op of the default domain.
const std::unordered_map<std::string, std::string>& opTypesByLowerName() {
  static const std::unordered_map<std::string, std::string> kTypes = [] {
    std::unordered_map<std::string, std::string> types;
    for (const onnx::OpSchema& schema : onnx::OpSchemaRegistry::get_all_schemas())
      if (schema.domain().empty()) types.emplace(lower(schema.Name()), schema.Name());
    return types;
  }();
  return kTypes;
}

const onnx::OpSchema* schemaAt(const std::string& type, int64_t opset) {
  const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(type, static_cast<int>(opset), "");
  return schema == nullptr || schema->Deprecated() ? nullptr : schema;
}

std::string attributeTypeName(AttributeProto::AttributeType type) {
  switch (type) {
    case AttributeProto::INT: return "an int";
    case AttributeProto::FLOAT: return "a float";
    case AttributeProto::STRING: return "a string";
    case AttributeProto::INTS: return "a list of ints";
    case AttributeProto::FLOATS: return "a list of floats";
    case AttributeProto::STRINGS: return "a list of strings";
    case AttributeProto::TENSOR: return "a tensor";
    case AttributeProto::GRAPH: return "a graph";
    default: return "a value of another kind";
  }
}

std::string valueKind(const OnnxAttribute& value) {
  switch (value.index()) {
    case 0: return "an int";
    case 1: return "a float";
    case 2: return "a string";
    case 3: return "a list of ints";
    case 4: return "a list of floats";
    default: return "a list of strings";
  }
}

bool isEmptyList(const OnnxAttribute& value) {
  if (const auto* ints = std::get_if<std::vector<int64_t>>(&value)) return ints->empty();
  if (const auto* floats = std::get_if<std::vector<double>>(&value)) return floats->empty();
  if (const auto* strings = std::get_if<std::vector<std::string>>(&value)) return strings->empty();
  return false;
}

float toFloat(double value, const std::string& subject) {
  if (std::isfinite(value) && std::abs(value) > static_cast<double>(std::numeric_limits<float>::max()))
    invalid(subject, fmt::format("{} does not fit a float attribute", value));
  return static_cast<float>(value);
}

// `value` as an attribute of schema type `type` (or as its own type when the
// attribute has no schema: PopART's "__" annotations).
AttributeProto makeAttribute(const std::string& name, const OnnxAttribute& value,
                             std::optional<AttributeProto::AttributeType> type, const std::string& subject) {
  AttributeProto attribute;
  attribute.set_name(name);
  const auto wrong = [&](AttributeProto::AttributeType wanted) {
    invalid(subject, fmt::format("attribute {} is {}; the op's schema wants {}", name, valueKind(value),
                                 attributeTypeName(wanted)));
  };
  const AttributeProto::AttributeType want = type.value_or([&] {
    switch (value.index()) {
      case 0: return AttributeProto::INT;
      case 1: return AttributeProto::FLOAT;
      case 2: return AttributeProto::STRING;
      case 3: return AttributeProto::INTS;
      case 4: return AttributeProto::FLOATS;
      default: return AttributeProto::STRINGS;
    }
  }());
  attribute.set_type(want);
  switch (want) {
    case AttributeProto::INT:
      if (const auto* i = std::get_if<int64_t>(&value)) {
        attribute.set_i(*i);
      } else if (const auto* s = std::get_if<std::string>(&value); s != nullptr && name == "to") {
        // Cast's target, as PopART's builder takes it: an element type name.
        attribute.set_i(elementType(*s, subject));
      } else {
        wrong(want);
      }
      break;
    case AttributeProto::FLOAT:
      if (const auto* f = std::get_if<double>(&value)) {
        attribute.set_f(toFloat(*f, subject));
      } else if (const auto* i = std::get_if<int64_t>(&value)) {
        attribute.set_f(static_cast<float>(*i));
      } else {
        wrong(want);
      }
      break;
    case AttributeProto::STRING:
      if (const auto* s = std::get_if<std::string>(&value)) {
        attribute.set_s(*s);
      } else {
        wrong(want);
      }
      break;
    case AttributeProto::INTS:
      if (const auto* ints = std::get_if<std::vector<int64_t>>(&value)) {
        for (const int64_t i : *ints) attribute.add_ints(i);
      } else {
        wrong(want);
      }
      break;
    case AttributeProto::FLOATS:
      if (const auto* floats = std::get_if<std::vector<double>>(&value)) {
        for (const double f : *floats) attribute.add_floats(toFloat(f, subject));
      } else if (const auto* ints = std::get_if<std::vector<int64_t>>(&value)) {
        for (const int64_t i : *ints) attribute.add_floats(static_cast<float>(i));
      } else {
        wrong(want);
      }
      break;
    case AttributeProto::STRINGS:
      if (const auto* strings = std::get_if<std::vector<std::string>>(&value)) {
        for (const std::string& s : *strings) attribute.add_strings(s);
      } else {
        wrong(want);
      }
      break;
    default:
      invalid(subject, fmt::format("attribute {} is {}, which the builder cannot write", name,
                                   attributeTypeName(want)));
  }
  return attribute;
}

// The elements of `value` as the raw little-endian data of `type`.
std::string rawData(const OnnxTensor& value, int32_t type, const std::string& subject) {
  static_assert(std::endian::native == std::endian::little, "ONNX raw data is little-endian");
  const std::size_t count = value.values.size();
  std::string raw;
  const auto integral = [&](double v, double low, double high) {
    if (!(v == std::floor(v) && v >= low && v <= high))
      invalid(subject, fmt::format("value {} does not fit {}", v, onnx_import::typeName(type)));
    return v;
  };
  switch (type) {
    case TensorProto::FLOAT: {
      std::vector<float> floats(count);
      for (std::size_t k = 0; k < count; ++k) floats[k] = static_cast<float>(value.values[k]);
      raw.assign(reinterpret_cast<const char*>(floats.data()), count * sizeof(float));
      break;
    }
    case TensorProto::FLOAT16: {
      std::vector<uint16_t> halves(count);
      for (std::size_t k = 0; k < count; ++k) halves[k] = floatToHalf(roundToHalf(value.values[k]));
      raw.assign(reinterpret_cast<const char*>(halves.data()), count * sizeof(uint16_t));
      break;
    }
    case TensorProto::DOUBLE:
      raw.assign(reinterpret_cast<const char*>(value.values.data()), count * sizeof(double));
      break;
    case TensorProto::INT32: {
      std::vector<int32_t> ints(count);
      for (std::size_t k = 0; k < count; ++k)
        ints[k] = static_cast<int32_t>(integral(value.values[k], -2147483648.0, 2147483647.0));
      raw.assign(reinterpret_cast<const char*>(ints.data()), count * sizeof(int32_t));
      break;
    }
    case TensorProto::INT64: {
      std::vector<int64_t> ints(count);
      for (std::size_t k = 0; k < count; ++k)
        ints[k] = static_cast<int64_t>(integral(value.values[k], -9007199254740992.0, 9007199254740992.0));
      raw.assign(reinterpret_cast<const char*>(ints.data()), count * sizeof(int64_t));
      break;
    }
    default: {  // BOOL
      std::string bytes(count, '\0');
      for (std::size_t k = 0; k < count; ++k) bytes[k] = static_cast<char>(integral(value.values[k], 0.0, 1.0));
      raw = std::move(bytes);
      break;
    }
  }
  return raw;
}

std::string lossReduction(std::string_view reduction, const std::string& subject) {
  if (reduction == "Sum") return "sum";
  if (reduction == "Mean") return "mean";
  if (reduction == "NoReduction") return "none";
  invalid(subject, fmt::format("reduction \"{}\" is not one of \"Sum\", \"Mean\", \"NoReduction\"",
                               boundedText(reduction)));
}

}  // namespace

struct OnnxBuilder::State {
  int64_t opset = 14;
  onnx::ModelProto model;
  std::set<std::string, std::less<>> tensors;    // every tensor name handed out
  std::set<std::string, std::less<>> nodeNames;  // every node name
  // The node (index into graph.node) that made each node output.
  std::unordered_map<std::string, int> producers;
  // Scope attributes by name, innermost last.
  std::map<std::string, std::vector<OnnxAttribute>, std::less<>> scopes;

  std::string unique(const std::set<std::string, std::less<>>& taken, std::string base) const {
    if (!taken.contains(base)) return base;
    for (int n = 1;; ++n) {
      std::string candidate = fmt::format("{}/{}", base, n);
      if (!taken.contains(candidate)) return candidate;
    }
  }

  void requireTensor(std::string_view name, const std::string& subject) const {
    if (tensors.contains(name)) return;
    std::vector<std::string> names(tensors.begin(), tensors.end());
    unknown(subject, fmt::format("the builder has no tensor \"{}\"{}", boundedText(name),
                                 suggestion(name, names)));
  }

  // The types and shapes ONNX's shape inference gives the values of the
  // model as it is, by name: inferred once per change of the model (the
  // inference runs over a copy of the whole model, so running it on every
  // query made building and querying quadratic). Every change that can
  // change a type (a node, an input, an initializer, a node's attribute)
  // calls changed().
  mutable std::optional<std::unordered_map<std::string, onnx::TypeProto>> types;
  mutable int64_t inferenceRuns = 0;

  void changed() { types.reset(); }

  const std::unordered_map<std::string, onnx::TypeProto>& inferredTypes() const {
    if (types) return *types;
    onnx::ModelProto copy = model;
    ++inferenceRuns;
    try {
      onnx::shape_inference::InferShapes(copy);
    } catch (const std::exception& e) {
      invalid("shape inference", e.what());
    }
    std::unordered_map<std::string, onnx::TypeProto> found;
    const onnx::GraphProto& graph = copy.graph();
    // The first of a name wins, as a search of input, value_info, output would find it.
    for (const auto* list : {&graph.input(), &graph.value_info(), &graph.output()})
      for (const onnx::ValueInfoProto& info : *list) found.emplace(info.name(), info.type());
    types = std::move(found);
    return *types;
  }

  const onnx::TypeProto* typeOf(std::string_view name) const {
    const auto& all = inferredTypes();
    const auto found = all.find(std::string(name));
    return found == all.end() ? nullptr : &found->second;
  }
};

OnnxBuilder::OnnxBuilder(int64_t opset) : state_(std::make_unique<State>()) {
  if (opset < kMinOpset || opset > kMaxOpset)
    invalid("OnnxBuilder", fmt::format("opset {} is outside the opsets tessera imports ({} to {})", opset,
                                       kMinOpset, kMaxOpset));
  state_->opset = opset;
  state_->model.set_ir_version(8);
  state_->model.set_producer_name("tessera");
  auto* import = state_->model.add_opset_import();
  import->set_domain("");
  import->set_version(opset);
  state_->model.mutable_graph()->set_name("tessera_builder");
}

OnnxBuilder::~OnnxBuilder() = default;
OnnxBuilder::OnnxBuilder(OnnxBuilder&&) noexcept = default;
OnnxBuilder& OnnxBuilder::operator=(OnnxBuilder&&) noexcept = default;

int64_t OnnxBuilder::opset() const noexcept { return state_->opset; }

std::string OnnxBuilder::addInputTensor(std::string_view dtype, const Shape& shape, std::string_view debugName) {
  const std::string name = state_->unique(state_->tensors, debugName.empty() ? "input" : std::string(debugName));
  const std::string subject = fmt::format("input \"{}\"", name);
  const int32_t type = elementType(dtype, subject);
  for (const int64_t dim : shape)
    if (dim < 0) invalid(subject, fmt::format("shape {} has a negative axis", shapeStr(shape)));
  onnx::ValueInfoProto* input = state_->model.mutable_graph()->add_input();
  input->set_name(name);
  auto* tensorType = input->mutable_type()->mutable_tensor_type();
  tensorType->set_elem_type(type);
  auto* dims = tensorType->mutable_shape();
  for (const int64_t dim : shape) dims->add_dim()->set_dim_value(dim);
  state_->tensors.insert(name);
  state_->changed();
  return name;
}

std::string OnnxBuilder::addInitializedInputTensor(const OnnxTensor& value, std::string_view debugName) {
  const std::string name =
      state_->unique(state_->tensors, debugName.empty() ? "init_input" : std::string(debugName));
  const std::string subject = fmt::format("initializer \"{}\"", name);
  const int32_t type = elementType(value.dtype, subject);
  for (const int64_t dim : value.shape)
    if (dim < 0) invalid(subject, fmt::format("shape {} has a negative axis", shapeStr(value.shape)));
  const int64_t count = onnx_import::checkedElements(value.shape, subject, std::numeric_limits<int64_t>::max());
  if (static_cast<int64_t>(value.values.size()) != count)
    invalid(subject, fmt::format("{} values for shape {} ({} elements)", value.values.size(),
                                 shapeStr(value.shape), count));
  TensorProto* tensor = state_->model.mutable_graph()->add_initializer();
  tensor->set_name(name);
  tensor->set_data_type(type);
  for (const int64_t dim : value.shape) tensor->add_dims(dim);
  tensor->set_raw_data(rawData(value, type, subject));
  state_->tensors.insert(name);
  state_->changed();
  return name;
}

std::optional<std::string> OnnxBuilder::opType(std::string_view name) const {
  const auto& types = opTypesByLowerName();
  const auto found = types.find(lower(name));
  if (found == types.end() || schemaAt(found->second, state_->opset) == nullptr) return std::nullopt;
  return found->second;
}

bool OnnxBuilder::hasSeveralOutputs(std::string_view opType) const {
  const auto type = this->opType(opType);
  if (!type) return false;
  return schemaAt(*type, state_->opset)->max_output() > 1;
}

std::vector<std::string> OnnxBuilder::addNode(std::string_view opType, std::span<const std::string> inputs,
                                              const OnnxAttributes& attributes, int64_t numOutputs,
                                              std::string_view debugName) {
  const auto type = this->opType(opType);
  if (!type) {
    std::vector<std::string> names;
    for (const auto& entry : opTypesByLowerName())
      if (schemaAt(entry.second, state_->opset) != nullptr) names.push_back(entry.second);
    std::sort(names.begin(), names.end());
    unknown(fmt::format("op {}", boundedText(opType)),
            fmt::format("ONNX has no op of that type at opset {}{}", state_->opset, suggestion(opType, names)));
  }
  const onnx::OpSchema& schema = *schemaAt(*type, state_->opset);
  const std::string nodeName =
      state_->unique(state_->nodeNames, debugName.empty() ? *type : std::string(debugName));
  const std::string subject = fmt::format("node {} ({}, opset {})", nodeName, *type, state_->opset);

  const auto inputCount = static_cast<int64_t>(inputs.size());
  if (inputCount < schema.min_input() || inputCount > schema.max_input()) {
    const std::string allowed = schema.min_input() == schema.max_input()
                                    ? fmt::format("{}", schema.min_input())
                                    : schema.max_input() == std::numeric_limits<int>::max()
                                          ? fmt::format("at least {}", schema.min_input())
                                          : fmt::format("{} to {}", schema.min_input(), schema.max_input());
    invalid(subject, fmt::format("{} inputs; {} takes {}", inputCount, *type, allowed));
  }
  for (const std::string& input : inputs)
    if (!input.empty()) state_->requireTensor(input, subject);

  if (numOutputs == 0) numOutputs = std::max(1, schema.min_output());
  if (numOutputs < schema.min_output() || numOutputs > schema.max_output())
    invalid(subject, fmt::format("{} outputs asked for; {} has {} to {}", numOutputs, *type, schema.min_output(),
                                 schema.max_output()));

  onnx::NodeProto node;
  node.set_op_type(*type);
  node.set_name(nodeName);
  for (const std::string& input : inputs) node.add_input(input);

  const auto& declared = schema.attributes();
  for (const auto& [name, value] : attributes) {
    if (name.starts_with("__")) {
      *node.add_attribute() = makeAttribute(name, value, std::nullopt, subject);
      continue;
    }
    const auto found = declared.find(name);
    if (found == declared.end()) {
      std::vector<std::string> names;
      for (const auto& entry : declared) names.push_back(entry.first);
      std::string allowed;
      for (const std::string& n : names) allowed += (allowed.empty() ? "" : ", ") + n;
      unknown(subject, fmt::format("{} has no attribute \"{}\"{}; its attributes: {}", *type,
                                   boundedText(name), suggestion(name, names),
                                   allowed.empty() ? "none" : allowed));
    }
    if (isEmptyList(value)) continue;
    *node.add_attribute() = makeAttribute(name, value, found->second.type, subject);
  }
  for (const auto& [name, values] : state_->scopes) {
    if (values.empty() || attributes.contains(name)) continue;
    *node.add_attribute() = makeAttribute(name, values.back(), std::nullopt, subject);
  }
  for (const auto& entry : declared) {
    if (!entry.second.required) continue;
    const std::string& required = entry.first;
    const bool given = std::any_of(node.attribute().begin(), node.attribute().end(),
                                   [&](const AttributeProto& a) { return a.name() == required; });
    if (!given) invalid(subject, fmt::format("attribute {} is required by {}", required, *type));
  }

  // The outputs are named together: NAME:0, NAME:1, ... or, when any of
  // them is taken, NAME:0/n, NAME:1/n, ... for the least n that frees all.
  const std::string base = debugName.empty() ? *type : std::string(debugName);
  const auto names = [&](int suffix) {
    std::vector<std::string> candidate;
    for (int64_t k = 0; k < numOutputs; ++k)
      candidate.push_back(suffix == 0 ? fmt::format("{}:{}", base, k) : fmt::format("{}:{}/{}", base, k, suffix));
    return candidate;
  };
  std::vector<std::string> outputs;
  for (int suffix = 0;; ++suffix) {
    outputs = names(suffix);
    if (std::none_of(outputs.begin(), outputs.end(),
                     [&](const std::string& name) { return state_->tensors.contains(name); }))
      break;
  }
  for (const std::string& output : outputs) {
    state_->tensors.insert(output);
    node.add_output(output);
  }

  auto* graph = state_->model.mutable_graph();
  const int index = graph->node_size();
  *graph->add_node() = std::move(node);
  state_->nodeNames.insert(nodeName);
  for (const std::string& output : outputs) state_->producers[output] = index;
  state_->changed();
  return outputs;
}

std::string OnnxBuilder::nllLoss(const std::string& probabilities, const std::string& labels,
                                 std::string_view reduction, std::optional<int64_t> ignoreIndex,
                                 bool inputIsLogProbability, std::string_view debugName) {
  const std::string base = debugName.empty() ? "Nll" : std::string(debugName);
  const std::string mode = lossReduction(reduction, fmt::format("nllloss {}", base));
  std::string logProbabilities = probabilities;
  if (!inputIsLogProbability)
    logProbabilities = addNode("Log", std::vector{probabilities}, {}, 1, base + "/log")[0];
  OnnxAttributes attributes = {{"reduction", mode}};
  if (ignoreIndex) attributes["ignore_index"] = *ignoreIndex;
  return addNode("NegativeLogLikelihoodLoss", std::vector{logProbabilities, labels}, attributes, 1, base)[0];
}

std::string OnnxBuilder::l1Loss(const std::string& input, double lambda, std::string_view reduction,
                                std::string_view debugName) {
  const std::string base = debugName.empty() ? "L1" : std::string(debugName);
  const std::string mode = lossReduction(reduction, fmt::format("l1loss {}", base));
  const std::string absolute = addNode("Abs", std::vector{input}, {}, 1, base + "/abs")[0];
  std::string reduced = absolute;
  if (mode == "sum") reduced = addNode("ReduceSum", std::vector{absolute}, {{"keepdims", int64_t{0}}}, 1,
                                       base + "/sum")[0];
  if (mode == "mean") reduced = addNode("ReduceMean", std::vector{absolute}, {{"keepdims", int64_t{0}}}, 1,
                                        base + "/mean")[0];
  const std::string scale = addNode("Constant", {}, {{"value_float", lambda}}, 1, base + "/lambda")[0];
  // The scale in the input's own element type (a float16 model's loss is float16).
  std::string typedScale = scale;
  if (tensorDtype(input) != "float")
    typedScale = addNode("Cast", std::vector{scale}, {{"to", tensorDtype(input)}}, 1, base + "/cast")[0];
  return addNode("Mul", std::vector{reduced, typedScale}, {}, 1, base)[0];
}

std::string OnnxBuilder::identityLoss(const std::string& input, std::string_view reduction,
                                      std::string_view debugName) {
  const std::string base = debugName.empty() ? "IdentityLoss" : std::string(debugName);
  const std::string mode = lossReduction(reduction, fmt::format("identityloss {}", base));
  if (mode == "sum") return addNode("ReduceSum", std::vector{input}, {{"keepdims", int64_t{0}}}, 1, base)[0];
  if (mode == "mean") return addNode("ReduceMean", std::vector{input}, {{"keepdims", int64_t{0}}}, 1, base)[0];
  return addNode("Identity", std::vector{input}, {}, 1, base)[0];
}

std::string OnnxBuilder::gelu(const std::string& input, std::string_view debugName) {
  const std::string base = debugName.empty() ? "Gelu" : std::string(debugName);
  const std::string dtype = tensorDtype(input);
  // A scalar constant in the input's element type.
  const auto constant = [&](double value, const std::string& name) {
    std::string scalar = addNode("Constant", {}, {{"value_float", value}}, 1, name)[0];
    if (dtype != "float") scalar = addNode("Cast", std::vector{scalar}, {{"to", dtype}}, 1, name + "/cast")[0];
    return scalar;
  };
  const std::string root2 = constant(1.4142135623730951, base + "/sqrt2");
  const std::string one = constant(1.0, base + "/one");
  const std::string half = constant(0.5, base + "/half");
  const std::string scaled = addNode("Div", std::vector{input, root2}, {}, 1, base + "/div")[0];
  const std::string erf = addNode("Erf", std::vector{scaled}, {}, 1, base + "/erf")[0];
  const std::string shifted = addNode("Add", std::vector{erf, one}, {}, 1, base + "/add")[0];
  const std::string product = addNode("Mul", std::vector{input, shifted}, {}, 1, base + "/mul")[0];
  return addNode("Mul", std::vector{product, half}, {}, 1, base)[0];
}

void OnnxBuilder::addOutputTensor(std::string_view tensor) {
  const std::string subject = fmt::format("output \"{}\"", boundedText(tensor));
  state_->requireTensor(tensor, subject);
  auto* graph = state_->model.mutable_graph();
  for (const onnx::ValueInfoProto& output : graph->output())
    if (output.name() == tensor) invalid(subject, "the tensor is already a graph output");
  // ONNX wants an output's type: take the inferred one.
  const onnx::TypeProto* type = state_->typeOf(tensor);
  if (type == nullptr) {
    for (const TensorProto& initializer : graph->initializer())
      if (initializer.name() == tensor) invalid(subject, "an initializer cannot be a graph output");
    invalid(subject, "ONNX's shape inference gives the tensor no type");
  }
  onnx::ValueInfoProto* output = graph->add_output();
  output->set_name(std::string(tensor));
  *output->mutable_type() = *type;
}

void OnnxBuilder::setNodeAttribute(std::string_view tensor, std::string_view name, const OnnxAttribute& value) {
  const std::string subject = fmt::format("tensor \"{}\"", boundedText(tensor));
  state_->requireTensor(tensor, subject);
  const auto producer = state_->producers.find(std::string(tensor));
  if (producer == state_->producers.end())
    invalid(subject, fmt::format("a graph input or initializer has no node to carry attribute {}", name));
  onnx::NodeProto* node = state_->model.mutable_graph()->mutable_node(producer->second);
  std::optional<AttributeProto::AttributeType> type;
  if (!name.starts_with("__")) {
    const onnx::OpSchema& schema = *schemaAt(node->op_type(), state_->opset);
    const auto found = schema.attributes().find(std::string(name));
    if (found == schema.attributes().end())
      unknown(subject, fmt::format("{} has no attribute \"{}\"", node->op_type(), boundedText(name)));
    type = found->second.type;
  }
  AttributeProto attribute = makeAttribute(std::string(name), value, type, subject);
  state_->changed();
  for (AttributeProto& existing : *node->mutable_attribute()) {
    if (existing.name() == name) {
      existing = std::move(attribute);
      return;
    }
  }
  *node->add_attribute() = std::move(attribute);
}

void OnnxBuilder::setScopeAttribute(std::string_view name, const OnnxAttribute& value) {
  if (!name.starts_with("__"))
    invalid(fmt::format("scope attribute \"{}\"", boundedText(name)),
            "only annotations whose names begin with \"__\" (e.g. __ipu_number) can be set on every node of a "
            "scope; give an op's own attributes to the node");
  state_->scopes[std::string(name)].push_back(value);
}

void OnnxBuilder::clearScopeAttribute(std::string_view name) {
  const auto found = state_->scopes.find(name);
  if (found == state_->scopes.end() || found->second.empty())
    invalid(fmt::format("scope attribute \"{}\"", boundedText(name)), "no scope of that attribute is open");
  found->second.pop_back();
}

Shape OnnxBuilder::tensorShape(std::string_view tensor) const {
  const std::string subject = fmt::format("tensor \"{}\"", boundedText(tensor));
  state_->requireTensor(tensor, subject);
  for (const TensorProto& initializer : state_->model.graph().initializer())
    if (initializer.name() == tensor) return Shape(initializer.dims().begin(), initializer.dims().end());
  const onnx::TypeProto* type = state_->typeOf(tensor);
  if (type == nullptr || !type->has_tensor_type() || !type->tensor_type().has_shape())
    invalid(subject, "ONNX's shape inference gives the tensor no shape");
  Shape shape;
  for (const auto& dim : type->tensor_type().shape().dim()) {
    if (!dim.has_dim_value()) invalid(subject, "ONNX's shape inference leaves an axis of the tensor unknown");
    shape.push_back(dim.dim_value());
  }
  return shape;
}

std::string OnnxBuilder::tensorDtype(std::string_view tensor) const {
  const std::string subject = fmt::format("tensor \"{}\"", boundedText(tensor));
  state_->requireTensor(tensor, subject);
  for (const TensorProto& initializer : state_->model.graph().initializer())
    if (initializer.name() == tensor) return onnx_import::typeName(initializer.data_type());
  const onnx::TypeProto* type = state_->typeOf(tensor);
  if (type == nullptr || !type->has_tensor_type() || type->tensor_type().elem_type() == 0)
    invalid(subject, "ONNX's shape inference gives the tensor no element type");
  return onnx_import::typeName(type->tensor_type().elem_type());
}

int64_t OnnxBuilder::shapeInferenceRuns() const noexcept { return state_->inferenceRuns; }

std::string OnnxBuilder::modelProto() const {
  try {
    onnx::checker::check_model(state_->model);
  } catch (const std::exception& e) {
    invalid("the built model", fmt::format("ONNX's checker refuses it: {}", e.what()));
  }
  std::string bytes;
  if (!state_->model.SerializeToString(&bytes)) invalid("the built model", "it does not serialize");
  return bytes;
}

}  // namespace tessera
