// Node mapping: each ONNX node becomes one or more ops of tessera/lib/ops.hpp.
// Compositions stay compositions (Gemm = transposes + MatMul + scaled Add);
// what the current ops cannot compute exactly is refused with the node named.
// The ops are mapped by their families (onnx/ops/<family>.cc, registered in
// the table of op_mapping.hpp); this file holds the helpers they share and
// the dispatch.
#include <algorithm>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "importer.hpp"
#include "op_mapping.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::onnx_import {

void refuseComputedInput(const std::string& op, const std::string& subject) {
  throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
            fmt::format("{} is supported on values known at import only (shape arithmetic); here an input is "
                        "computed by the model",
                        op));
}

void checkArity(const onnx::NodeProto& node, int64_t opset, const std::string& subject) {
  const std::string& op = node.op_type();
  // An op type the table does not know is refused by mapNode (or folded).
  const OnnxOpMapping* entry = onnxMappings().find(node.domain(), op, opset);
  if (entry == nullptr) return;
  const int required = entry->requiredInputs;  // inputs that must be present
  if (node.input_size() < required)
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
              fmt::format("{} needs {} inputs; the node has {}", op, required, node.input_size()));
  for (int k = 0; k < required; ++k)
    if (node.input(k).empty())
      throwOnnx(ErrorCode::OnnxInvalidGraph, subject, fmt::format("input {} is required but empty", k));
  // A recurrence's outputs are all optional (Y_h alone is common); the others need output 0.
  const bool anyOutput = std::any_of(node.output().begin(), node.output().end(),
                                     [](const std::string& o) { return !o.empty(); });
  if (entry->anyOutput ? !anyOutput : node.output_size() < 1 || node.output(0).empty())
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject, fmt::format("{} needs an output", op));
}

std::vector<int> differentiableInputs(const onnx::NodeProto& node, int64_t opset) {
  const OnnxOpMapping* entry = onnxMappings().find(node.domain(), node.op_type(), opset);
  if (entry == nullptr) return {};
  if (entry->allInputsDifferentiable) {
    std::vector<int> all(static_cast<std::size_t>(node.input_size()));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  return entry->differentiable;
}

const Known* Importer::knownInput(const onnx::NodeProto& node, int k) const {
  if (k >= node.input_size() || node.input(k).empty()) return nullptr;
  const Value& value = values_.at(node.input(k));
  return value.known ? &*value.known : nullptr;
}

const Known& Importer::requireKnown(const onnx::NodeProto& node, int k, const std::string& subject,
                                    std::string_view what) const {
  if (k >= node.input_size() || node.input(k).empty())
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject, fmt::format("input {} ({}) is missing", k, what));
  const Known* known = knownInput(node, k);
  if (known == nullptr)
    throwOnnx(
        ErrorCode::OnnxUnsupportedFeature, subject,
        fmt::format("input {} ({}, \"{}\") is computed by the model; tessera needs it known at import (a "
                    "constant, or shape arithmetic on constants)",
                    k, what, node.input(k)));
  return *known;
}

Tensor Importer::operand(const onnx::NodeProto& node, int k, const std::string& subject) {
  if (k >= node.input_size() || node.input(k).empty())
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject, fmt::format("input {} is required but missing", k));
  return Tensor(&graph_, materialize(node.input(k), subject));
}

void Importer::requireFloat(const Tensor& t, const onnx::NodeProto& node, int k,
                            const std::string& subject) const {
  if (t.dtype() != DType::Float32 && t.dtype() != DType::Float16)
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
              fmt::format("input {} (\"{}\") is {}; the device computes {} on float32 or float16 only", k,
                          node.input(k), typeName(values_.at(node.input(k)).type), node.op_type()));
}

void Importer::setOutput(const onnx::NodeProto& node, int k, Tensor t, int32_t type) {
  if (k >= node.output_size() || node.output(k).empty()) return;
  const std::string& name = node.output(k);
  // Tensors this node created carry its ONNX value name, so graph dumps and
  // errors name what the model calls them.
  if (t.id() >= firstNewTensor_ && !graph_.tryFind(name)) graph_.rename(t.id(), name);
  // A float16 result is float16 in ONNX's terms; under floatType Float16,
  // where float values are float16 on the device too, it has the type of
  // the node's float operands.
  if (type == onnx::TensorProto::FLOAT && t.dtype() == DType::Float16 &&
      (options_.floatType != DType::Float16 || nodeFloatType_ == onnx::TensorProto::FLOAT16))
    type = onnx::TensorProto::FLOAT16;
  values_[name] = Value{std::nullopt, t.id(), type};
}

