// Node mapping: each ONNX node becomes one or more ops of tessera/ops.hpp.
// Compositions stay compositions (Gemm = transposes + MatMul + scaled Add);
// what the current ops cannot compute exactly is refused with the node named.
#include <algorithm>
#include <limits>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "importer.hpp"
#include "tessera/error.hpp"

namespace tessera::onnx_import {
namespace {

// Ops evaluated only when their inputs are known at import (shape arithmetic).
const std::vector<std::string> kFoldOnlyOps = {"ConstantOfShape", "Gather", "Range"};

const std::vector<std::string> kMappedOps = {
    "Abs",
    "Add",
    "And",
    "AveragePool",
    "BatchNormalization",
    "Cast",
    "Clip",
    "Concat",
    "Constant",
    "Conv",
    "ConvTranspose",
    "Div",
    "Dropout",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "Flatten",
    "Gather",
    "GatherElements",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "GRU",
    "Greater",
    "GreaterOrEqual",
    "Identity",
    "InstanceNormalization",
    "LayerNormalization",
    "LeakyRelu",
    "LSTM",
    "Less",
    "LessOrEqual",
    "Log",
    "LogSoftmax",
    "MatMul",
    "Max",
    "MaxPool",
    "Mean",
    "Min",
    "Mul",
    "Neg",
    "NegativeLogLikelihoodLoss",
    "Not",
    "Or",
    "PRelu",
    "Pad",
    "Pow",
    "RNN",
    "Reciprocal",
    "ReduceMean",
    "ReduceSum",
    "Relu",
    "Reshape",
    "ScatterElements",
    "Selu",
    "Shape",
    "Sigmoid",
    "Sign",
    "Size",
    "Slice",
    "Softmax",
    "SoftmaxCrossEntropyLoss",
    "Softplus",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "Tanh",
    "Tile",
    "Transpose",
    "Unsqueeze",
    "Where",
};

// One-input elementwise ops with a tessera op of their own (attributes, if
// any, are read in Importer::mapNode).
const std::vector<std::string> kElementwiseOps = {"Abs",        "Elu",  "Erf",  "LeakyRelu",
                                                  "Reciprocal", "Selu", "Sign", "Softplus"};

bool isOneOf(const std::string& op, const std::vector<std::string>& list) {
  return std::find(list.begin(), list.end(), op) != list.end();
}

}  // namespace

void checkArity(const onnx::NodeProto& node, int64_t opset, const std::string& subject) {
  const std::string& op = node.op_type();
  int required = -1;  // inputs that must be present; -1: an op type this file does not know
  if (op == "Constant") {
    required = 0;
  } else if (isOneOf(op, kElementwiseOps) || op == "Clip") {
    required = 1;
  } else if (op == "LayerNormalization" || op == "Tile" || op == "Conv" || op == "ConvTranspose") {
    required = 2;
  } else if (op == "Split") {
    required = 1;
  } else if (op == "Identity" || op == "Neg" || op == "Relu" || op == "Tanh" || op == "Sigmoid" ||
             op == "Exp" || op == "Log" || op == "Sqrt" || op == "Dropout" || op == "Softmax" ||
             op == "LogSoftmax" || op == "ReduceSum" || op == "ReduceMean" || op == "Flatten" ||
             op == "Transpose" || op == "Squeeze" || op == "Cast" || op == "Shape" || op == "Size" ||
             op == "ConstantOfShape" || op == "Not" || op == "Concat" || op == "MaxPool" ||
             op == "AveragePool" || op == "GlobalAveragePool" || op == "GlobalMaxPool") {
    required = 1;
  } else if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Pow" || op == "MatMul" ||
             op == "Gemm" || op == "Reshape" || op == "Expand" || op == "SoftmaxCrossEntropyLoss" ||
             op == "NegativeLogLikelihoodLoss" || op == "Gather" || op == "Equal" || op == "Less" ||
             op == "Greater" || op == "LessOrEqual" || op == "GreaterOrEqual" || op == "And" || op == "Or") {
    required = 2;
  } else if (op == "Unsqueeze") {
    required = opset >= 13 ? 2 : 1;
  } else if (op == "GatherElements") {
    required = 2;
  } else if (op == "ScatterElements") {
    required = 3;
  } else if (op == "Slice" || op == "Range" || op == "Where" || op == "InstanceNormalization" ||
             op == "RNN" || op == "GRU" || op == "LSTM") {
    required = 3;
  } else if (op == "BatchNormalization") {
    required = 5;
  } else if (op == "PRelu" || op == "Pad") {
    required = 2;
  } else if (op == "Sum" || op == "Mean" || op == "Max" || op == "Min") {
    required = 1;
  }
  if (required < 0) return;
  if (node.input_size() < required)
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
              fmt::format("{} needs {} inputs; the node has {}", op, required, node.input_size()));
  for (int k = 0; k < required; ++k)
    if (node.input(k).empty())
      throwOnnx(ErrorCode::OnnxInvalidGraph, subject, fmt::format("input {} is required but empty", k));
  // A recurrence's outputs are all optional (Y_h alone is common); the others need output 0.
  const bool recurrence = op == "RNN" || op == "GRU" || op == "LSTM";
  const bool anyOutput =
      std::any_of(node.output().begin(), node.output().end(), [](const std::string& o) { return !o.empty(); });
  if (recurrence ? !anyOutput : node.output_size() < 1 || node.output(0).empty())
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject, fmt::format("{} needs an output", op));
}

std::vector<int> differentiableInputs(const onnx::NodeProto& node) {
  const std::string& op = node.op_type();
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "MatMul" || op == "Concat" ||
      op == "Gemm") {
    std::vector<int> all(static_cast<std::size_t>(node.input_size()));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  if (op == "Where") return {1, 2};
  if (op == "ScatterElements") return {0, 2};
  if (op == "GatherElements") return {0};
  if (op == "Pad") return {0};
  if (op == "BatchNormalization" || op == "InstanceNormalization") return {0, 1, 2};
  if (op == "PRelu" || op == "Sum" || op == "Mean" || op == "Max" || op == "Min") {
    std::vector<int> all(static_cast<std::size_t>(node.input_size()));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  if (isOneOf(op, kElementwiseOps) || op == "Clip" || op == "Gather") return {0};
  if (op == "LayerNormalization" || op == "Conv" || op == "ConvTranspose") return {0, 1, 2};
  if (op == "RNN" || op == "GRU" || op == "LSTM") return {0, 1, 2, 3, 5, 6};
  if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" || op == "GlobalMaxPool")
    return {0};
  if (op == "Split" || op == "Tile") return {0};
  if (op == "Pow" || op == "Neg" || op == "Relu" || op == "Tanh" || op == "Sigmoid" || op == "Exp" ||
      op == "Log" || op == "Sqrt" || op == "Identity" || op == "Dropout" || op == "Softmax" ||
      op == "LogSoftmax" || op == "ReduceSum" || op == "ReduceMean" || op == "Reshape" || op == "Flatten" ||
      op == "Transpose" || op == "Slice" || op == "Expand" || op == "Unsqueeze" || op == "Squeeze" ||
      op == "Cast" || op == "SoftmaxCrossEntropyLoss" || op == "NegativeLogLikelihoodLoss")
    return {0};
  return {};
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
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };

  if (op == "Constant") {
    Known value;
    if (const auto* a = findAttribute(node, "value")) {
      value = readTensor(a->t(), subject + " attribute value");
    } else if (const auto* f = findAttribute(node, "value_float")) {
      value.type = onnx::TensorProto::FLOAT;
      value.f = {f->f()};
    } else if (const auto* fs = findAttribute(node, "value_floats")) {
      value.type = onnx::TensorProto::FLOAT;
      value.f.assign(fs->floats().begin(), fs->floats().end());
      value.shape = {static_cast<int64_t>(value.f.size())};
    } else if (const auto* i = findAttribute(node, "value_int")) {
      value.type = onnx::TensorProto::INT64;
      value.i = {i->i()};
    } else if (const auto* is = findAttribute(node, "value_ints")) {
      value.type = onnx::TensorProto::INT64;
      value.i.assign(is->ints().begin(), is->ints().end());
      value.shape = {static_cast<int64_t>(value.i.size())};
    } else {
      unsupported("only the attributes value, value_float(s) and value_int(s) are supported");
    }
    if (node.output_size() < 1) throwOnnx(ErrorCode::OnnxInvalidGraph, subject, "Constant without an output");
    const int32_t type = value.type;
    values_[node.output(0)] = Value{std::move(value), kNoTensor, type};
    return;
  }
  if (op == "Gather" && knownInput(node, 0) == nullptr) {
    // Slices of a model value along any axis (rows of an embedding table,
    // a class token): the device's Gather.
    Tensor data = operand(node, 0, subject);
    requireFloat(data, node, 0, subject);
    const auto rank = static_cast<int64_t>(data.shape().size());
    const int64_t axis = normalizeAxis(intAttribute(node, "axis", 0, subject), rank, subject);
    Tensor indices = operand(node, 1, subject);
    if (indices.dtype() != DType::Int32)
      unsupported(fmt::format("indices \"{}\" are {}; integer indices are expected", node.input(1),
                              typeName(values_.at(node.input(1)).type)));
    setOutput(node, 0, ops::gather(data, indices, axis));
    return;
  }
  if (isOneOf(op, kFoldOnlyOps) || op == "Shape" || op == "Size") {
    unsupported(
        fmt::format("{} is supported on values known at import only (shape arithmetic); here an input is "
                    "computed by the model",
                    op));
  }
  if (!isOneOf(op, kMappedOps)) {
    throwOnnx(ErrorCode::OnnxUnsupportedOp, subject,
              fmt::format("op type {} is not supported; supported: {}; on values known at import also: {}",
                          op, fmt::join(kMappedOps, ", "), fmt::join(kFoldOnlyOps, ", ")));
  }
  checkFloatOperands(node, subject);

  if (op == "Equal" || op == "Less" || op == "Greater" || op == "LessOrEqual" || op == "GreaterOrEqual") {
    // Masks are float32 0/1 (tessera's mask ops). a <= b is (a < b) or
    // (a == b), exact for NaN too.
    Tensor a = operand(node, 0, subject);
    Tensor b = operand(node, 1, subject);
    if (a.dtype() != b.dtype())
      unsupported(fmt::format("inputs of types {} and {}: {} compares two float or two integer values",
                              typeName(values_.at(node.input(0)).type),
                              typeName(values_.at(node.input(1)).type), op));
    Tensor y = op == "Equal"         ? ops::equal(a, b)
               : op == "Less"        ? ops::less(a, b)
               : op == "Greater"     ? ops::greater(a, b)
               : op == "LessOrEqual" ? ops::logicalOr(ops::less(a, b), ops::equal(a, b))
                                     : ops::logicalOr(ops::greater(a, b), ops::equal(a, b));
    setOutput(node, 0, y, onnx::TensorProto::BOOL);
    return;
  }
  if (op == "Not" || op == "And" || op == "Or") {
    std::vector<Tensor> in;
    for (int k = 0; k < (op == "Not" ? 1 : 2); ++k) {
      if (values_.at(node.input(k)).type != onnx::TensorProto::BOOL)
        unsupported(fmt::format("input {} (\"{}\") is {}; {} takes bool values", k, node.input(k),
                                typeName(values_.at(node.input(k)).type), op));
      in.push_back(operand(node, k, subject));
    }
    Tensor y = op == "Not"   ? ops::logicalNot(in[0])
               : op == "And" ? ops::logicalAnd(in[0], in[1])
                             : ops::logicalOr(in[0], in[1]);
    setOutput(node, 0, y, onnx::TensorProto::BOOL);
    return;
  }
  if (op == "Where") {
    if (values_.at(node.input(0)).type != onnx::TensorProto::BOOL)
      unsupported(fmt::format("the condition \"{}\" is {}; bool expected", node.input(0),
                              typeName(values_.at(node.input(0)).type)));
    Tensor cond = operand(node, 0, subject);
    Tensor x = operand(node, 1, subject);
    Tensor y = operand(node, 2, subject);
    const int32_t type = values_.at(node.input(1)).type;
    if (x.dtype() != y.dtype())
      unsupported(fmt::format("x is {} and y {}: Where selects between values of one type", typeName(type),
                              typeName(values_.at(node.input(2)).type)));
    setOutput(node, 0, ops::where(cond, x, y), type);
    return;
  }
  if (op == "Sum" || op == "Mean" || op == "Max" || op == "Min") {
    // Variadic, with numpy broadcasting: a chain of Adds (Mean divides by
    // the count); Max and Min select with Where (a tie takes the later
    // operand, and its gradient goes there).
    std::vector<Tensor> in;
    for (int k = 0; k < node.input_size(); ++k)
      if (!node.input(k).empty()) in.push_back(operand(node, k, subject));
    if (in.empty()) throwOnnx(ErrorCode::OnnxInvalidGraph, subject, fmt::format("{} without inputs", op));
    const int32_t type = values_.at(node.input(0)).type;
    for (std::size_t k = 0; k < in.size(); ++k)
      if (in[k].dtype() != in[0].dtype() || (op == "Mean" && in[k].dtype() == DType::Int32))
        unsupported(
            fmt::format("inputs of different types (or a Mean of integers): {} needs float operands of one "
                        "type, or int32 ones for Sum, Max and Min",
                        op));
    Tensor y = in[0];
    for (std::size_t k = 1; k < in.size(); ++k) {
      if (op == "Sum" || op == "Mean") {
        y = ops::add(y, in[k]);
      } else {
        y = ops::where(op == "Max" ? ops::greater(y, in[k]) : ops::less(y, in[k]), y, in[k]);
      }
    }
    if (op == "Mean" && in.size() > 1) y = ops::div(y, scalar(static_cast<double>(in.size()), y.dtype()));
    if (in.size() == 1) {
      values_[node.output(0)] = values_.at(node.input(0));
      return;
    }
    setOutput(node, 0, y, type);
    return;
  }
  if (op == "Pad") {
    // pads [b1.., e1..] known at import. constant: SlicePad places the input
    // into zeros (a non-zero value is selected where the padding is); edge and
    // reflect: slices of the border concatenated on each side, axis by axis.
    Tensor x = operand(node, 0, subject);
    const Shape shape = x.shape();
    const std::size_t rank = shape.size();
    const std::vector<int64_t> pads = intList(requireKnown(node, 1, subject, "pads"), subject, "pads");
    if (pads.size() != 2 * rank)
      throwOnnx(
          ErrorCode::OnnxNodeShape, subject,
          fmt::format("pads [{}] need 2 x {} entries for {}", fmt::join(pads, ", "), rank, shapeStr(shape)));
    for (int64_t p : pads)
      if (p < 0)
        unsupported(
            fmt::format("pads [{}]: negative pads (cropping) are not supported", fmt::join(pads, ", ")));
    const std::string mode = stringAttribute(node, "mode", "constant", subject);
    const int32_t type = values_.at(node.input(0)).type;
    Shape out = shape;
    for (std::size_t d = 0; d < rank; ++d) out[d] += pads[d] + pads[rank + d];
    if (mode == "constant") {
      // The value: known at import, or a computed scalar.
      double value = 0.0;
      Tensor computedValue;
      if (node.input_size() > 2 && !node.input(2).empty()) {
        if (const Known* v = knownInput(node, 2)) {
          if (v->size() != 1) unsupported("constant_value must be one value");
          value = v->at(0);
        } else {
          computedValue = operand(node, 2, subject);
          if (numElements(computedValue.shape()) != 1 || computedValue.dtype() != x.dtype())
            unsupported("constant_value must be one value of the input's type");
          computedValue = ops::reshape(computedValue, {});
        }
      }
      OpAttributes attributes;
      attributes.shape = out;
      for (std::size_t d = 0; d < rank; ++d) {
        attributes.starts.push_back(pads[d]);
        attributes.ends.push_back(pads[d] + shape[d]);
      }
      Tensor y{&graph_, graph_.op(graph_.addOp(OpKind::SlicePad, {x.id()}, attributes)).outputs.at(0)};
      if (value != 0.0 || computedValue.valid()) {
        // A select (not an add), so that an infinite value stays out of the input's place.
        std::vector<float> padding(static_cast<std::size_t>(numElements(out)), 1.0F);
        for (std::size_t i = 0; i < padding.size(); ++i) {
          bool inside = true;
          std::size_t rest = i;
          for (std::size_t d = rank; d-- > 0;) {
            const auto index = static_cast<int64_t>(rest % static_cast<std::size_t>(out[d]));
            rest /= static_cast<std::size_t>(out[d]);
            inside = inside && index >= pads[d] && index < pads[d] + shape[d];
          }
          if (inside) padding[i] = 0.0F;
        }
        const Tensor mask =
            ops::constant(graph_, graph_.uniqueName(node.output(0) + ".padding"), std::move(padding), out);
        const Tensor fill = computedValue.valid()
                                ? computedValue
                                : ops::constant(graph_, graph_.uniqueName(node.output(0) + ".value"),
                                                {static_cast<float>(value)}, {}, x.dtype());
        y = ops::where(mask, fill, y);
      }
      setOutput(node, 0, y, type);
      return;
    }
    if (mode != "edge" && mode != "reflect")
      unsupported(fmt::format("mode \"{}\": constant, edge and reflect are supported", mode));
    for (std::size_t d = 0; d < rank; ++d) {
      const int64_t before = pads[d];
      const int64_t after = pads[rank + d];
      if (before == 0 && after == 0) continue;
      const int64_t n = x.shape()[d];
      if (mode == "reflect" && (before >= n || after >= n))
        unsupported(
            fmt::format("reflect pads of {} and {} on axis {} of size {}: each must be below the size",
                        before, after, d, n));
      auto at = [&](int64_t i) {
        std::vector<int64_t> starts(rank, 0);
        std::vector<int64_t> ends = x.shape();
        starts[d] = i;
        ends[d] = i + 1;
        return ops::slice(x, starts, ends);
      };
      std::vector<Tensor> parts;
      for (int64_t k = before; k >= 1; --k) parts.push_back(mode == "edge" ? at(0) : at(k));
      parts.push_back(x);
      for (int64_t k = 1; k <= after; ++k) parts.push_back(mode == "edge" ? at(n - 1) : at(n - 1 - k));
      x = ops::concat(parts, static_cast<int64_t>(d));
    }
    setOutput(node, 0, x, type);
    return;
  }
  if (op == "PRelu") {
    // x < 0 ? slope * x : x, the slope broadcast to x: a select, so the
    // slope's gradient is the sum of dy * x where x < 0.
    Tensor x = operand(node, 0, subject);
    requireFloat(x, node, 0, subject);
    Tensor slope = operand(node, 1, subject);
    requireFloat(slope, node, 1, subject);
    // PyTorch's exports before opset 7 give PReLU(num_parameters=C) a slope
    // [C] meant per channel (axis 1), which numpy rules would align with the
    // last axis: where those rules cannot take it, it applies along axis 1.
    const Shape xs = x.shape();  // a copy: adding ops may move the graph's tensors
    if (slope.shape().size() == 1 && xs.size() >= 3 && slope.shape()[0] == xs[1] &&
        slope.shape()[0] != xs.back() && slope.shape()[0] != 1) {
      Shape channel(xs.size() - 1, 1);
      channel[0] = xs[1];
      slope = ops::reshape(slope, channel);
    }
    setOutput(node, 0, ops::where(ops::less(x, scalar(0.0, x.dtype())), ops::mul(slope, x), x));
    return;
  }
  if (op == "BatchNormalization" || op == "InstanceNormalization") {
    // Composed of reductions and elementwise ops over the channel axis 1:
    // statistics over N and the spatial axes (BatchNormalization in training
    // mode), over the spatial axes of each (n, c) (InstanceNormalization), or
    // the running statistics given (inference).
    Tensor x = operand(node, 0, subject);
    requireFloat(x, node, 0, subject);
    const Shape shape = x.shape();
    const auto rank = static_cast<int64_t>(shape.size());
    if (rank < 2)
      unsupported(fmt::format("input {} has no channel axis: [N, C, ...] expected", shapeStr(shape)));
    const double epsilon = floatAttribute(node, "epsilon", 1e-5F, subject);
    Shape channel(static_cast<std::size_t>(rank), 1);
    channel[1] = shape[1];
    auto perChannel = [&](int k, std::string_view what) {
      Tensor t = operand(node, k, subject);
      requireFloat(t, node, k, subject);
      if (t.shape() != Shape{shape[1]})
        throwOnnx(ErrorCode::OnnxNodeShape, subject,
                  fmt::format("{} {} must be [C] = [{}]", what, shapeStr(t.shape()), shape[1]));
      return ops::reshape(t, channel);
    };
    const Tensor scale = perChannel(1, "scale");
    const Tensor bias = perChannel(2, "bias");
    const bool instance = op == "InstanceNormalization";
    const bool training = !instance && opset_ >= 14 && intAttribute(node, "training_mode", 0, subject) != 0;
    int outputs = 0;
    for (int k = 0; k < node.output_size(); ++k) outputs = node.output(k).empty() ? outputs : k + 1;
    if (!instance && !training && outputs > 1)
      unsupported(
          fmt::format("{} outputs: before opset 14 the running statistics are outputs of training, "
                      "which this importer computes from opset 14 on (training_mode = 1)",
                      outputs));
    Tensor y;
    if (instance || training) {
      std::vector<int64_t> axes;
      for (int64_t a = instance ? 2 : 0; a < rank; ++a)
        if (a != 1) axes.push_back(a);
      if (axes.empty()) unsupported("InstanceNormalization of an input without spatial axes");
      const Tensor mean = ops::reduceMean(x, axes, true);
      const Tensor centred = ops::sub(x, mean);
      const Tensor variance = ops::reduceMean(ops::mul(centred, centred), axes, true);
      y = ops::add(
          ops::mul(ops::div(centred, ops::sqrt(ops::add(variance, scalar(epsilon, variance.dtype())))),
                   scale),
          bias);
      if (training && outputs > 1) {
        // ONNX's running statistics: input * momentum + batch * (1 - momentum).
        const double momentum = floatAttribute(node, "momentum", 0.9F, subject);
        const Tensor batchMean = ops::reshape(mean, {shape[1]});
        const Tensor batchVariance = ops::reshape(variance, {shape[1]});
        if (knownInput(node, 3) != nullptr || knownInput(node, 4) != nullptr) {
          // Initializers (a PyTorch export in training mode): the model's
          // state, updated in place every step as PyTorch updates its
          // buffers, with the unbiased batch variance. The outputs are the
          // updated values.
          const int64_t count = numElements(shape) / shape[1];
          if (count < 2)
            unsupported(
                fmt::format("{} values per channel: the unbiased variance of the running statistics "
                            "needs at least 2",
                            count));
          const Tensor runningMean = stateVariable(node, 3, subject);
          const Tensor runningVariance = stateVariable(node, 4, subject);
          const Tensor unbiased = ops::mul(
              batchVariance,
              scalar(static_cast<double>(count) / static_cast<double>(count - 1), batchVariance.dtype()));
          setOutput(node, 1, ops::scaledAddInplace(runningMean, batchMean, momentum, 1.0 - momentum));
          if (outputs > 2)
            setOutput(node, 2, ops::scaledAddInplace(runningVariance, unbiased, momentum, 1.0 - momentum));
        } else {
          // Computed inputs (ONNX's node tests): the spec's formula with the
          // population variance.
          auto running = [&](int k, const Tensor& batch) {
            const Tensor input = operand(node, k, subject);
            requireFloat(input, node, k, subject);
            return ops::add(ops::mul(input, scalar(momentum, input.dtype())),
                            ops::mul(batch, scalar(1.0 - momentum, batch.dtype())));
          };
          if (!node.output(1).empty()) setOutput(node, 1, running(3, batchMean));
          if (outputs > 2 && !node.output(2).empty()) setOutput(node, 2, running(4, batchVariance));
        }
      }
    } else {
      const Tensor mean = perChannel(3, "mean");
      const Tensor variance = perChannel(4, "var");
      y = ops::add(ops::mul(ops::div(ops::sub(x, mean),
                                     ops::sqrt(ops::add(variance, scalar(epsilon, variance.dtype())))),
                            scale),
                   bias);
    }
    setOutput(node, 0, y);
    return;
  }
  if (op == "Identity") {
    values_[node.output(0)] = values_.at(node.input(0));
    return;
  }
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
    Tensor a = operand(node, 0, subject);
    Tensor b = operand(node, 1, subject);
    if (a.dtype() != b.dtype() || (op == "Div" && a.dtype() == DType::Int32))
      unsupported(fmt::format(
          "inputs of types {} and {}: the device computes {} on two values of one type, float or int32 "
          "(Div on floats only)",
          typeName(values_.at(node.input(0)).type), typeName(values_.at(node.input(1)).type), op));
    const int32_t type = values_.at(node.input(0)).type;
    Tensor y = op == "Add"   ? ops::add(a, b)
               : op == "Sub" ? ops::sub(a, b)
               : op == "Mul" ? ops::mul(a, b)
                             : ops::div(a, b);
    setOutput(node, 0, y, type);
    return;
  }
  if (op == "Pow") {
    Tensor x = operand(node, 0, subject);
    requireFloat(x, node, 0, subject);
    // A known exponent of 1, 2 or 0.5 is x, x*x or Sqrt (what torch exports
    // for x**2 and x**0.5); any other is Pow, whose exponent is float32.
    const Known* e = knownInput(node, 1);
    const double p = e != nullptr && e->size() == 1 ? e->at(0) : 0.0;
    if (e != nullptr && e->size() == 1 && p == 1.0) {
      values_[node.output(0)] = values_.at(node.input(0));
    } else if (e != nullptr && e->size() == 1 && p == 2.0) {
      setOutput(node, 0, ops::mul(x, x));
    } else if (e != nullptr && e->size() == 1 && p == 0.5) {
      setOutput(node, 0, ops::sqrt(x));
    } else if (e != nullptr) {
      std::vector<float> exponent(e->size());
      for (std::size_t i = 0; i < exponent.size(); ++i) exponent[i] = static_cast<float>(e->at(i));
      const Tensor b =
          ops::constant(graph_, graph_.uniqueName(node.input(1)), std::move(exponent), e->shape, x.dtype());
      setOutput(node, 0, ops::pow(x, b));
    } else {
      Tensor b = operand(node, 1, subject);
      requireFloat(b, node, 1, subject);
      setOutput(node, 0, ops::pow(x, b));
    }
    return;
  }
  if (isOneOf(op, kElementwiseOps)) {
    Tensor x = operand(node, 0, subject);
    requireFloat(x, node, 0, subject);
    auto attribute = [&](std::string_view name, float fallback) {
      return static_cast<double>(floatAttribute(node, name, fallback, subject));
    };
    Tensor y = op == "Abs"          ? ops::abs(x)
               : op == "Erf"        ? ops::erf(x)
               : op == "Reciprocal" ? ops::reciprocal(x)
               : op == "Sign"       ? ops::sign(x)
               : op == "Softplus"   ? ops::softplus(x)
               : op == "LeakyRelu"  ? ops::leakyRelu(x, attribute("alpha", 0.01F))
               : op == "Elu"        ? ops::elu(x, attribute("alpha", 1.0F))
                                    : ops::selu(x, attribute("alpha", 1.67326319217681884765625F),
                                                attribute("gamma", 1.05070102214355468750F));
    setOutput(node, 0, y);
    return;
  }
  if (op == "Split") {
    // Slices of the input along `axis`: the sizes from the `split` input
    // (opset 13 on) or attribute, else equal parts, one per output.
    Tensor x = operand(node, 0, subject);
    const Shape shape = x.shape();
    const auto rank = static_cast<int64_t>(shape.size());
    const int64_t axis = normalizeAxis(intAttribute(node, "axis", 0, subject), rank, subject);
    const auto a = static_cast<std::size_t>(axis);
    std::optional<std::vector<int64_t>> sizes;
    if (opset_ >= 13) {
      if (node.input_size() > 1 && !node.input(1).empty())
        sizes = intList(requireKnown(node, 1, subject, "split"), subject, "split");
    } else {
      sizes = intsAttribute(node, "split", subject);
    }
    const auto parts = static_cast<int64_t>(node.output_size());
    if (!sizes) {
      if (parts < 1 || shape[a] % parts != 0)
        throwOnnx(ErrorCode::OnnxNodeShape, subject,
                  fmt::format("axis {} of {} does not split into {} equal parts; give the sizes", axis,
                              shapeStr(shape), parts));
      sizes = std::vector<int64_t>(static_cast<std::size_t>(parts), shape[a] / parts);
    }
    int64_t total = 0;
    bool negative = false;
    for (int64_t size : *sizes) {
      negative = negative || size < 0;
      total += size;
    }
    if (negative || static_cast<int64_t>(sizes->size()) != parts || total != shape[a])
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("split sizes [{}] for {} outputs do not add up to axis {} of {}",
                            fmt::join(*sizes, ", "), parts, axis, shapeStr(shape)));
    std::vector<int64_t> starts(shape.size(), 0);
    std::vector<int64_t> ends = shape;
    for (int k = 0; k < node.output_size(); ++k) {
      ends[a] = starts[a] + (*sizes)[static_cast<std::size_t>(k)];
      if (!node.output(k).empty())
        setOutput(node, k, ops::slice(x, starts, ends), values_.at(node.input(0)).type);
      starts[a] = ends[a];
    }
    return;
  }
  if (op == "Tile") {
    // Copies concatenated along each axis; the repeats are known at import.
    Tensor x = operand(node, 0, subject);
    const std::vector<int64_t> repeats =
        intList(requireKnown(node, 1, subject, "repeats"), subject, "repeats");
    if (repeats.size() != x.shape().size())
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("repeats [{}] need one entry per axis of {}", fmt::join(repeats, ", "),
                            shapeStr(x.shape())));
    for (std::size_t d = 0; d < repeats.size(); ++d) {
      if (repeats[d] < 1)
        unsupported(fmt::format("repeat {} on axis {}: repeats must be at least 1", repeats[d], d));
      if (repeats[d] > 1)
        x = ops::concat(std::vector<Tensor>(static_cast<std::size_t>(repeats[d]), x),
                        static_cast<int64_t>(d));
    }
    setOutput(node, 0, x, values_.at(node.input(0)).type);
    return;
  }
  if (op == "LayerNormalization") {
    // Composed of the existing ops (CONVENTIONS: a composition gets no op of
    // its own): statistics over the axes from `axis` on, in float32.
    Tensor x = operand(node, 0, subject);
    requireFloat(x, node, 0, subject);
    Tensor scale = operand(node, 1, subject);
    requireFloat(scale, node, 1, subject);
    const auto rank = static_cast<int64_t>(x.shape().size());
    const int64_t axis = normalizeAxis(intAttribute(node, "axis", -1, subject), rank, subject);
    const double epsilon = floatAttribute(node, "epsilon", 1e-5F, subject);
    std::vector<int64_t> axes;
    for (int64_t a = axis; a < rank; ++a) axes.push_back(a);
    const Tensor mean = ops::reduceMean(x, axes, true);
    const Tensor centred = ops::sub(x, mean);
    const Tensor variance = ops::reduceMean(ops::mul(centred, centred), axes, true);
    const Tensor invStdDev =
        ops::reciprocal(ops::sqrt(ops::add(variance, ops::scalar(graph_, epsilon, x.dtype()))));
    Tensor y = ops::mul(ops::mul(centred, invStdDev), scale);
    if (node.input_size() > 2 && !node.input(2).empty()) {
      Tensor bias = operand(node, 2, subject);
      requireFloat(bias, node, 2, subject);
      y = ops::add(y, bias);
    }
    setOutput(node, 0, y);
    if (node.output_size() > 1 && !node.output(1).empty()) setOutput(node, 1, mean);
    if (node.output_size() > 2 && !node.output(2).empty()) setOutput(node, 2, invStdDev);
    return;
  }
  if (op == "Clip") {
    // Bounds are optional inputs (opset 11 on), each one value. Known at
    // import, they are Clip's attributes; computed by the model, Clip is
    // composed of selects: y = hi where x > hi or hi < lo (ONNX: min(max(x,
    // lo), hi)), else lo where x < lo, else x; a NaN x stays NaN. The
    // gradient goes to x where lo <= x <= hi, as torch.clamp's, and to the
    // bound that is selected.
    Tensor x = operand(node, 0, subject);
    requireFloat(x, node, 0, subject);
    auto present = [&](int k) { return k < node.input_size() && !node.input(k).empty(); };
    if ((present(1) && knownInput(node, 1) == nullptr) || (present(2) && knownInput(node, 2) == nullptr)) {
      auto bound = [&](int k, std::string_view what) -> std::optional<Tensor> {
        if (!present(k)) return std::nullopt;
        Tensor b = operand(node, k, subject);
        requireFloat(b, node, k, subject);
        if (numElements(b.shape()) != 1)
          unsupported(fmt::format("the {} bound \"{}\" is {}; one value expected", what, node.input(k),
                                  shapeStr(b.shape())));
        if (b.dtype() != x.dtype())
          unsupported(fmt::format("the {} bound \"{}\" is {} and x {}; Clip takes values of one type", what,
                                  node.input(k), typeName(values_.at(node.input(k)).type),
                                  typeName(values_.at(node.input(0)).type)));
        return b.shape().empty() ? b : ops::reshape(b, {});
      };
      const std::optional<Tensor> lo = bound(1, "min");
      const std::optional<Tensor> hi = bound(2, "max");
      Tensor y = x;
      if (lo) y = ops::where(ops::less(x, *lo), *lo, y);
      if (hi) {
        Tensor above = ops::greater(x, *hi);
        if (lo) above = ops::logicalOr(above, ops::less(*hi, *lo));
        y = ops::where(above, *hi, y);
      }
      setOutput(node, 0, y);
      return;
    }
    auto bound = [&](int k, std::string_view what, double fallback) {
      if (!present(k)) return fallback;
      const Known& b = requireKnown(node, k, subject, what);
      if (b.size() != 1) unsupported(fmt::format("the {} bound must be one value", what));
      return b.at(0);
    };
    const double lo = bound(1, "min", -std::numeric_limits<double>::infinity());
    const double hi = bound(2, "max", std::numeric_limits<double>::infinity());
    setOutput(node, 0, ops::clip(x, lo, hi));
    return;
  }
  if (op == "GatherElements" || op == "ScatterElements") {
    // Elements by index along `axis` (torch.gather, scatter, scatter_add).
    const bool scatter = op == "ScatterElements";
    const std::string reduction = scatter ? stringAttribute(node, "reduction", "none", subject) : "none";
    if (reduction != "none" && reduction != "add")
      throwOnnx(ErrorCode::OnnxUnsupportedScatterReduction, subject,
                fmt::format("attribute reduction is \"{}\"; allowed: \"none\" (write), \"add\"", reduction));
    Tensor data = operand(node, 0, subject);
    requireFloat(data, node, 0, subject);
    const auto rank = static_cast<int64_t>(data.shape().size());
    const int64_t axis = normalizeAxis(intAttribute(node, "axis", 0, subject), rank, subject);
    Tensor indices = operand(node, 1, subject);
    if (indices.dtype() != DType::Int32)
      unsupported(fmt::format("indices \"{}\" are {}; integer indices are expected", node.input(1),
                              typeName(values_.at(node.input(1)).type)));
    if (!scatter) {
      setOutput(node, 0, ops::gatherElements(data, indices, axis));
      return;
    }
    Tensor updates = operand(node, 2, subject);
    requireFloat(updates, node, 2, subject);
    setOutput(node, 0, ops::scatterElements(data, indices, updates, axis, reduction == "add"));
    return;
  }
  if (op == "Neg" || op == "Relu" || op == "Tanh" || op == "Sigmoid" || op == "Exp" || op == "Log" ||
      op == "Sqrt") {
    // float32, or float64 computed in double.
    Tensor x = operand(node, 0, subject);
    const bool wide = x.dtype() == DType::Float64;
    if (!wide) requireFloat(x, node, 0, subject);
    Tensor y = op == "Neg"       ? ops::neg(x)
               : op == "Relu"    ? ops::relu(x)
               : op == "Tanh"    ? ops::tanh(x)
               : op == "Sigmoid" ? ops::sigmoid(x)
               : op == "Exp"     ? ops::exp(x)
               : op == "Log"     ? ops::log(x)
                                 : ops::sqrt(x);
    setOutput(node, 0, y, wide ? onnx::TensorProto::DOUBLE : onnx::TensorProto::FLOAT);
    return;
  }
  if (op == "Dropout") {
    const Value input = values_.at(node.input(0));
    float ratio = 0.5F;
    bool training = false;
    if (opset_ >= 12) {
      auto scalarOf = [&](const Known& k, std::string_view what) {
        if (k.size() != 1)
          throwOnnx(ErrorCode::OnnxNodeShape, subject,
                    fmt::format("{} has shape {}; one value expected", what, shapeStr(k.shape)));
        return k.at(0);
      };
      if (const Known* r = knownInput(node, 1)) ratio = static_cast<float>(scalarOf(*r, "ratio"));
      if (node.input_size() > 2 && !node.input(2).empty())
        training = scalarOf(requireKnown(node, 2, subject, "training_mode"), "training_mode") != 0;
    }
    if (training && ratio != 0.0F) {
      if (!options_.randomDropout)
        unsupported(fmt::format(
            "training mode with ratio {} draws random masks; set OnnxImportOptions::randomDropout for "
            "tessera's seeded masks (not onnxruntime's), or use inference mode or ratio 0, where "
            "Dropout passes its input through",
            ratio));
      if (!(ratio > 0.0F && ratio < 1.0F)) unsupported(fmt::format("ratio {} is outside [0, 1)", ratio));
      Tensor x = operand(node, 0, subject);
      requireFloat(x, node, 0, subject);
      if (!dropoutStep_.valid()) {
        // One counter for the model: read once per run (a snapshot that the
        // gradient reads too), then advanced in place.
        const Tensor counter =
            ops::variable(graph_, graph_.uniqueName("dropout.step"), {0.0F}, {}, std::nullopt,
                          RetrievalMode::OnePerGroup, TensorCategory::OptimizerState, DType::Int32);
        state_.push_back(counter.name());
        dropoutStep_ = ops::copy(counter);
        ops::scaledAddInplace(
            counter, ops::constant(graph_, graph_.uniqueName("dropout.one"), {1.0F}, {}, DType::Int32), 1.0,
            1.0);
      }
      const auto* seedAttribute = findAttribute(node, "seed");
      const uint64_t seed =
          seedAttribute != nullptr ? static_cast<uint64_t>(seedAttribute->i()) : options_.dropoutSeed;
      // Seeds stay below 2^53 (they travel as a double attribute).
      const uint64_t mixed =
          (seed * 1000003 + static_cast<uint64_t>(dropoutNodes_++)) & ((uint64_t{1} << 53) - 1);
      const Tensor y = ops::dropout(x, dropoutStep_, ratio, mixed);
      setOutput(node, 0, y);
      if (node.output_size() > 1 && !node.output(1).empty())
        setOutput(node, 1,
                  ops::logicalNot(ops::equal(
                      ops::dropout(ops::add(ops::mul(x, scalar(0.0, x.dtype())), scalar(1.0, x.dtype())),
                                   dropoutStep_, ratio, mixed),
                      scalar(0.0, x.dtype()))),
                  onnx::TensorProto::BOOL);
      return;
    }
    values_[node.output(0)] = input;
    if (node.output_size() > 1 && !node.output(1).empty()) {
      const Shape shape = input.id != kNoTensor ? graph_.tensor(input.id).shape : input.known->shape;
      Known mask = makeKnown(onnx::TensorProto::BOOL, shape, subject);
      std::fill(mask.i.begin(), mask.i.end(), 1);
      values_[node.output(1)] = Value{std::move(mask), kNoTensor, onnx::TensorProto::BOOL};
    }
    return;
  }
  if (op == "Softmax" || op == "LogSoftmax") {
    Tensor x = operand(node, 0, subject);
    requireFloat(x, node, 0, subject);
    const auto rank = static_cast<int64_t>(x.shape().size());
    if (rank == 0) unsupported("a scalar input");
    const int64_t axis =
        normalizeAxis(intAttribute(node, "axis", opset_ >= 13 ? -1 : 1, subject), rank, subject);
    auto apply = [&](Tensor t) { return op == "Softmax" ? ops::softmax(t) : ops::logSoftmax(t); };
    if (axis == rank - 1) {
      setOutput(node, 0, apply(x));
    } else if (opset_ < 13) {
      // Before opset 13 the op works on the input flattened to 2-D at `axis`.
      const Shape s = x.shape();  // a copy: adding ops may move the graph's tensors
      const int64_t outer = std::accumulate(s.begin(), s.begin() + axis, int64_t{1}, std::multiplies<>());
      const int64_t inner = std::accumulate(s.begin() + axis, s.end(), int64_t{1}, std::multiplies<>());
      setOutput(node, 0, ops::reshape(apply(ops::reshape(x, {outer, inner})), s));
    } else {
      std::vector<int64_t> perm(static_cast<std::size_t>(rank));
      std::iota(perm.begin(), perm.end(), 0);
      std::swap(perm[static_cast<std::size_t>(axis)], perm.back());
      setOutput(node, 0, ops::transpose(apply(ops::transpose(x, perm)), perm));
    }
    return;
  }
  if (op == "ReduceSum" || op == "ReduceMean") {
    Tensor x = operand(node, 0, subject);
    requireFloat(x, node, 0, subject);
    std::optional<std::vector<int64_t>> axes;
    bool noopWithEmptyAxes = false;
    if (op == "ReduceSum" && opset_ >= 13) {
      if (const Known* a = knownInput(node, 1)) {
        axes = intList(*a, subject, "axes");
      } else if (node.input_size() > 1 && !node.input(1).empty()) {
        requireKnown(node, 1, subject, "axes");
      }
      noopWithEmptyAxes = intAttribute(node, "noop_with_empty_axes", 0, subject) != 0;
    } else {
      axes = intsAttribute(node, "axes", subject);
    }
    const bool keepDims = intAttribute(node, "keepdims", 1, subject) != 0;
    if (!axes || axes->empty()) {
      if (noopWithEmptyAxes) {
        values_[node.output(0)] = values_.at(node.input(0));
        return;
      }
      axes = std::vector<int64_t>(x.shape().size());
      std::iota(axes->begin(), axes->end(), 0);
    }
    const auto rank = static_cast<int64_t>(x.shape().size());
    for (int64_t& a : *axes) a = normalizeAxis(a, rank, subject);
    if (axes->empty()) {
      values_[node.output(0)] = values_.at(node.input(0));
      return;
    }
    setOutput(node, 0,
              op == "ReduceSum" ? ops::reduceSum(x, *axes, keepDims) : ops::reduceMean(x, *axes, keepDims));
    return;
  }
  if (op == "Reshape" || op == "Flatten" || op == "Unsqueeze" || op == "Squeeze") {
    Tensor x = operand(node, 0, subject);
    const Shape s = x.shape();  // a copy: adding ops may move the graph's tensors
    Shape target;
    if (op == "Reshape") {
      const bool allowZero = opset_ >= 14 && intAttribute(node, "allowzero", 0, subject) != 0;
      target = reshapeTarget(s, intList(requireKnown(node, 1, subject, "shape"), subject, "shape"), allowZero,
                             subject);
    } else if (op == "Flatten") {
      const auto rank = static_cast<int64_t>(s.size());
      int64_t axis = intAttribute(node, "axis", 1, subject);
      axis = axis == rank ? rank : normalizeAxis(axis, rank, subject);
      const int64_t outer = std::accumulate(s.begin(), s.begin() + axis, int64_t{1}, std::multiplies<>());
      target = {outer, numElements(s) / std::max<int64_t>(outer, 1)};
    } else {
      std::optional<std::vector<int64_t>> axes;
      if (opset_ >= 13) {
        if (node.input_size() > 1 && !node.input(1).empty())
          axes = intList(requireKnown(node, 1, subject, "axes"), subject, "axes");
      } else {
        axes = intsAttribute(node, "axes", subject);
      }
      if (op == "Unsqueeze") {
        if (!axes) throwOnnx(ErrorCode::OnnxInvalidGraph, subject, "Unsqueeze needs axes");
        target = unsqueezeShape(s, *axes, subject);
      } else {
        target = squeezeShape(s, axes, subject);
      }
    }
    if (std::find(target.begin(), target.end(), 0) != target.end())
      unsupported(fmt::format("the result {} is empty; tensors of zero elements are not supported",
                              shapeStr(target)));
    setOutput(node, 0, ops::reshape(x, target), values_.at(node.input(0)).type);
    return;
  }
  if (op == "Transpose") {
    Tensor x = operand(node, 0, subject);
    std::vector<int64_t> perm = intsAttribute(node, "perm", subject).value_or(std::vector<int64_t>{});
    if (perm.empty()) {
      perm.resize(x.shape().size());
      std::iota(perm.rbegin(), perm.rend(), 0);
    }
    setOutput(node, 0, ops::transpose(x, perm), values_.at(node.input(0)).type);
    return;
  }
  if (op == "Slice") {
    Tensor x = operand(node, 0, subject);
    std::optional<std::vector<int64_t>> axes, steps;
    const auto starts = intList(requireKnown(node, 1, subject, "starts"), subject, "starts");
    const auto ends = intList(requireKnown(node, 2, subject, "ends"), subject, "ends");
    if (node.input_size() > 3 && !node.input(3).empty())
      axes = intList(requireKnown(node, 3, subject, "axes"), subject, "axes");
    if (node.input_size() > 4 && !node.input(4).empty())
      steps = intList(requireKnown(node, 4, subject, "steps"), subject, "steps");
    const SliceRange r = sliceRange(x.shape(), starts, ends, axes, steps, subject);
    for (int64_t step : r.steps)
      if (step != 1) unsupported(fmt::format("step {}: only steps of 1 are supported", step));
    if (std::find(r.outShape.begin(), r.outShape.end(), 0) != r.outShape.end())
      unsupported(fmt::format("the result {} is empty; tensors of zero elements are not supported",
                              shapeStr(r.outShape)));
    setOutput(node, 0, ops::slice(x, r.starts, r.ends), values_.at(node.input(0)).type);
    return;
  }
  if (op == "Concat") {
    std::vector<Tensor> parts;
    for (int k = 0; k < node.input_size(); ++k)
      if (!node.input(k).empty()) parts.push_back(operand(node, k, subject));
    if (parts.empty()) throwOnnx(ErrorCode::OnnxInvalidGraph, subject, "Concat without inputs");
    const auto rank = static_cast<int64_t>(parts[0].shape().size());
    const int64_t axis = normalizeAxis(intAttribute(node, "axis", 0, subject), rank, subject);
    setOutput(node, 0, parts.size() == 1 ? parts[0] : ops::concat(parts, axis),
              values_.at(node.input(0)).type);
    return;
  }
  if (op == "Expand") {
    Tensor x = operand(node, 0, subject);
    const Shape target = broadcastShapes(
        x.shape(), intList(requireKnown(node, 1, subject, "shape"), subject, "shape"), subject);
    if (target == x.shape()) {
      values_[node.output(0)] = values_.at(node.input(0));
      return;
    }
    setOutput(node, 0, ops::broadcastTo(x, target), values_.at(node.input(0)).type);
    return;
  }
  if (op == "Cast") {
    const int64_t to = intAttribute(node, "to", -1, subject);
    const Value& in = values_.at(node.input(0));
    const bool fromInteger = in.type == onnx::TensorProto::INT64 || in.type == onnx::TensorProto::INT32;
    const bool fromFloating = in.type == onnx::TensorProto::FLOAT || in.type == onnx::TensorProto::FLOAT16 ||
                              in.type == onnx::TensorProto::DOUBLE;
    if (to == onnx::TensorProto::FLOAT16 &&
        (fromFloating || fromInteger || in.type == onnx::TensorProto::BOOL)) {
      // float16 from anything numeric: a double rounded once to the nearest
      // half, the rest through float32 (exact for int32 up to 2^24, beyond
      // the half's range anyway); x itself when it is float16 (a float16
      // model, or float under floatType Float16).
      setOutput(node, 0, toFloat(operand(node, 0, subject), DType::Float16), onnx::TensorProto::FLOAT16);
      return;
    }
    if (in.type == onnx::TensorProto::FLOAT16 &&
        (to == onnx::TensorProto::FLOAT || to == onnx::TensorProto::DOUBLE)) {
      // Exact: float to the import's float type, double to float64.
      const Tensor x = operand(node, 0, subject);
      const DType target = deviceFloat(static_cast<int32_t>(to));
      setOutput(node, 0, target == DType::Float64 ? ops::cast(x, target) : toFloat(x, target),
                static_cast<int32_t>(to));
      return;
    }
    if (in.type == onnx::TensorProto::BOOL &&
        (to == onnx::TensorProto::BOOL ||
         (to == onnx::TensorProto::FLOAT && options_.floatType == DType::Float32))) {
      // A mask is float32 0/1 already.
      Value out = in;
      out.type = static_cast<int32_t>(to);
      values_[node.output(0)] = out;
      return;
    }
    if (in.type == onnx::TensorProto::BOOL && to == onnx::TensorProto::FLOAT) {
      setOutput(node, 0, toFloat(operand(node, 0, subject), options_.floatType), onnx::TensorProto::FLOAT);
      return;
    }
    if (to == onnx::TensorProto::BOOL &&
        (in.type == onnx::TensorProto::FLOAT || in.type == onnx::TensorProto::FLOAT16 ||
         in.type == onnx::TensorProto::INT64 || in.type == onnx::TensorProto::INT32)) {
      // Anything not zero is true (NaN too, as numpy casts it).
      Tensor x = operand(node, 0, subject);
      const Tensor zero = x.dtype() != DType::Int32
                              ? ops::scalar(graph_, 0.0, x.dtype())
                              : ops::constant(graph_, graph_.uniqueName("zero"), {0.0F}, {}, DType::Int32);
      setOutput(node, 0, ops::logicalNot(ops::equal(x, zero)), onnx::TensorProto::BOOL);
      return;
    }
    const bool fromInt = in.type == onnx::TensorProto::INT64 || in.type == onnx::TensorProto::INT32;
    const bool toInt = to == onnx::TensorProto::INT64 || to == onnx::TensorProto::INT32;
    // float64: exact from float32 and integers; to float32 the nearest
    // float, to integers truncated toward zero.
    const bool fromDouble = in.type == onnx::TensorProto::DOUBLE;
    if (to == onnx::TensorProto::DOUBLE && (in.type == onnx::TensorProto::FLOAT || fromInt)) {
      setOutput(node, 0, ops::cast(operand(node, 0, subject), DType::Float64), onnx::TensorProto::DOUBLE);
      return;
    }
    if (fromDouble && (to == onnx::TensorProto::FLOAT || toInt)) {
      const Tensor x = operand(node, 0, subject);
      setOutput(node, 0, toInt ? ops::castToInt32(x) : toFloat(x, options_.floatType),
                static_cast<int32_t>(to));
      return;
    }
    if ((in.type == onnx::TensorProto::FLOAT || in.type == onnx::TensorProto::FLOAT16 ||
         in.type == onnx::TensorProto::BOOL) &&
        toInt) {
      // Truncated toward zero, as numpy's astype (a mask gives 0 and 1).
      setOutput(node, 0, ops::castToInt32(operand(node, 0, subject)), static_cast<int32_t>(to));
      return;
    }
    if (fromInt && to == onnx::TensorProto::FLOAT) {
      // To the import's float type (float16 under OnnxImportOptions::floatType).
      setOutput(node, 0, toFloat(operand(node, 0, subject), options_.floatType), onnx::TensorProto::FLOAT);
      return;
    }
    const bool floatToFloat = (in.type == onnx::TensorProto::FLOAT && to == onnx::TensorProto::FLOAT) ||
                              (fromDouble && to == onnx::TensorProto::DOUBLE);
    const bool intToInt = (in.type == onnx::TensorProto::INT64 || in.type == onnx::TensorProto::INT32) &&
                          (to == onnx::TensorProto::INT64 || to == onnx::TensorProto::INT32);
    if (!floatToFloat && !intToInt)
      unsupported(
          fmt::format("cast from {} to {} of a computed value: the device casts between float32, float16, "
                      "float64, int32/int64 and bool only",
                      typeName(in.type), typeName(static_cast<int32_t>(to))));
    Value out = in;
    out.type = static_cast<int32_t>(to);
    values_[node.output(0)] = out;
    return;
  }
  if (op == "MatMul") {
    Tensor a = operand(node, 0, subject);
    Tensor b = operand(node, 1, subject);
    requireFloat(a, node, 0, subject);
    requireFloat(b, node, 1, subject);
    const Shape sa = a.shape();
    const Shape sb = b.shape();
    if (sa.empty() || sb.empty()) throwOnnx(ErrorCode::OnnxNodeShape, subject, "MatMul of a scalar");
    // ONNX's output shape (numpy matmul), computed before the operands are reshaped.
    const Shape batchA(sa.begin(), sa.end() - (sa.size() > 1 ? 2 : 1));
    const Shape batchB(sb.begin(), sb.end() - (sb.size() > 1 ? 2 : 1));
    Shape outShape = broadcastShapes(batchA, batchB, subject);
    if (std::any_of(batchB.begin(), batchB.end(), [](int64_t d) { return d != 1; })) {
      // A batched right operand (attention's scores and context): both
      // operands broadcast to the common batch, then one product per index.
      if (sa.size() < 2 || sb.size() < 2)
        unsupported(
            fmt::format("a vector times the batched {}: give the vector a matrix axis", shapeStr(sb)));
      Shape fullA = outShape;
      fullA.insert(fullA.end(), sa.end() - 2, sa.end());
      Shape fullB = outShape;
      fullB.insert(fullB.end(), sb.end() - 2, sb.end());
      if (sa != fullA) a = ops::broadcastTo(a, fullA);
      if (sb != fullB) b = ops::broadcastTo(b, fullB);
      Shape result = outShape;
      result.push_back(sa[sa.size() - 2]);
      result.push_back(sb.back());
      const Tensor y = ops::batchMatmul(a, b);
      setOutput(node, 0, y.shape() == result ? y : ops::reshape(y, result));
      return;
    }
    if (sa.size() > 1) outShape.push_back(sa[sa.size() - 2]);
    if (sb.size() > 1) outShape.push_back(sb.back());
    if (sa.size() == 1) a = ops::reshape(a, {1, sa[0]});
    if (sb.size() == 1) {
      b = ops::reshape(b, {sb[0], 1});
    } else if (sb.size() > 2) {
      b = ops::reshape(b, {sb[sb.size() - 2], sb.back()});
    }
    Tensor y = ops::matmul(a, b);
    setOutput(node, 0, y.shape() == outShape ? y : ops::reshape(y, outShape));
    return;
  }
  if (op == "Gemm") {
    Tensor a = operand(node, 0, subject);
    Tensor b = operand(node, 1, subject);
    requireFloat(a, node, 0, subject);
    requireFloat(b, node, 1, subject);
    if (a.shape().size() != 2 || b.shape().size() != 2)
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("A {} and B {} must be matrices", shapeStr(a.shape()), shapeStr(b.shape())));
    const double alpha = floatAttribute(node, "alpha", 1.0F, subject);
    const double beta = floatAttribute(node, "beta", 1.0F, subject);
    if (intAttribute(node, "transA", 0, subject) != 0) a = ops::transpose(a, {1, 0});
    if (intAttribute(node, "transB", 0, subject) != 0) b = ops::transpose(b, {1, 0});
    Tensor y = ops::matmul(a, b);
    if (alpha != 1.0) y = ops::mul(y, scalar(alpha, y.dtype()));
    if (node.input_size() > 2 && !node.input(2).empty() && beta != 0.0) {
      Tensor c = operand(node, 2, subject);
      requireFloat(c, node, 2, subject);
      y = ops::add(y, beta == 1.0 ? c : ops::mul(c, scalar(beta, c.dtype())));
    }
    setOutput(node, 0, y);
    return;
  }
  if (op == "Conv" || op == "ConvTranspose" || op == "MaxPool" || op == "AveragePool") {
    setOutput(node, 0, mapWindowOp(node, subject));
    return;
  }
  if (op == "RNN" || op == "GRU" || op == "LSTM") {
    mapRecurrence(node, subject);
    return;
  }
  if (op == "GlobalAveragePool" || op == "GlobalMaxPool") {
    Tensor x = operand(node, 0, subject);
    requireFloat(x, node, 0, subject);
    if (x.shape().size() < 3)
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("X {} must be [N, C, D..] with at least one spatial axis", shapeStr(x.shape())));
    setOutput(node, 0, op == "GlobalAveragePool" ? ops::globalAveragePool(x) : ops::globalMaxPool(x));
    return;
  }
  if (op == "SoftmaxCrossEntropyLoss" || op == "NegativeLogLikelihoodLoss") {
    // Scores [N, C, d1...] and labels [N, d1...]. [N, C] scores with reduction
    // mean or sum, no weights and no ignored class run tessera's fused
    // SoftmaxCrossEntropy (which refuses labels outside [0, C)). Everything
    // else is composed exactly: log-probabilities with the class axis last,
    // a one-hot mask of the labels (Equal against the class indices), the
    // picked values summed, ignored labels masked out; mean divides by the
    // summed weights of the labels kept (their count without weights), as
    // ONNX and PyTorch do. A label outside [0, C) that is not ignore_index
    // selects no class there (loss 0) where PyTorch raises.
    const bool softmax = op == "SoftmaxCrossEntropyLoss";
    Tensor scores = operand(node, 0, subject);
    requireFloat(scores, node, 0, subject);
    // Float16 scores (OnnxImportOptions::floatType) are cast to float32 first,
    // as mixed-precision training casts its logits: the loss, its
    // log-probabilities and their gradient are float32.
    if (scores.dtype() == DType::Float16) scores = ops::cast(scores, DType::Float32);
    const Shape shape = scores.shape();
    const auto rank = static_cast<int64_t>(shape.size());
    if (rank < 2) unsupported(fmt::format("scores {} need a class axis: [N, C, d1...]", shapeStr(shape)));
    const std::string reduction = stringAttribute(node, "reduction", "mean", subject);
    if (reduction != "mean" && reduction != "sum" && reduction != "none")
      unsupported(fmt::format("reduction \"{}\": only \"mean\", \"sum\" and \"none\" exist", reduction));
    Tensor labels = operand(node, 1, subject);
    if (labels.dtype() != DType::Int32)
      unsupported(fmt::format("labels \"{}\" are {}; int64 or int32 class indices are supported",
                              node.input(1), typeName(values_.at(node.input(1)).type)));
    Shape labelShape = shape;
    labelShape.erase(labelShape.begin() + 1);
    if (labels.shape() != labelShape)
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("labels {} do not fit scores {}: expected {}", shapeStr(labels.shape()),
                            shapeStr(shape), shapeStr(labelShape)));
    const int64_t classes = shape[1];
    const bool hasWeights = node.input_size() > 2 && !node.input(2).empty();
    const bool hasIgnore = findAttribute(node, "ignore_index") != nullptr;
    const int64_t ignore = intAttribute(node, "ignore_index", 0, subject);
    const bool ignoresAClass = hasIgnore && ignore >= 0 && ignore < classes;
    if (softmax && rank == 2 && reduction != "none" && !hasWeights && !ignoresAClass) {
      setOutput(node, 0,
                ops::softmaxCrossEntropy(scores, labels,
                                         reduction == "mean" ? ReductionType::Mean : ReductionType::Sum));
      if (node.output_size() > 1) setOutput(node, 1, ops::logSoftmax(scores));
      return;
    }
    // The class axis last: [N, d1..., C].
    std::vector<int64_t> perm{0};
    for (int64_t a = 2; a < rank; ++a) perm.push_back(a);
    perm.push_back(1);
    std::vector<int64_t> back(perm.size());
    for (std::size_t a = 0; a < perm.size(); ++a)
      back[static_cast<std::size_t>(perm[a])] = static_cast<int64_t>(a);
    Tensor logp = rank == 2 ? scores : ops::transpose(scores, perm);
    if (softmax) logp = ops::logSoftmax(logp);
    if (softmax && node.output_size() > 1 && !node.output(1).empty())
      setOutput(node, 1, rank == 2 ? logp : ops::transpose(logp, back));
    std::vector<float> indices(static_cast<std::size_t>(classes));
    for (std::size_t c = 0; c < indices.size(); ++c) indices[c] = static_cast<float>(c);
    const Tensor classIndex = ops::constant(graph_, graph_.uniqueName(node.output(0) + ".classes"),
                                            std::move(indices), {classes}, DType::Int32);
    Shape column = labelShape;
    column.push_back(1);
    Tensor picked = ops::equal(ops::reshape(labels, column), classIndex);  // [N, d..., C] one-hot
    if (hasWeights) {
      Tensor weights = operand(node, 2, subject);
      requireFloat(weights, node, 2, subject);
      if (weights.dtype() == DType::Float16) weights = ops::cast(weights, DType::Float32);
      if (weights.shape() != Shape{classes})
        throwOnnx(ErrorCode::OnnxNodeShape, subject,
                  fmt::format("weights {} must be [C] = [{}]", shapeStr(weights.shape()), classes));
      picked = ops::mul(picked, weights);
    }
    if (hasIgnore) {
      if (ignore < -(int64_t{1} << 24) || ignore > (int64_t{1} << 24))
        unsupported(fmt::format("ignore_index {} does not fit the device's integers (|v| <= 2^24)", ignore));
      const Tensor ignored = ops::constant(graph_, graph_.uniqueName(node.output(0) + ".ignore_index"),
                                           {static_cast<float>(ignore)}, {}, DType::Int32);
      picked = ops::mul(picked, ops::reshape(ops::logicalNot(ops::equal(labels, ignored)), column));
    }
    const Tensor losses = ops::neg(ops::reduceSum(ops::mul(picked, logp), {-1}));  // [N, d...]
    Tensor loss = losses;
    if (reduction == "sum") {
      loss = ops::reduceSum(losses);
    } else if (reduction == "mean") {
      loss = ops::div(ops::reduceSum(losses), ops::reduceSum(picked));
    }
    setOutput(node, 0, loss);
    return;
  }
  throwOnnx(ErrorCode::OnnxUnsupportedOp, subject, fmt::format("op type {} is not supported", op));
}