Tensor Importer::scalar(double value, DType dtype) { return ops::scalar(graph_, value, dtype); }

DType Importer::deviceFloat(int32_t type) const {
  if (type == onnx::TensorProto::FLOAT16) return DType::Float16;
  if (type == onnx::TensorProto::DOUBLE) return DType::Float64;
  return options_.floatType;
}

Tensor Importer::toFloat(Tensor t, DType dtype) {
  if (t.dtype() == dtype) return t;
  // A double goes to float16 in one rounding; through float32 it could tie
  // the wrong way.
  if (t.dtype() != DType::Float32 && !(t.dtype() == DType::Float64 && dtype == DType::Float16))
    t = ops::cast(t, DType::Float32);
  return ops::cast(t, dtype);
}

void Importer::checkFloatOperands(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  nodeFloatType_ = onnx::TensorProto::FLOAT;
  // Cast converts between types; Pow's exponent and Dropout's ratio may
  // have types of their own (ONNX's T1).
  if (op == "Cast") return;
  const int count = op == "Pow" || op == "Dropout" ? std::min(node.input_size(), 1) : node.input_size();
  int first = -1;
  for (int k = 0; k < count; ++k) {
    if (node.input(k).empty()) continue;
    const int32_t type = values_.at(node.input(k)).type;
    if (type != onnx::TensorProto::FLOAT && type != onnx::TensorProto::FLOAT16 &&
        type != onnx::TensorProto::DOUBLE)
      continue;
    if (first < 0) {
      first = k;
      nodeFloatType_ = type;
      continue;
    }
    if (type == nodeFloatType_ ||
        (type != onnx::TensorProto::FLOAT16 && nodeFloatType_ != onnx::TensorProto::FLOAT16))
      continue;
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
              fmt::format("input {} (\"{}\") is {} and input {} (\"{}\") is {}: {} takes its float operands "
                          "in one type (float, float16 or double); cast one of them with a Cast node",
                          first, node.input(first), typeName(nodeFloatType_), k, node.input(k),
                          typeName(type), op));
  }
}

Tensor Importer::stateVariable(const onnx::NodeProto& node, int k, const std::string& subject) {
  const std::string& name = node.input(k);
  Value& value = values_.at(name);
  if (value.id != kNoTensor || !value.known ||
      (value.type != onnx::TensorProto::FLOAT && value.type != onnx::TensorProto::FLOAT16))
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
              fmt::format("input {} (\"{}\") holds state that the node updates in place; it must be a float "
                          "initializer that no other node has used before",
                          k, name));
  const Known known = *value.known;
  const TensorId id = addSource(OpKind::Variable, name, deviceFloat(known.type), known.shape,
                                std::vector<float>(known.f.begin(), known.f.end()), subject);
  graph_.tensor(id).category = TensorCategory::OptimizerState;
  values_[name] = Value{std::nullopt, id, known.type};
  state_.push_back(name);
  return {&graph_, id};
}

void Importer::mapNode(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  firstNewTensor_ = static_cast<TensorId>(graph_.tensors().size());
  const OnnxOpMapping* entry = onnxMappings().find(node.domain(), op, opset_);
  if (entry != nullptr && entry->map == nullptr) refuseComputedInput(op, subject);
  if (entry == nullptr) {
    const bool otherOpset = onnxMappings().knows(node.domain(), op);
    throwOnnx(ErrorCode::OnnxUnsupportedOp, subject,
              fmt::format("op type {} is not supported{}; supported: {}; on values known at import also: {}",
                          op, otherOpset ? fmt::format(" at opset {}", opset_) : "",
                          fmt::join(supportedOnnxOps(), ", "), fmt::join(knownValueOnnxOps(), ", ")));
  }
  if (entry->checksFloatOperands) checkFloatOperands(node, subject);
  (this->*entry->map)(node, subject);
}

}  // namespace tessera::onnx_import