// Conv, ConvTranspose, MaxPool and AveragePool: their windows from the ONNX
// attributes (auto_pad resolved to explicit pads on the bound shapes), a
// Conv's bias added per output channel.
Tensor Importer::mapWindowOp(const onnx::NodeProto& node, const std::string& subject) {
  const std::string& op = node.op_type();
  const bool conv = op == "Conv" || op == "ConvTranspose";
  auto unsupported = [&](std::string_view what) {
    throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject, what);
  };
  Tensor x = operand(node, 0, subject);
  requireFloat(x, node, 0, subject);
  const Shape xs = x.shape();  // a copy: adding ops may move the graph's tensors
  if (xs.size() < 3 || xs.size() > 5)
    unsupported(fmt::format("X {} has {} spatial axes; 1 to 3 are supported", shapeStr(xs),
                            static_cast<int64_t>(xs.size()) - 2));
  const std::size_t r = xs.size() - 2;
  Tensor w;
  if (conv) {
    w = operand(node, 1, subject);
    requireFloat(w, node, 1, subject);
    if (w.shape().size() != xs.size())
      throwOnnx(ErrorCode::OnnxNodeShape, subject,
                fmt::format("W {} must have X {}'s rank", shapeStr(w.shape()), shapeStr(xs)));
  }
  // Attributes with one value per spatial axis (pads: two).
  auto perAxis = [&](std::string_view name, std::size_t count, int64_t fallback) {
    std::vector<int64_t> values =
        intsAttribute(node, name, subject).value_or(std::vector<int64_t>(count, fallback));
    if (values.size() != count)
      throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
                fmt::format("{} has {} values, needs {} for {} spatial axes", name, values.size(), count, r));
    return values;
  };
  const Shape spatialW = conv ? Shape(w.shape().begin() + 2, w.shape().end()) : Shape{};
  std::optional<std::vector<int64_t>> kernel = intsAttribute(node, "kernel_shape", subject);
  if (conv && kernel && *kernel != spatialW)
    throwOnnx(ErrorCode::OnnxNodeShape, subject,
              fmt::format("kernel_shape [{}] differs from the weight's spatial shape {}",
                          fmt::join(*kernel, ", "), shapeStr(spatialW)));
  if (!conv && !kernel) throwOnnx(ErrorCode::OnnxInvalidGraph, subject, "kernel_shape is required");
  const Shape k = conv ? spatialW : *kernel;
  if (k.size() != r)
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
              fmt::format("kernel_shape [{}] needs {} values", fmt::join(k, ", "), r));
  const std::vector<int64_t> strides = perAxis("strides", r, 1);
  const std::vector<int64_t> dilations = perAxis("dilations", r, 1);
  std::vector<int64_t> pads = perAxis("pads", 2 * r, 0);
  std::vector<int64_t> outputPadding =
      op == "ConvTranspose" ? perAxis("output_padding", r, 0) : std::vector<int64_t>{};
  const std::string autoPad = stringAttribute(node, "auto_pad", "NOTSET", subject);
  if (autoPad != "NOTSET" && autoPad != "VALID" && autoPad != "SAME_UPPER" && autoPad != "SAME_LOWER")
    throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
              fmt::format("auto_pad \"{}\": NOTSET, VALID, SAME_UPPER or SAME_LOWER", autoPad));
  if (autoPad == "VALID") pads.assign(2 * r, 0);
  const bool upper = autoPad != "SAME_LOWER";
  // A total pad split over the axis's two ends.
  auto split = [&](std::size_t d, int64_t total) {
    pads[d] = upper ? total / 2 : total - total / 2;
    pads[d + r] = total - pads[d];
  };
  if (op == "ConvTranspose") {
    std::optional<std::vector<int64_t>> outputShape = intsAttribute(node, "output_shape", subject);
    if (outputShape && outputShape->size() == r + 2)
      outputShape->erase(outputShape->begin(), outputShape->begin() + 2);
    if (!outputShape && (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER")) {
      outputShape = std::vector<int64_t>(r);
      for (std::size_t d = 0; d < r; ++d) (*outputShape)[d] = xs[d + 2] * strides[d];
    }
    if (outputShape) {
      if (outputShape->size() != r)
        throwOnnx(ErrorCode::OnnxInvalidGraph, subject,
                  fmt::format("output_shape [{}] needs {} values", fmt::join(*outputShape, ", "), r));
      for (std::size_t d = 0; d < r; ++d) {
        // ONNX's rule: the total pad, split with the extra one at the begin
        // unless SAME_UPPER; a negative end grows the output at the end.
        const int64_t total = strides[d] * (xs[d + 2] - 1) + outputPadding[d] + (k[d] - 1) * dilations[d] +
                              1 - (*outputShape)[d];
        const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
        pads[d] = autoPad == "SAME_UPPER" ? half : total - half;
        pads[d + r] = total - pads[d];
        if (pads[d + r] < 0) {
          outputPadding[d] -= pads[d + r];
          pads[d + r] = 0;
        }
        if (pads[d] < 0)
          unsupported(fmt::format("output_shape [{}] would need a negative begin pad on spatial axis {}",
                                  fmt::join(*outputShape, ", "), d));
      }
    }
  } else if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") {
    for (std::size_t d = 0; d < r; ++d) {
      const int64_t out = (xs[d + 2] + strides[d] - 1) / strides[d];
      split(d, std::max<int64_t>(0, (out - 1) * strides[d] + (k[d] - 1) * dilations[d] + 1 - xs[d + 2]));
    }
  }
  if (!conv) {
    if (op == "MaxPool" && node.output_size() > 1 && !node.output(1).empty())
      throwOnnx(ErrorCode::OnnxUnsupportedFeature, subject,
                fmt::format("the Indices output \"{}\" is not supported (only Y, the pooled values)",
                            node.output(1)));
    ops::PoolParams params;
    params.kernel = k;
    params.strides = strides;
    params.pads = pads;
    params.dilations = dilations;
    params.ceilMode = intAttribute(node, "ceil_mode", 0, subject) != 0;
    params.countIncludePad = op == "AveragePool" && intAttribute(node, "count_include_pad", 0, subject) != 0;
    return op == "MaxPool" ? ops::maxPool(x, params) : ops::averagePool(x, params);
  }
  ops::ConvParams params;
  params.strides = strides;
  params.pads = pads;
  params.dilations = dilations;
  params.group = intAttribute(node, "group", 1, subject);
  params.outputPadding = outputPadding;
  Tensor y = op == "Conv" ? ops::conv(x, w, params) : ops::convTranspose(x, w, params);
  if (node.input_size() > 2 && !node.input(2).empty()) {
    Tensor b = operand(node, 2, subject);
    requireFloat(b, node, 2, subject);
    const int64_t channels = y.shape()[1];
    if (b.shape() != Shape{channels})
      throwOnnx(
          ErrorCode::OnnxNodeShape, subject,
          fmt::format("B {} must be [{}], one value per output channel", shapeStr(b.shape()), channels));
    Shape perChannel(xs.size() - 1, 1);
    perChannel[0] = channels;
    y = ops::add(y, ops::reshape(b, perChannel));
  }
  return y;
}

}  // namespace tessera::onnx_import
